// JSON files with errors that name the file and the key.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/fs.h"

namespace swiftcpp {

using Json = nlohmann::json;

/// The deepest nesting of arrays and objects a JSON text may have. Every JSON read in libswiftcpp goes through
/// the parsers below, which refuse deeper text: a value nested further would overflow the stack in nlohmann's
/// recursive copy, comparison and dump().
constexpr int kMaxJsonDepth = 512;

/// Parses a JSON file. Throws IoError when unreadable, FormatError naming the file and byte offset when the
/// text is not valid JSON (including numbers out of the range of a double and nesting deeper than
/// kMaxJsonDepth).
Json load_json_file(const fs::path& path);

/// The values of a JSON Lines file (a training log), one per non-empty line, up to the first line that is not valid
/// JSON: a line cut short by a hard kill ends the file, and everything before it is intact. An absent file gives an
/// empty array. `what` names the file in errors. Throws IoError when the path exists but is not a readable regular
/// file.
Json read_json_lines(const fs::path& file, std::string_view what = "JSON Lines file");

/// Parses JSON text; `origin` names where it came from in error messages. Throws FormatError like
/// load_json_file.
Json parse_json(std::string_view text, const std::string& origin);

/// Parses JSON text into `out`; on invalid text (as parse_json refuses it) returns false and sets `error` to what
/// was wrong and where (byte offset), without naming an origin. Throws nothing but std::bad_alloc.
bool try_parse_json(std::string_view text, Json& out, std::string& error);

/// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF): what a
/// JSON string must hold for dump() to write it. Does not throw.
bool valid_utf8(std::string_view text);

/// A short description of a JSON value for error messages: its type and at most about 60 characters of its
/// text ("the string \"abc\"", "the number 1.5", "an array of 3 elements [1, 2, ...]"). Never prints a whole
/// large value. Does not throw except std::bad_alloc.
std::string describe_json(const Json& value);

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
    else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                                            std::trunc(v.get<double>()) == v.get<double>());
    else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
    else if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
    else ok = true;
    if (!ok) fail<ConfigError>("{}: key '{}' must be {}, got {}", origin_, key, type_name<T>(), describe_json(v));
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // In range of T before converting: a cast of an out-of-range value is undefined (floats) or wraps.
      using Limits = std::numeric_limits<T>;
      bool in_range = false;
      if (v.is_number_unsigned()) in_range = v.get<uint64_t>() <= static_cast<uint64_t>(Limits::max());
      else if (v.is_number_integer()) in_range = v.get<int64_t>() >= static_cast<int64_t>(Limits::min()) &&
                                                 (static_cast<uint64_t>(Limits::max()) >= static_cast<uint64_t>(INT64_MAX) ||
                                                  v.get<int64_t>() <= static_cast<int64_t>(Limits::max()));
      else in_range = v.get<double>() >= static_cast<double>(Limits::min()) &&
                      v.get<double>() < static_cast<double>(Limits::max()) + 1.0;
      if (!in_range) {
        fail<ConfigError>("{}: key '{}' is out of range: {} (expected {} in [{}, {}])", origin_, key, describe_json(v),
                          type_name<T>(), Limits::min(), Limits::max());
      }
      if (v.is_number_float()) return static_cast<T>(v.get<double>());
    }
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      fail<ConfigError>("{}: key '{}' has an unexpected value {}: {}", origin_, key, describe_json(v), e.what());
    }
  }

  Json value_;
  std::string origin_;
};

}  // namespace swiftcpp
