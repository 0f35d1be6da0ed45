#include "core/runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <sched.h>

#include <cstring>
#include <ctime>
#include <fstream>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <string>
#include <thread>

namespace swiftcpp {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

bool cpu_has_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown";
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

void configure_allocator() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

int parallel_loop_threads() {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  // One index a chunk, each chunk long enough that a second thread starts before the first has taken them all.
  at::parallel_for(0, 64, 1, [&](int64_t begin, int64_t end) {
    volatile double sink = 0;
    for (int64_t i = begin; i < end; ++i) {
      for (int k = 0; k < 20000; ++k) sink = sink + std::sqrt(static_cast<double>(k + i));
    }
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int>(seen.size());
}

int configure_threads(int threads) {
  const int n = threads > 0 ? threads : usable_cores();
  at::set_num_threads(n);
  return n;
}

std::string loaded_blas() {
  // The library that provides sgemm_ to the process is the one LibTorch's matmuls call.
  void* symbol = dlsym(RTLD_DEFAULT, "sgemm_");
  if (symbol == nullptr) symbol = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  char resolved[PATH_MAX];
  const std::string path = realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
  if (path.find("openblas") != std::string::npos) return "openblas";
  if (path.find("mkl") != std::string::npos) return "mkl";
  if (path.find("blis") != std::string::npos) return "blis";
  if (path.find("libblas") != std::string::npos) return "reference";
  return "unknown";
}

std::string blas_warning() {
  if (loaded_blas() != "reference") return {};
  return "only the reference BLAS is loaded: matrix products run about 30x slower. Install an optimised one "
         "(`apt-get install libopenblas0-openmp`, or run scripts/setup.sh).";
}

namespace {
std::mutex& warning_mutex() {
  static std::mutex m;
  return m;
}
WarningSink& warning_sink() {
  static WarningSink sink;
  return sink;
}
}  // namespace

WarningSink set_warning_sink(WarningSink sink) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  std::swap(warning_sink(), sink);
  return sink;
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  if (warning_sink()) warning_sink()(message);
}

}  // namespace swiftcpp
