// Shared helpers of the test suite: where the fixtures are, and reading the reference JSON.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/fs.h"

#include "core/json.h"

namespace swiftcpp::test {

/// A loopback TCP port free at the time of the call (for rendezvous in multi-process tests).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

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

/// The thread count the suite runs at: SWIFTCPP_TEST_THREADS when set to a positive number, else 0 (LibTorch's
/// default in-process, and each CLI test keeps the --threads it passes). tests/main.cpp applies it in-process.
inline int test_threads() {
  const char* value = std::getenv("SWIFTCPP_TEST_THREADS");
  if (value == nullptr || *value == '\0') return 0;
  const int n = std::atoi(value);
  return n > 0 ? n : 0;
}

/// The absolute tolerance for two float computations of the same quantity that may differ only in rounding
/// (for instance a reduction split differently across threads): `ulps` units of the dtype's machine epsilon
/// times `magnitude` (the largest magnitude among the terms involved, or of the result).
inline double rounding_tolerance(at::ScalarType dtype, double magnitude, double ulps) {
  double eps = 0;
  switch (dtype) {
    case at::kDouble: eps = 0x1p-52; break;
    case at::kFloat: eps = 0x1p-23; break;
    case at::kBFloat16: eps = 0x1p-7; break;
    case at::kHalf: eps = 0x1p-10; break;
    default: ADD_FAILURE() << "rounding_tolerance: not a floating dtype"; return 0;
  }
  return ulps * eps * magnitude;
}

/// Expects `actual` to equal `expected` up to rounding: every element within rounding_tolerance(dtype,
/// max |expected|, ulps). For results whose operation order is not fixed (thread-split reductions).
inline void expect_equal_up_to_rounding(const at::Tensor& actual, const at::Tensor& expected, double ulps,
                                        const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  const double magnitude = e.abs().max().item<double>();
  const double tolerance = rounding_tolerance(expected.scalar_type(), magnitude, ulps);
  const double gap = (a - e).abs().max().item<double>();
  EXPECT_LE(gap, tolerance) << what << ": largest difference " << gap << " over a tolerance of " << ulps
                            << " ulps of " << magnitude;
}

/// A fresh empty folder under the test temp dir.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("swiftcpp_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Nested JSON lists of numbers -> a float64 tensor of the same shape.
inline at::Tensor json_to_tensor(const Json& j) {
  std::vector<int64_t> shape;
  const Json* cur = &j;
  while (cur->is_array()) {
    shape.push_back(static_cast<int64_t>(cur->size()));
    if (cur->empty()) break;
    cur = &(*cur)[0];
  }
  std::vector<double> flat;
  std::function<void(const Json&)> walk = [&](const Json& x) {
    if (x.is_array()) {
      for (const auto& e : x) walk(e);
    } else {
      flat.push_back(x.get<double>());
    }
  };
  walk(j);
  return at::tensor(flat, at::kDouble).view(shape);
}

/// Runs `f`, expects it to throw exactly E (not merely another swiftcpp::Error) and the message to contain
/// every one of `needles`.
template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "message lacks '" << needle << "': " << message;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << "no exception thrown";
}

/// Exit code and combined stdout/stderr of the swiftcpp binary run with `args` (a shell fragment), with an
/// optional environment prefix such as "LD_PRELOAD=...".
struct CliRun {
  int code;
  std::string out;
};
/// CLI arguments as the suite runs them: with SWIFTCPP_TEST_THREADS set, a leading `--threads K` becomes that
/// thread count, so the CLI tests run at the suite's thread count too.
inline std::string with_test_threads(const std::string& args) {
  const std::string flag = "--threads ";
  const int n = test_threads();
  if (n == 0 || args.rfind(flag, 0) != 0) return args;
  const size_t end = args.find(' ', flag.size());
  return flag + std::to_string(n) + (end == std::string::npos ? "" : args.substr(end));
}

/// Runs the CLI with with_test_threads(args).
inline CliRun run_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(SWIFTCPP_BINARY) + " " + with_test_threads(args) + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// llama.cpp's tokenizer test vectors: `.inp` holds strings each followed by "\n__ggml_vocab_test__\n", `.out`
/// one line of space-separated ids per string (no BOS).
struct GoldenVectors {
  std::vector<std::string> texts;
  std::vector<std::vector<int>> ids;
};
inline GoldenVectors read_llamacpp_vectors(const std::filesystem::path& inp, const std::filesystem::path& out) {
  GoldenVectors vectors;
  const std::string text = swiftcpp::read_text_file(inp);
  const std::string separator = "\n__ggml_vocab_test__\n";
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find(separator, start);
    if (end == std::string::npos) {
      ADD_FAILURE() << inp << ": trailing text without a separator";
      break;
    }
    vectors.texts.push_back(text.substr(start, end - start));
    start = end + separator.size();
  }
  std::istringstream lines(swiftcpp::read_text_file(out));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<int> ids;
    for (int id = 0; fields >> id;) ids.push_back(id);
    vectors.ids.push_back(std::move(ids));
  }
  return vectors;
}

}  // namespace swiftcpp::test

/// Skips the current test with a printed reason when a file from ../shared is absent.
#define SWIFTCPP_REQUIRE_SHARED(path)                                                                  \
  do {                                                                                                 \
    if (!std::filesystem::exists(path)) {                                                              \
      GTEST_SKIP() << "skipped: " << (path).string() << " is absent (../shared assets not checked out)"; \
    }                                                                                                  \
  } while (0)
