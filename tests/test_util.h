// Shared helpers of the test suite: where the fixtures are, and reading the reference JSON.
#pragma once

#include <gtest/gtest.h>

#include <c10/core/Device.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/json.h"

namespace swiftcpp::test {

inline std::filesystem::path source_dir() { return SWIFTCPP_SOURCE_DIR; }
inline std::filesystem::path shared_dir() { return SWIFTCPP_SHARED_DIR; }
inline std::filesystem::path assets() { return shared_dir() / "assets"; }
inline std::filesystem::path stories_dir() { return source_dir() / "models" / "stories260K"; }

/// The device the device-aware tests run on: SWIFTCPP_TEST_DEVICE (cpu, cuda, cuda:N), default cpu.
/// scripts/gpu_check.sh sets it to cuda.
inline c10::Device test_device() {
  const char* name = std::getenv("SWIFTCPP_TEST_DEVICE");
  return c10::Device(name != nullptr && *name != '\0' ? name : "cpu");
}

/// A fresh empty folder under the test temp dir.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("swiftcpp_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace swiftcpp::test

/// Skips the current test with a printed reason when a file from ../shared is absent.
#define SWIFTCPP_REQUIRE_SHARED(path)                                                                  \
  do {                                                                                                 \
    if (!std::filesystem::exists(path)) {                                                              \
      GTEST_SKIP() << "skipped: " << (path).string() << " is absent (../shared assets not checked out)"; \
    }                                                                                                  \
  } while (0)
