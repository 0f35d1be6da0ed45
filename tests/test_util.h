// Shared helpers of the test suite: where the fixtures are, and reading the reference JSON (tensor helpers:
// tests/tensor_util.h).
#pragma once

#include <gtest/gtest.h>

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

#include <fmt/format.h>

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

/// The thread count the suite runs at: SWIFTCPP_TEST_THREADS when set to a positive number, else 0 (LibTorch's
/// default in-process, and each CLI test keeps the --threads it passes). tests/main.cpp applies it in-process.
inline int test_threads() {
  const char* value = std::getenv("SWIFTCPP_TEST_THREADS");
  if (value == nullptr || *value == '\0') return 0;
  const int n = std::atoi(value);
  return n > 0 ? n : 0;
}

/// A fresh empty folder under the test temp dir.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("swiftcpp_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
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

/// Starts the CLI with with_test_threads(args), its output in out/log.txt; as soon as a run folder out/v* holds
/// `checkpoint` (polled every `poll_s` seconds, for at most 6000 polls) sends `signal` ("TERM", "KILL", ...) and
/// waits for the process. Returns its exit status (128 + the signal when it died of one), or -1 when the shell did
/// not exit normally.
inline int run_cli_until_checkpoint(const std::string& args, const fs::path& out, const std::string& checkpoint,
                                    const std::string& signal, double poll_s = 0.01) {
  fs::create_directories(out);
  const std::string cmd = fmt::format(
      "{} {} >{}/log.txt 2>&1 & pid=$!; "
      "for i in $(seq 1 6000); do ls -d {}/v*/{} >/dev/null 2>&1 && break; sleep {}; done; "
      "kill -{} $pid; wait $pid",
      SWIFTCPP_BINARY, with_test_threads(args), out.string(), out.string(), checkpoint, poll_s, signal);
  const int status = std::system(("bash -c '" + cmd + "'").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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
