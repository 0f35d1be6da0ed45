// Small text helpers for messages.
#pragma once

#include <fmt/format.h>

#include <algorithm>
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

/// Appends one code point as UTF-8.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// `s` without leading and trailing ASCII whitespace (Python's str.strip()).
inline std::string strip_whitespace(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

/// The items of a `separator`-separated list, each without surrounding whitespace; empty items are dropped
/// ("a, ,b" -> {"a", "b"}).
inline std::vector<std::string> split_list(const std::string& list, char separator = ',') {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(separator, start), list.size());
    std::string item = strip_whitespace(list.substr(start, end - start));
    if (!item.empty()) out.push_back(std::move(item));
    start = end + 1;
  }
  return out;
}

}  // namespace swiftcpp
