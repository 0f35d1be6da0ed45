// Small text helpers for messages.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

namespace swiftcpp {

/// "a, b, c, ... (N in all)": at most `limit` names, for error messages that list tensors or keys.
inline std::string list_names(const std::vector<std::string>& names, size_t limit = 12) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

/// `s` without leading and trailing ASCII whitespace (Python's str.strip()).
inline std::string strip_whitespace(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace swiftcpp
