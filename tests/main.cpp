// The test binary's entry point: GoogleTest, with the thread count of the whole run chosen by
// SWIFTCPP_TEST_THREADS (unset: LibTorch's default in-process and each CLI test's own --threads).
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>

#include "tests/test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const int n = swiftcpp::test::test_threads(); n > 0) {
    // Children (the CLI, multi-process workers) inherit the setting through the environment as well.
    setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1);
    at::set_num_threads(n);
  }
  return RUN_ALL_TESTS();
}
