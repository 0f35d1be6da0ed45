#include "config/schema.h"

#include <algorithm>

namespace swiftcpp::config_detail {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

namespace {

const Field& find_field(const std::vector<Field>& fields, const std::string& key, const std::string& where) {
  for (const auto& f : fields) {
    if (f.key == key) return f;
  }
  const Field* best = nullptr;
  size_t best_distance = SIZE_MAX;
  for (const auto& f : fields) {
    const size_t d = edit_distance(key, f.key);
    if (d < best_distance) {
      best_distance = d;
      best = &f;
    }
  }
  std::string valid;
  for (const auto& f : fields) valid += (valid.empty() ? "" : ", ") + f.key;
  if (best != nullptr && best_distance <= std::max<size_t>(2, key.size() / 3)) {
    fail<ConfigError>("{}: unknown key '{}' (did you mean '{}'?); valid keys: {}", where, key, best->key, valid);
  }
  fail<ConfigError>("{}: unknown key '{}'; valid keys: {}", where, key, valid);
}

}  // namespace

void apply_mapping(void* object, const std::vector<Field>& fields, const YAML::Node& map, const std::string& origin) {
  std::vector<std::string> seen;
  for (const auto& item : map) {
    const std::string where = fmt::format("{}:{}", origin, item.first.Mark().line + 1);
    if (!item.first.IsScalar()) fail<ConfigError>("{}: keys must be plain names", where);
    if (std::find(seen.begin(), seen.end(), item.first.Scalar()) != seen.end()) {
      fail<ConfigError>("{}: key '{}' is given twice", where, item.first.Scalar());
    }
    seen.push_back(item.first.Scalar());
    find_field(fields, item.first.Scalar(), where).set(object, item.second, where);
  }
}

void apply_assignment(void* object, const std::vector<Field>& fields, const std::string& assignment) {
  const std::string where = fmt::format("command line '{}'", assignment);
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) fail<ConfigError>("{}: expected key=value", where);
  const std::string key = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail<ConfigError>("{}: the value is not valid YAML: {}", where, e.msg);
  }
  find_field(fields, key, where).set(object, value, where);
}

}  // namespace swiftcpp::config_detail
