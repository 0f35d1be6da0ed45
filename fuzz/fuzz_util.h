// Helpers shared by the fuzz targets: a per-process scratch folder for parsers that take a path, and the rule
// every target follows: swiftcpp's typed errors (swiftcpp::Error) are the expected answer to bad input; any other
// exception escapes and libFuzzer reports it as a crash, like a sanitizer finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace swiftcpp::fuzz {

namespace fs = std::filesystem;

/// A folder under /tmp unique to this process, removed at exit.
inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    std::string templ = (fs::temp_directory_path() / "swiftcpp-fuzz-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return fs::path(templ);
  }();
  return dir;
}

/// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline fs::path write_scratch(const std::string& name, std::string_view bytes) {
  const fs::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) std::abort();
  return path;
}

/// Splits `input` at the first occurrence of `separator`: (before, after); no separator gives (input, "").
inline std::pair<std::string_view, std::string_view> split_once(std::string_view input, std::string_view separator) {
  const size_t at = input.find(separator);
  if (at == std::string_view::npos) return {input, {}};
  return {input.substr(0, at), input.substr(at + separator.size())};
}

/// Runs `body`, swallowing swiftcpp's typed errors (the documented reaction to bad input).
template <typename F>
void expect_clean(F&& body) {
  try {
    body();
  } catch (const swiftcpp::Error&) {
  }
}

}  // namespace swiftcpp::fuzz
