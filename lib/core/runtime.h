// Process-wide runtime set-up: thread count, allocator and BLAS detection.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace swiftcpp {

/// The version `swiftcpp --version` prints and reports record.
inline constexpr const char* kVersion = "0.1.0";

/// Number of CPU cores this process may use: the cores of its affinity mask, capped by a cgroup CPU quota (a
/// container's `cpu.max`, or cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`) rounded down; at least 1.
int usable_cores();

/// The CPU quota of the cgroup a process is in, in cores (quota / period; 1.5 for "150000 100000"), the smallest
/// over the cgroup and its ancestors; nullopt when there is none ("max", no cpu controller, unreadable files).
/// `cgroup_mount` is where the hierarchy is mounted (/sys/fs/cgroup), `proc_self_cgroup` the text of
/// /proc/self/cgroup. Never throws: a file it cannot read or parse counts as no quota.
std::optional<double> cgroup_cpu_quota(const std::string& cgroup_mount, const std::string& proc_self_cgroup);

/// How long a thread of an OpenMP team (LibTorch's intra-op threads, oneDNN's and OpenBLAS's GEMMs) waits by
/// spinning before it sleeps: libgomp's default, 300,000 rounds of `pause` (about 10 ms) whenever the process's
/// threads fit its cores, burns the cores that a busy machine's other processes (or the team's own late threads)
/// need, and under contention runs many times slower than one thread. libgomp reads the setting once, from the
/// environment, when it loads, so the executables start themselves again with this entry added before any
/// library initialises (apps/openmp_wait.cpp). A bounded spin, then a futex sleep.
inline constexpr const char* kOpenmpSpinEntry = "GOMP_SPINCOUNT=300";

/// Whether an environment (a null-terminated array of "KEY=VALUE") already chooses how OpenMP threads wait
/// (OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, to anything): then it is left as the user set it. Plain C string
/// operations only: it runs before the C++ runtime initialises.
bool openmp_wait_chosen(const char* const* envp);

/// Sets LibTorch's intra-op thread count; `threads <= 0` means usable_cores(). Returns the count set.
int configure_threads(int threads);

/// How many threads a parallel loop of the library (at::parallel_for) runs on now. at::parallel_for is a header
/// template: compiled without OpenMP it runs the whole range on the calling thread, so this is 1 where the build
/// left OpenMP out of the files that split work (CMakeLists.txt), LibTorch's intra-op thread count otherwise.
int parallel_loop_threads();

/// Keeps freed large blocks in the heap for reuse (glibc malloc: mmap threshold 1 GiB, trim threshold 2 GiB).
/// Training allocates and frees the same large activation tensors every step; with glibc's defaults each of them
/// is a fresh mmap whose pages fault in again (measured: 4x slower LoRA steps on stories260K, most time in the
/// kernel). Peak RSS is unchanged; memory is returned to the system at exit rather than after every free.
void configure_allocator();

/// Whether the CPU has bfloat16 dot-product instructions (avx512_bf16 or amx_bf16 in /proc/cpuinfo). Without
/// them LibTorch's bfloat16 matmuls run a scalar fallback (measured 30-50x slower than float32 here).
bool cpu_has_bf16();

/// The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC 7B13"), or "unknown".
std::string cpu_model_name();

/// The current UTC time as ISO 8601 to the second ("2025-01-31T12:00:00Z"), for reports.
std::string utc_now_iso8601();

/// Which BLAS library is loaded into the process: "openblas", "mkl", "blis", "reference" or "unknown".
std::string loaded_blas();

/// A warning to print when only the slow reference BLAS is loaded; empty when the BLAS is fine.
std::string blas_warning();

/// Receives the warnings libswiftcpp raises (lib/ never prints): apps/ installs one that prints to stderr.
using WarningSink = std::function<void(const std::string& message)>;

/// Installs the process-wide warning sink (an empty function drops warnings, the default) and returns the one it
/// replaces. Thread-safe. Throws nothing.
WarningSink set_warning_sink(WarningSink sink);

/// Hands `message` to the installed warning sink (nothing happens when none is installed). Thread-safe: calls are
/// serialised. Throws what the sink throws.
void warn(const std::string& message);

}  // namespace swiftcpp
