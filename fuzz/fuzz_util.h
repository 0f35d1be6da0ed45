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

/// Structured values drawn from the input bytes, front to back; once the bytes run out every draw gives its
/// smallest value. (Targets build with any compiler, so this does not use clang's FuzzedDataProvider.)
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  /// An integer in [lo, hi] from as many bytes as the range needs.
  template <typename T>
  T integer_in(T lo, T hi) {
    if (hi <= lo) return lo;
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    uint64_t value = 0;
    for (uint64_t seen = 0; seen < span && pos_ < size_; seen = (seen << 8) | 0xFF) value = (value << 8) | data_[pos_++];
    return static_cast<T>(static_cast<uint64_t>(lo) + (span == UINT64_MAX ? value : value % (span + 1)));
  }
  bool boolean() { return integer_in<uint8_t>(0, 1) == 1; }
  /// Up to `max_length` bytes, ended early by a backslash that is not followed by another (so a string can hold
  /// any byte and the next value starts after it).
  std::string string(size_t max_length) {
    std::string out;
    while (out.size() < max_length && pos_ < size_) {
      const char c = static_cast<char>(data_[pos_++]);
      if (c == '\\') {
        if (pos_ < size_ && data_[pos_] == '\\') {
          ++pos_;
        } else {
          break;
        }
      }
      out += c;
    }
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// Runs `body`, swallowing swiftcpp's typed errors (the documented reaction to bad input).
template <typename F>
void expect_clean(F&& body) {
  try {
    body();
  } catch (const swiftcpp::Error&) {
  }
}

}  // namespace swiftcpp::fuzz
