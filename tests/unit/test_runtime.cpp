// Runtime set-up: threads and BLAS detection.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "core/runtime.h"

namespace swiftcpp {
namespace {

TEST(Runtime, ThreadsDefaultToUsableCores) {
  EXPECT_GE(usable_cores(), 1);
  EXPECT_EQ(configure_threads(0), usable_cores());
  EXPECT_EQ(at::get_num_threads(), usable_cores());
  EXPECT_EQ(configure_threads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  configure_threads(0);
}

// The library's parallel loops (the decode kernels, GGUF and GPTQ unpacking) run on LibTorch's threads: without
// OpenMP in their translation units at::parallel_for ran every range on one thread (seen as the decode kernels
// using one core of two).
TEST(Runtime, LibraryParallelLoopsUseLibTorchsThreads) {
  configure_threads(2);
  EXPECT_EQ(parallel_loop_threads(), 2);
  configure_threads(1);
  EXPECT_EQ(parallel_loop_threads(), 1);
  configure_threads(0);
}

// scripts/setup.sh installs OpenBLAS; the reference BLAS would make every matmul ~30x slower.
TEST(Runtime, OptimisedBlasIsLoaded) {
  const std::string blas = loaded_blas();
  std::cout << "[loaded BLAS: " << blas << "]" << std::endl;
  EXPECT_NE(blas, "reference") << blas_warning();
  EXPECT_EQ(blas_warning().empty(), blas != "reference");
}

}  // namespace
}  // namespace swiftcpp
