// Runtime set-up: threads, BLAS detection and stop signals.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <sched.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/parallel.h"
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
  EXPECT_EQ(parallel::threads(), usable_cores());
  EXPECT_EQ(configure_threads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(parallel::threads(), 1);
  configure_threads(0);
}

// The library's thread team (core/parallel.h). Each test sets the team's size and puts back the one it found.
class TeamSize {
 public:
  explicit TeamSize(int n) : saved_(parallel::threads()) { parallel::set_threads(n); }
  ~TeamSize() { parallel::set_threads(saved_); }

 private:
  int saved_;
};

// Every chunk runs exactly once, whatever the team's size and however often a loop opens: many short loops in a
// row are where a claim raced by a thread that woke for the previous loop would run a chunk twice or never.
TEST(Parallel, EveryChunkRunsOnceAtEveryTeamSize) {
  for (int team : {1, 2, 3, 4}) {
    TeamSize size(team);
    for (int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(chunks));
      for (int round = 0; round < 200; ++round) {
        for (auto& r : runs) r.store(0);
        parallel::for_chunks(chunks, [&](int64_t c) { runs[static_cast<size_t>(c)].fetch_add(1); });
        for (int64_t c = 0; c < chunks; ++c) {
          ASSERT_EQ(runs[static_cast<size_t>(c)].load(), 1) << "team " << team << ", chunk " << c << " of " << chunks;
        }
      }
    }
  }
}

// for_range covers [begin, end) with disjoint ranges; a loop below the work threshold is one call on the caller.
TEST(Parallel, RangesCoverTheLoopAndSmallLoopsStayOnTheCaller) {
  TeamSize size(4);
  std::vector<std::atomic<int>> hits(10007);
  parallel::for_range(3, 10007, 1000, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < 10007; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), i < 3 ? 0 : 1) << i;
  int calls = 0;
  const auto caller = std::this_thread::get_id();
  parallel::for_range(0, 100, 10, [&](int64_t i0, int64_t i1) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(i0, 0);
    EXPECT_EQ(i1, 100);
  });
  EXPECT_EQ(calls, 1);
}

