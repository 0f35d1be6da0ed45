// Typed errors thrown by libswiftcpp. Only apps/ catches them and turns them into messages and exit codes.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace swiftcpp {

/// Base of every error libswiftcpp throws on bad input or failed I/O.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A file could not be opened, read, written or renamed.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A file was read but its content is malformed (safetensors, JSON, tokenizer model, ...).
class FormatError : public Error {
 public:
  using Error::Error;
};

/// A configuration value (config.json, recipe, CLI option) is missing, mistyped or out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A model checkpoint does not fit the architecture (missing/extra/misshaped weights, unknown family).
class ModelError : public Error {
 public:
  using Error::Error;
};

/// Another process of a multi-process job failed, hung past the timeout, or could not be reached.
class DistributedError : public Error {
 public:
  using Error::Error;
};

/// Throws E with a fmt-formatted message.
template <typename E = Error, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace swiftcpp
