// JSON files with errors that name the file and the key.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "core/error.h"
#include "core/fs.h"

namespace swiftcpp {

using Json = nlohmann::json;

/// Parses a JSON file. Throws IoError when unreadable, FormatError naming the file and byte offset when the
/// text is not valid JSON.
Json load_json_file(const fs::path& path);

/// Parses JSON text; `origin` names where it came from in error messages. Throws FormatError.
Json parse_json(const std::string& text, const std::string& origin);

/// A JSON object read from a named file, with typed accessors whose errors name the file and the key.
class JsonObject {
 public:
  /// Throws FormatError when `value` is not an object.
  JsonObject(Json value, std::string origin);

  /// Loads `path` and requires a JSON object at its top.
  static JsonObject load(const fs::path& path);

  bool has(const std::string& key) const { return value_.contains(key) && !value_[key].is_null(); }
  const Json& raw() const { return value_; }
  const std::string& origin() const { return origin_; }

  /// The value of a required key converted to T. Throws ConfigError naming file, key and expected type.
  template <typename T>
  T get(const std::string& key) const {
    if (!has(key)) fail<ConfigError>("{}: required key '{}' is missing (expected {})", origin_, key, type_name<T>());
    return convert<T>(key, value_.at(key));
  }

  /// The value of an optional key, or `fallback` when absent or null. Throws ConfigError on a wrong type.
  template <typename T>
  T get_or(const std::string& key, const T& fallback) const {
    if (!has(key)) return fallback;
    return convert<T>(key, value_.at(key));
  }

  /// The value of an optional key, or nullopt when absent or null. Throws ConfigError on a wrong type.
  template <typename T>
  std::optional<T> find(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return convert<T>(key, value_.at(key));
  }

 private:
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else if constexpr (std::is_same_v<T, std::string>) return "a string";
    else return "a value of the documented type";
  }

  template <typename T>
  T convert(const std::string& key, const Json& v) const {
    bool ok = false;
    if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
    else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer() ||
                                                   (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<long long>(v.get<double>())));
    else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
    else if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
    else ok = true;
    if (!ok) fail<ConfigError>("{}: key '{}' must be {}, got {}", origin_, key, type_name<T>(), v.dump());
    try {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        if (v.is_number_float()) return static_cast<T>(v.get<double>());
      }
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      fail<ConfigError>("{}: key '{}' has an unexpected value {}: {}", origin_, key, v.dump(), e.what());
    }
  }

  Json value_;
  std::string origin_;
};

}  // namespace swiftcpp