// Work is shared: with enough chunks a second thread takes some (the team is not the caller alone).
TEST(Parallel, ChunksRunOnMoreThanOneThread) {
  TeamSize size(2);
  std::mutex mutex;
  std::set<std::thread::id> seen;
  for (int round = 0; round < 50 && seen.size() < 2; ++round) {
    parallel::for_chunks(64, [&](int64_t) {
      volatile double sink = 0;
      for (int k = 0; k < 20000; ++k) sink = sink + std::sqrt(static_cast<double>(k));
      std::lock_guard<std::mutex> lock(mutex);
      seen.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(seen.size(), 2u);
}

// A loop inside a chunk runs on that chunk's thread, in order; so does an OpenMP region (LibTorch's team size is 1
// there), and the caller's own team size is back afterwards.
TEST(Parallel, LoopsAndOpenmpInsideAChunkStayOnItsThread) {
  TeamSize size(2);
  const int outer_openmp = at::get_num_threads();
  std::atomic<int> wrong{0}, inner{0}, openmp_not_serial{0};
  parallel::for_chunks(8, [&](int64_t) {
    if (!parallel::in_parallel_chunk()) wrong.fetch_add(1);
    if (at::get_num_threads() != 1) openmp_not_serial.fetch_add(1);
    const auto here = std::this_thread::get_id();
    int64_t expected = 0;
    parallel::for_chunks(5, [&](int64_t c) {
      if (std::this_thread::get_id() != here || c != expected++) wrong.fetch_add(1);
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(openmp_not_serial.load(), 0);
  EXPECT_EQ(inner.load(), 40);
  EXPECT_FALSE(parallel::in_parallel_chunk());
  EXPECT_EQ(at::get_num_threads(), outer_openmp);
}

// A chunk's exception reaches the caller after the other chunks ran, and the team keeps working.
TEST(Parallel, AChunksExceptionReachesTheCallerAndTheTeamGoesOn) {
  TeamSize size(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel::for_chunks(100,
                                    [&](int64_t c) {
                                      ran.fetch_add(1);
                                      if (c == 37) throw std::runtime_error("chunk 37");
                                    }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);
  std::atomic<int> again{0};
  parallel::for_chunks(100, [&](int64_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 100);
}

// Loops opened by two threads at once both complete and run every chunk once: the second runs on its own thread
// while the first holds the team (the serving engine beside a request thread).
TEST(Parallel, LoopsFromTwoThreadsAtOnceBothComplete) {
  TeamSize size(2);
  std::atomic<int64_t> sum_a{0}, sum_b{0};
  std::thread other([&] {
    for (int r = 0; r < 300; ++r) parallel::for_chunks(50, [&](int64_t c) { sum_b.fetch_add(c); });
  });
  for (int r = 0; r < 300; ++r) parallel::for_chunks(50, [&](int64_t c) { sum_a.fetch_add(c); });
  other.join();
  EXPECT_EQ(sum_a.load(), 300 * (49 * 50 / 2));
  EXPECT_EQ(sum_b.load(), 300 * (49 * 50 / 2));
}

// While another loop holds the team (its threads stuck in long chunks), loops opened on this thread run on it
// alone and finish, instead of queueing behind the held team.
TEST(Parallel, ALoopWhileTheTeamIsHeldRunsOnItsOwnThread) {
  TeamSize size(2);
  std::atomic<bool> release{false}, holding{false};
  std::thread holder([&] {
    parallel::for_chunks(2, [&](int64_t) {
      holding.store(true);
      while (!release.load()) std::this_thread::yield();
    });
  });
  while (!holding.load()) std::this_thread::yield();
  std::atomic<int> ran{0};
  for (int r = 0; r < 100; ++r) parallel::for_chunks(16, [&](int64_t) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 1600);
  release.store(true);
  holder.join();
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

TEST(Runtime, OpenmpWaitIsTheUsersWhenEitherVariableIsSet) {
  const char* none[] = {"PATH=/usr/bin", "OMP_NUM_THREADS=2", "XOMP_WAIT_POLICY=active", nullptr};
  const char* policy[] = {"PATH=/usr/bin", "OMP_WAIT_POLICY=active", nullptr};
  const char* spin[] = {"GOMP_SPINCOUNT=0", nullptr};
  const char* empty_value[] = {"OMP_WAIT_POLICY=", nullptr};
  const char* empty[] = {nullptr};
  EXPECT_FALSE(openmp_wait_chosen(none));
  EXPECT_TRUE(openmp_wait_chosen(policy));
  EXPECT_TRUE(openmp_wait_chosen(spin));
  EXPECT_TRUE(openmp_wait_chosen(empty_value));
  EXPECT_FALSE(openmp_wait_chosen(empty));
  EXPECT_FALSE(openmp_wait_chosen(nullptr));
}

// libgomp itself reports the spin count it took (OMP_DISPLAY_ENV=verbose, printed when it loads): the bounded one
// when the environment leaves the wait open, the user's when it chooses.
TEST(Runtime, ExecutablesStartWithABoundedOpenmpSpinUnlessTheUserChose) {
  const std::string ours = std::string(kOpenmpSpinEntry).substr(std::string("GOMP_SPINCOUNT=").size());
  const std::string clean = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose";
  const test::CliRun bounded = test::run_cli("--version", clean);
  ASSERT_EQ(bounded.code, 0) << bounded.out;
  EXPECT_NE(bounded.out.find("GOMP_SPINCOUNT = '" + ours + "'"), std::string::npos) << bounded.out;
  EXPECT_NE(bounded.out.find("swiftcpp "), std::string::npos) << bounded.out;
  const test::CliRun user = test::run_cli("--version", clean + " GOMP_SPINCOUNT=4321");
  ASSERT_EQ(user.code, 0) << user.out;
  EXPECT_NE(user.out.find("GOMP_SPINCOUNT = '4321'"), std::string::npos) << user.out;
  const test::CliRun active = test::run_cli("--version", clean + " OMP_WAIT_POLICY=active");
  ASSERT_EQ(active.code, 0) << active.out;
  EXPECT_NE(active.out.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << active.out;
  EXPECT_EQ(active.out.find("GOMP_SPINCOUNT = '" + ours + "'"), std::string::npos) << active.out;
}

}  // namespace
}  // namespace swiftcpp
