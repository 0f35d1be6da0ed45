// The test binary's entry point: GoogleTest, with the thread count of the whole run chosen by
// SWIFTCPP_TEST_THREADS (unset: LibTorch's default in-process and each CLI test's own --threads).
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>

#include "core/runtime.h"
#include "core/signals.h"
#include "tests/test_util.h"

int main(int argc, char** argv) {
  // A threadsafe death test's child (this binary run again for one statement) blocks the stop signals before any
  // thread exists, as swiftcpp's main does, for the tests of core/signals.h; LibTorch's set-up below starts threads
  // of its own at two threads.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--gtest_internal_run_death_test", 0) == 0) swiftcpp::block_stop_signals();
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (const int n = swiftcpp::test::test_threads(); n > 0) {
    // Children (the CLI, multi-process workers) inherit the setting through the environment as well.
    setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1);
    swiftcpp::configure_threads(n);
  }
  return RUN_ALL_TESTS();
}
