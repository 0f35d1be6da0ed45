// The images a chat request names in its image_url parts: data: URLs (base64 JPEG/PNG), local files under one
// allowed folder (vLLM's --allowed-local-media-path), and http(s) URLs when remote media are allowed (fetched with a
// time limit and a size limit, redirects followed only to http(s)). Each is read into memory with its header
// checked (vision::open_image_bytes) before anything else is done with it; every refusal is an ApiError 400 naming
// the part ("messages[0].content[1]").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/fs.h"
#include "serve/openai.h"
#include "vision/image.h"

namespace swiftcpp::serve {

struct MediaOptions {
  fs::path allowed_local_path;             // "": file URLs are refused
  bool allow_remote = false;               // http(s) URLs are fetched only when set
  int64_t max_images = 8;                  // image parts per request
  int64_t max_image_bytes = int64_t{20} << 20;  // one image's encoded bytes (a data URL's decoded payload, a file, a download)
  int64_t max_pixels = vision::kMaxImagePixels;  // one image's decoded width * height
  double fetch_timeout_s = 10;             // a remote image's whole download
};


/// The image of one part, in memory with its header checked; its origin is the part's field. Throws ApiError 400
/// naming part.param: a malformed data URL or base64, a file URL without --allowed-local-media-path or outside it,
/// a missing file, a remote URL while remote media are off, a download that fails, times out, redirects elsewhere
/// than http(s) or exceeds max_image_bytes, and an image that is not a supported JPEG/PNG or exceeds max_pixels.
vision::EncodedImage fetch_image(const ImagePart& part, const MediaOptions& options);

/// Every image of a request, in order. Throws ApiError 400 when there are more than options.max_images, and as
/// fetch_image.
std::vector<vision::EncodedImage> fetch_images(const std::vector<ImagePart>& parts, const MediaOptions& options);

}  // namespace swiftcpp::serve
