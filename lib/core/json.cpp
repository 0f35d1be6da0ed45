#include "core/json.h"

namespace swiftcpp {

Json parse_json(const std::string& text, const std::string& origin) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail<FormatError>("{}: invalid JSON at byte {}: {}", origin, e.byte, e.what());
  }
}

Json load_json_file(const fs::path& path) { return parse_json(read_text_file(path), path.string()); }

JsonObject::JsonObject(Json value, std::string origin) : value_(std::move(value)), origin_(std::move(origin)) {
  if (!value_.is_object()) fail<FormatError>("{}: expected a JSON object at the top level", origin_);
}

JsonObject JsonObject::load(const fs::path& path) { return JsonObject(load_json_file(path), path.string()); }

}  // namespace swiftcpp
