// Typed configuration decoded strictly from YAML recipes and `key=value` command-line overrides. One description
// per field drives parsing (unknown keys, wrong types and out-of-range values are errors naming file:line or the
// command-line argument), the resolved-config dump (args.json) and the help text.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"

namespace swiftcpp {

namespace config_detail {

/// One field: its key, type name, help, and how to set it from a YAML node and read it back as JSON.
struct Field {
  using Setter = std::function<void(void*, const YAML::Node&, const std::string&)>;  // (object, value, where)
  using Getter = std::function<Json(const void*)>;
  Field(std::string key_, std::string type_, std::string help_, Setter set_, Getter get_)
      : key(std::move(key_)), type(std::move(type_)), help(std::move(help_)), set(std::move(set_)), get(std::move(get_)) {}

  std::string key;
  std::string type;
  std::string help;
  Setter set;
  Getter get;
  std::string alias_of;  // another name for this key (set only; not dumped)
};

/// Edit distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

/// The scalar text of a node for messages.
std::string describe(const YAML::Node& node);

/// Applies a YAML mapping to `object` through `fields`. Throws ConfigError naming `origin`:line and the key.
void apply_mapping(void* object, const std::vector<Field>& fields, const YAML::Node& map, const std::string& origin);

/// Applies one "key=value" (value parsed as YAML) through `fields`. Throws ConfigError naming the argument.
void apply_assignment(void* object, const std::vector<Field>& fields, const std::string& assignment);

}  // namespace config_detail

/// The description of a config struct T. Build it once with the field adders, then parse into T values.
template <typename T>
class ConfigSchema {
 public:
  /// An integer field, checked against [min, max].
  ConfigSchema& integer(const std::string& key, int64_t T::*member, const std::string& help,
                        int64_t min = std::numeric_limits<int64_t>::min(),
                        int64_t max = std::numeric_limits<int64_t>::max()) {
    fields_.push_back({key, "integer", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         int64_t v = 0;
                         if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
                           fail<ConfigError>("{}: '{}' must be an integer, got {}", where, key, config_detail::describe(n));
                         }
                         if (v < min || v > max) fail<ConfigError>("{}: '{}' must be in [{}, {}], got {}", where, key, min, max, v);
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// A floating-point field, checked against [min, max]; NaN and infinities are refused.
  ConfigSchema& number(const std::string& key, double T::*member, const std::string& help,
                       double min = -std::numeric_limits<double>::infinity(),
                       double max = std::numeric_limits<double>::infinity()) {
    fields_.push_back({key, "number", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         double v = 0;
                         if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) {
                           fail<ConfigError>("{}: '{}' must be a number, got {}", where, key, config_detail::describe(n));
                         }
                         if (!std::isfinite(v)) fail<ConfigError>("{}: '{}' must be a finite number, got {}", where, key, v);
                         if (!(v >= min && v <= max)) fail<ConfigError>("{}: '{}' must be in [{}, {}], got {}", where, key, min, max, v);
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// An optional floating-point field: unset (null, the default) or a finite number in [min, max].
  ConfigSchema& optional_number(const std::string& key, std::optional<double> T::*member, const std::string& help,
                                double min = -std::numeric_limits<double>::infinity(),
                                double max = std::numeric_limits<double>::infinity()) {
    fields_.push_back({key, "number or null", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         if (n.IsNull() || (n.IsScalar() && (n.Scalar() == "null" || n.Scalar() == "None"))) {
                           (static_cast<T*>(o)->*member).reset();
                           return;
                         }
                         double v = 0;
                         if (!n.IsScalar() || !YAML::convert<double>::decode(n, v)) {
                           fail<ConfigError>("{}: '{}' must be a number or null, got {}", where, key, config_detail::describe(n));
                         }
                         if (!std::isfinite(v)) fail<ConfigError>("{}: '{}' must be a finite number, got {}", where, key, v);
                         if (!(v >= min && v <= max)) fail<ConfigError>("{}: '{}' must be in [{}, {}], got {}", where, key, min, max, v);
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) {
                         const std::optional<double>& v = static_cast<const T*>(o)->*member;
                         return v ? Json(*v) : Json(nullptr);
                       }});
    return *this;
  }

  /// Another name for an already declared key (ms-swift renames keys across versions): setting it sets that key.
  /// Not dumped; listed in help. Must follow the key's declaration.
  ConfigSchema& alias(const std::string& key, const std::string& target) {
    for (const auto& f : fields_) {
      if (f.key != target) continue;
      config_detail::Field a = f;
      a.key = key;
      a.help = "same as " + target;
      a.alias_of = target;
      fields_.push_back(std::move(a));
      return *this;
    }
    throw std::logic_error("ConfigSchema::alias: no key " + target);
  }

  /// A boolean field (true/false).
  ConfigSchema& boolean(const std::string& key, bool T::*member, const std::string& help) {
    fields_.push_back({key, "boolean", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         bool v = false;
                         if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
                           fail<ConfigError>("{}: '{}' must be true or false, got {}", where, key, config_detail::describe(n));
                         }
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// A string field; when `choices` is not empty the value must be one of them.
  ConfigSchema& string(const std::string& key, std::string T::*member, const std::string& help,
                       std::vector<std::string> choices = {}) {
    const std::string type = choices.empty() ? "string" : fmt::format("one of {}", fmt::join(choices, "|"));
    fields_.push_back({key, type, help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         if (!n.IsScalar()) fail<ConfigError>("{}: '{}' must be a string, got {}", where, key, config_detail::describe(n));
                         const std::string v = n.Scalar();
                         if (!valid_utf8(v)) fail<ConfigError>("{}: '{}' must be UTF-8 text", where, key);
                         if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
                           fail<ConfigError>("{}: '{}' must be one of {}, got '{}'", where, key, fmt::join(choices, ", "), v);
                         }
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// A list of strings; a single scalar is a one-element list.
  ConfigSchema& strings(const std::string& key, std::vector<std::string> T::*member, const std::string& help) {
    fields_.push_back({key, "list of strings", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         std::vector<std::string> v;
                         if (n.IsScalar()) {
                           v.push_back(n.Scalar());
                           if (!valid_utf8(v.back())) fail<ConfigError>("{}: '{}' must be UTF-8 text", where, key);
                         } else if (n.IsSequence()) {
                           for (const auto& e : n) {
                             if (!e.IsScalar()) fail<ConfigError>("{}: '{}' must hold strings, got {}", where, key, config_detail::describe(e));
                             v.push_back(e.Scalar());
                             if (!valid_utf8(v.back())) fail<ConfigError>("{}: '{}' must hold UTF-8 text", where, key);
                           }
                         } else if (!n.IsNull()) {
                           fail<ConfigError>("{}: '{}' must be a string or a list of strings", where, key);
                         }
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// A list of finite numbers; a single scalar is a one-element list.
  ConfigSchema& numbers(const std::string& key, std::vector<double> T::*member, const std::string& help) {
    fields_.push_back({key, "list of numbers", help,
                       [=](void* o, const YAML::Node& n, const std::string& where) {
                         std::vector<double> v;
                         const auto add = [&](const YAML::Node& e) {
                           double x = 0;
                           if (!e.IsScalar() || !YAML::convert<double>::decode(e, x) || !std::isfinite(x)) {
                             fail<ConfigError>("{}: '{}' must hold finite numbers, got {}", where, key,
                                               config_detail::describe(e));
                           }
                           v.push_back(x);
                         };
                         if (n.IsScalar()) {
                           add(n);
                         } else if (n.IsSequence()) {
                           for (const auto& e : n) add(e);
                         } else if (!n.IsNull()) {
                           fail<ConfigError>("{}: '{}' must be a number or a list of numbers", where, key);
                         }
                         static_cast<T*>(o)->*member = v;
                       },
                       [=](const void* o) { return Json(static_cast<const T*>(o)->*member); }});
    return *this;
  }

  /// Applies a YAML recipe file (a mapping of known keys) to `object`. Throws IoError when unreadable,
  /// FormatError on invalid YAML (file:line), ConfigError on an unknown key (with the closest valid one), a wrong
  /// type or an out-of-range value (file:line and key).
  void apply_file(T& object, const fs::path& file) const {
    YAML::Node root;
    const std::string text = read_text_file(file);
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      fail<FormatError>("{}:{}: invalid YAML: {}", file.string(), e.mark.line + 1, e.msg);
    }
    if (root.IsNull()) return;
    if (!root.IsMap()) fail<ConfigError>("{}: a recipe must be a mapping of keys to values", file.string());
    config_detail::apply_mapping(&object, fields_, root, file.string());
  }

  /// Applies one command-line override "key=value" (the value is read as YAML: 3, 1e-4, true, [a, b]).
  void apply_override(T& object, const std::string& assignment) const {
    config_detail::apply_assignment(&object, fields_, assignment);
  }

  /// Every field's current value, for args.json.
  Json dump(const T& object) const {
    Json out = Json::object();
    for (const auto& f : fields_) {
      if (f.alias_of.empty()) out[f.key] = f.get(&object);
    }
    return out;
  }

  /// One line per field: key, type, default (from `defaults`), help.
  std::string help(const T& defaults = T{}) const {
    std::string out;
    for (const auto& f : fields_) {
      out += fmt::format("  {:<28} {:<24} default {:<12} {}\n", f.key, f.type, f.get(&defaults).dump(), f.help);
    }
    return out;
  }

  const std::vector<config_detail::Field>& fields() const { return fields_; }

 private:
  std::vector<config_detail::Field> fields_;
};

}  // namespace swiftcpp
