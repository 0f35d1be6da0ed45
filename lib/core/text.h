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

}  // namespace swiftcpp
