#include "serve/media.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <system_error>

#include "core/base64.h"
#include "core/error.h"

namespace swiftcpp::serve {

namespace {

constexpr int kMaxRedirects = 5;

// The value of each base64 character, -1 for the others.
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The URL shortened for a message.
std::string excerpt(const std::string& url) { return url.size() <= 80 ? url : url.substr(0, 77) + "..."; }

vision::EncodedImage open_part(std::string bytes, const ImagePart& part, const MediaOptions& options) {
  try {
    return vision::open_image_bytes(std::move(bytes), part.param, options.max_pixels);
  } catch (const Error& e) {
    bad_request(part.param, e.what());
  }
}

// data:[<media type>][;base64],<payload>
vision::EncodedImage from_data_url(const ImagePart& part, const MediaOptions& options) {
  const std::string& url = part.url;
  const size_t comma = url.find(',');
  if (comma == std::string::npos) bad_request(part.param, fmt::format("'{}': a data URL needs a ',' before its payload", part.param));
  const std::string_view head = std::string_view(url).substr(5, comma - 5);
  if (head.size() < 7 || head.substr(head.size() - 7) != ";base64") {
    bad_request(part.param, fmt::format("'{}': only base64 data URLs are supported (data:image/png;base64,...)", part.param));
  }
  const std::string_view type = head.substr(0, head.size() - 7);
  if (!type.empty() && !starts_with(type, "image/")) {
    bad_request(part.param, fmt::format("'{}': the data URL's media type '{}' is not an image", part.param, type));
  }
  const std::string_view payload = std::string_view(url).substr(comma + 1);
  // Checked before decoding: 4 characters carry 3 bytes.
  if (static_cast<int64_t>(payload.size() / 4 * 3) > options.max_image_bytes + 3) {
    bad_request(part.param, fmt::format("'{}': the image is about {} bytes, more than the {} allowed", part.param,
                                        payload.size() / 4 * 3, options.max_image_bytes));
  }
  std::optional<std::string> bytes = decode_base64(payload);
  if (!bytes) bad_request(part.param, fmt::format("'{}': the data URL's payload is not valid base64", part.param));
  if (static_cast<int64_t>(bytes->size()) > options.max_image_bytes) {
    bad_request(part.param, fmt::format("'{}': the image is {} bytes, more than the {} allowed", part.param,
                                        bytes->size(), options.max_image_bytes));
  }
  return open_part(std::move(*bytes), part, options);
}

// file:///absolute/path, only inside the allowed folder (symbolic links resolved first).
vision::EncodedImage from_file_url(const ImagePart& part, const MediaOptions& options) {
  if (options.allowed_local_path.empty()) {
    bad_request(part.param, fmt::format("'{}': local files are not served (start the server with "
                                        "--allowed-local-media-path DIR)", part.param));
  }
  const fs::path requested(part.url.substr(7));
  if (!requested.is_absolute()) {
    bad_request(part.param, fmt::format("'{}': a file URL needs an absolute path (file:///...), got '{}'", part.param,
                                        excerpt(part.url)));
  }
  std::error_code ec;
  const fs::path file = fs::canonical(requested, ec);
  if (ec) bad_request(part.param, fmt::format("'{}': '{}' cannot be read: {}", part.param, requested.string(), ec.message()));
  const fs::path root = fs::canonical(options.allowed_local_path, ec);
  if (ec) {
    bad_request(part.param, fmt::format("'{}': the allowed media folder '{}' cannot be read: {}", part.param,
                                        options.allowed_local_path.string(), ec.message()));
  }
  const auto [r, f] = std::mismatch(root.begin(), root.end(), file.begin(), file.end());
  if (r != root.end()) {
    bad_request(part.param, fmt::format("'{}': '{}' is outside the allowed media folder '{}'", part.param,
                                        requested.string(), root.string()));
  }
  if (!fs::is_regular_file(file, ec)) {
    bad_request(part.param, fmt::format("'{}': '{}' is not a regular file", part.param, requested.string()));
  }
  const auto size = fs::file_size(file, ec);
  if (ec || static_cast<int64_t>(size) > options.max_image_bytes) {
    bad_request(part.param, fmt::format("'{}': '{}' is {} bytes, more than the {} allowed", part.param,
                                        requested.string(), size, options.max_image_bytes));
  }
  try {
    return open_part(read_text_file(file), part, options);
  } catch (const IoError& e) {
    bad_request(part.param, e.what());
  }
}

// http(s): fetched under a deadline and a size limit; redirects followed (a few) to http(s) only.
vision::EncodedImage from_remote_url(const ImagePart& part, const MediaOptions& options) {
  if (!options.allow_remote) {
    bad_request(part.param, fmt::format("'{}': remote images are not fetched (start the server with "
                                        "--allow-remote-media)", part.param));
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options.fetch_timeout_s));
  std::string url = part.url;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const bool https = starts_with(url, "https://");
    const size_t host_end = url.find('/', https ? 8 : 7);
    const std::string origin = url.substr(0, host_end);
    const std::string path = host_end == std::string::npos ? "/" : url.substr(host_end);
    if (origin.size() <= (https ? 8u : 7u)) bad_request(part.param, fmt::format("'{}': '{}' has no host", part.param, excerpt(url)));
    httplib::Client client(origin);
    if (!client.is_valid()) bad_request(part.param, fmt::format("'{}': '{}' cannot be fetched", part.param, excerpt(url)));
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) bad_request(part.param, fmt::format("'{}': fetching '{}' took longer than {} s", part.param, excerpt(part.url), options.fetch_timeout_s));
    const auto sec = static_cast<time_t>(left);
    const auto usec = static_cast<time_t>((left - std::floor(left)) * 1e6);
    client.set_connection_timeout(sec, usec);
    client.set_read_timeout(sec, usec);
    client.set_write_timeout(sec, usec);
    client.set_follow_location(false);
    std::string body;
    bool too_large = false, too_slow = false;
    const httplib::Result res = client.Get(
        path, [&](const httplib::Response&) { return true; },
        [&](const char* data, size_t n) {
          if (static_cast<int64_t>(body.size() + n) > options.max_image_bytes) return !(too_large = true);
          if (Clock::now() > deadline) return !(too_slow = true);
          body.append(data, n);
          return true;
        });
    if (too_large) {
      bad_request(part.param, fmt::format("'{}': '{}' is more than the {} bytes allowed", part.param, excerpt(part.url),
                                          options.max_image_bytes));
    }
    if (too_slow) bad_request(part.param, fmt::format("'{}': fetching '{}' took longer than {} s", part.param, excerpt(part.url), options.fetch_timeout_s));
    if (!res) {
      bad_request(part.param, fmt::format("'{}': fetching '{}' failed: {}", part.param, excerpt(url), httplib::to_string(res.error())));
    }
    if (res->status >= 300 && res->status < 400 && res->has_header("Location")) {
      std::string next = res->get_header_value("Location");
      if (starts_with(next, "/")) next = origin + next;
      if (!starts_with(next, "http://") && !starts_with(next, "https://")) {
        bad_request(part.param, fmt::format("'{}': '{}' redirects to '{}', which is not http(s)", part.param,
                                            excerpt(url), excerpt(next)));
      }
      url = next;
      continue;
    }
    if (res->status != 200) {
      bad_request(part.param, fmt::format("'{}': fetching '{}' answered HTTP {}", part.param, excerpt(url), res->status));
    }
    return open_part(std::move(body), part, options);
  }
  bad_request(part.param, fmt::format("'{}': '{}' redirects more than {} times", part.param, excerpt(part.url), kMaxRedirects));
}

}  // namespace

vision::EncodedImage fetch_image(const ImagePart& part, const MediaOptions& options) {
  if (starts_with(part.url, "data:")) return from_data_url(part, options);
  if (starts_with(part.url, "file://")) return from_file_url(part, options);
  if (starts_with(part.url, "http://") || starts_with(part.url, "https://")) return from_remote_url(part, options);
  bad_request(part.param, fmt::format("'{}': the url '{}' is not a data:, file:// or http(s) URL", part.param,
                                      excerpt(part.url)));
}

std::vector<vision::EncodedImage> fetch_images(const std::vector<ImagePart>& parts, const MediaOptions& options) {
  if (static_cast<int64_t>(parts.size()) > options.max_images) {
    bad_request(parts[static_cast<size_t>(options.max_images)].param,
                fmt::format("the request has {} images, more than the {} allowed per request", parts.size(),
                            options.max_images));
  }
  std::vector<vision::EncodedImage> out;
  out.reserve(parts.size());
  for (const ImagePart& part : parts) out.push_back(fetch_image(part, options));
  return out;
}

}  // namespace swiftcpp::serve
