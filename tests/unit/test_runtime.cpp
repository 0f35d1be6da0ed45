// Runtime set-up: threads, BLAS detection and stop signals.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <sched.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <thread>

#include "core/process.h"
#include "core/runtime.h"
#include "core/signals.h"
#include "tests/test_util.h"

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

// A container's CPU quota caps the default thread count (issue: two threads on a one-core quota ran their
// spinning team at the quota's mercy). Fixtures in the layouts of cgroup v2 and v1.
TEST(Runtime, CgroupCpuQuotaReadsV2AndV1AndTheTightestAncestor) {
  namespace fs = std::filesystem;
  const fs::path root = test::temp_dir("cgroup_quota");
  const auto put = [&](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  // v2: the process's own cgroup has no limit, its parent 1.5 cores, the grandparent 4.
  put(root / "v2/a/cpu.max", "400000 100000");
  put(root / "v2/a/b/cpu.max", "150000 100000");
  put(root / "v2/a/b/c/cpu.max", "max 100000");
  EXPECT_EQ(cgroup_cpu_quota((root / "v2").string(), "0::/a/b/c\n"), 1.5);
  EXPECT_EQ(cgroup_cpu_quota((root / "v2").string(), "0::/a\n"), 4.0);
  EXPECT_EQ(cgroup_cpu_quota((root / "v2").string(), "0::/elsewhere\n"), std::nullopt);
  // A container: /proc/self/cgroup names the host's path, the mount holds the container's own folder.
  put(root / "ctr/cpu.max", "100000 100000");
  EXPECT_EQ(cgroup_cpu_quota((root / "ctr").string(), "0::/kubepods/pod1/abc\n"), 1.0);
  // v1: the cpu controller's quota and period; -1 is no quota; other controllers are ignored.
  put(root / "v1/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "200000");
  put(root / "v1/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroup_cpu_quota((root / "v1").string(), "4:memory:/docker/x\n2:cpu,cpuacct:/docker/x\n"), 2.0);
  put(root / "v1b/cpu/cpu.cfs_quota_us", "-1");
  put(root / "v1b/cpu/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroup_cpu_quota((root / "v1b").string(), "1:cpu:/\n"), std::nullopt);
  // Malformed files and lines count as no quota.
  put(root / "bad/cpu.max", "lots 100000");
  EXPECT_EQ(cgroup_cpu_quota((root / "bad").string(), "0::/\n"), std::nullopt);
  put(root / "zero/cpu.max", "100000 0");
  EXPECT_EQ(cgroup_cpu_quota((root / "zero").string(), "0::/\n"), std::nullopt);
  EXPECT_EQ(cgroup_cpu_quota((root / "v2").string(), "garbage\n::\n0::relative\n"), std::nullopt);
  EXPECT_EQ(cgroup_cpu_quota((root / "none").string(), ""), std::nullopt);
  // This machine: never more than the affinity mask.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(usable_cores(), CPU_COUNT(&set));
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
