#include "core/json.h"

#include <algorithm>
#include <fstream>

namespace swiftcpp {
namespace {

// nlohmann's DOM builder with a nesting limit. The parser itself is iterative; the limit protects what comes
// after it (copies, comparisons and dump() recurse once per level).
class DepthLimitedBuilder : public nlohmann::detail::json_sax_dom_parser<Json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<Json>;
  DepthLimitedBuilder(Json& result, std::string& error) : Base(result, /*allow_exceptions=*/false), error_(error) {}

  bool start_object(std::size_t n) { return enter() && Base::start_object(n); }
  bool end_object() { --depth_; return Base::end_object(); }
  bool start_array(std::size_t n) { return enter() && Base::start_array(n); }
  bool end_array() { --depth_; return Base::end_array(); }

  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    if (error_.empty()) {
      std::string what = ex.what();
      // nlohmann's text repeats the whole last token; a long one (a 30 MB string) is clipped.
      if (what.size() > 200) what = what.substr(0, 200) + "...";
      error_ = fmt::format("at byte {}: {}", position, what);
    }
    return Base::parse_error(position, token, ex);
  }

 private:
  bool enter() {
    if (++depth_ <= kMaxJsonDepth) return true;
    if (error_.empty()) error_ = fmt::format("arrays and objects nested deeper than {} levels", kMaxJsonDepth);
    return false;
  }

  std::string& error_;
  int depth_ = 0;
};

void clip_into(std::string& out, std::string_view text, size_t limit) {
  out.append(text.substr(0, limit > out.size() ? limit - out.size() : 0));
}

// Appends the JSON text of `v` until `out` holds `limit` characters; recursion depth is bounded by the limit
// (every level writes at least one character).
void excerpt_into(const Json& v, std::string& out, size_t limit) {
  if (out.size() >= limit) return;
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() < limit; ++it) {
      if (!first) out += ", ";
      first = false;
      clip_into(out, Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace), limit);
      out += ": ";
      excerpt_into(it.value(), out, limit);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() < limit; ++it) {
      if (!first) out += ", ";
      first = false;
      excerpt_into(*it, out, limit);
    }
    out += ']';
  } else if (v.is_string()) {
    // Dump only a prefix of a long string (the prefix may end inside a UTF-8 character: replaced, not thrown).
    const auto& s = v.get_ref<const std::string&>();
    clip_into(out, Json(s.substr(0, limit)).dump(-1, ' ', false, Json::error_handler_t::replace), limit);
  } else {
    clip_into(out, v.dump(), limit);
  }
}

}  // namespace

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || n > s.size() - i) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

bool try_parse_json(std::string_view text, Json& out, std::string& error) {
  error.clear();
  Json result;
  DepthLimitedBuilder builder(result, error);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok || !error.empty() || builder.is_errored()) {
    if (error.empty()) error = "invalid JSON";
    return false;
  }
  out = std::move(result);
  return true;
}

Json parse_json(std::string_view text, const std::string& origin) {
  Json out;
  std::string error;
  if (!try_parse_json(text, out, error)) fail<FormatError>("{}: invalid JSON {}", origin, error);
  return out;
}

Json load_json_file(const fs::path& path) { return parse_json(read_text_file(path), path.string()); }

Json read_json_lines(const fs::path& file, std::string_view what) {
  Json out = Json::array();
  if (!fs::exists(file)) return out;
  require_regular_file(file, what);
  std::ifstream in(file);
  if (!in) fail<IoError>("cannot read {} {}", what, file.string());
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Json row;
    std::string error;
    if (!try_parse_json(line, row, error)) break;
    out.push_back(std::move(row));
  }
  return out;
}

std::string describe_json(const Json& value) {
  constexpr size_t kShown = 60;
  std::string text;
  excerpt_into(value, text, kShown + 1);
  if (text.size() > kShown) text = text.substr(0, kShown) + "...";
  switch (value.type()) {
    case Json::value_t::object: return fmt::format("an object of {} keys {}", value.size(), text);
    case Json::value_t::array: return fmt::format("an array of {} elements {}", value.size(), text);
    case Json::value_t::string: return fmt::format("the string {}", text);
    case Json::value_t::boolean: return fmt::format("the boolean {}", text);
    case Json::value_t::null: return "null";
    default: return fmt::format("the number {}", text);
  }
}

JsonObject::JsonObject(Json value, std::string origin) : value_(std::move(value)), origin_(std::move(origin)) {
  if (!value_.is_object()) fail<FormatError>("{}: expected a JSON object at the top level, got {}", origin_, describe_json(value_));
}

JsonObject JsonObject::load(const fs::path& path) { return JsonObject(load_json_file(path), path.string()); }

}  // namespace swiftcpp
