// Runtime set-up: threads, BLAS detection and stop signals.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/process.h"
#include "core/runtime.h"
#include "core/signals.h"

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

// A callback that returns false lets the signal end the process as its default action would (a second Ctrl-C).
TEST(StopSignals, DeclinedSignalEndsTheProcessByItsDefaultAction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        block_stop_signals();
        const StopSignals signals([](int) { return false; });
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        _exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

// Child processes start with nothing blocked: exec keeps the mask, and a reward command or a benchmarked child
// that inherited blocked SIGINT/SIGTERM could be neither stopped nor timed out.
TEST(StopSignals, ChildProcessesStartWithAnEmptyMask) {
  block_stop_signals();
  EXPECT_TRUE(stop_signals_blocked());
  const ProcessResult r = run_process({"/bin/sh", "-c", "grep SigBlk /proc/self/status"});
  unblock_stop_signals();
  EXPECT_FALSE(stop_signals_blocked());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SigBlk:\t0000000000000000\n");
}

}  // namespace
}  // namespace swiftcpp
