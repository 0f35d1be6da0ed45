#include "core/runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>
#include <ctime>
#include <fstream>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <string>
#include <thread>

#include "core/parallel.h"

namespace swiftcpp {

namespace {

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  return text;
}

std::optional<int64_t> parse_count(const std::string& word) {
  if (word.empty() || word.size() > 18) return std::nullopt;
  for (char c : word) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::stoll(word);
}

// The quota of one cgroup folder, in cores: v2's "cpu.max" ("QUOTA PERIOD" or "max PERIOD"), else v1's
// cpu.cfs_quota_us (-1: none) / cpu.cfs_period_us.
std::optional<double> folder_quota(const std::string& dir) {
  if (const auto max = read_small_file(dir + "/cpu.max")) {
    const size_t space = max->find(' ');
    if (space == std::string::npos) return std::nullopt;
    const auto quota = parse_count(max->substr(0, space));
    const auto period = parse_count(max->substr(space + 1));
    if (!quota || !period || *period <= 0 || *quota <= 0) return std::nullopt;
    return static_cast<double>(*quota) / static_cast<double>(*period);
  }
  const auto quota_text = read_small_file(dir + "/cpu.cfs_quota_us");
  const auto period_text = read_small_file(dir + "/cpu.cfs_period_us");
  if (!quota_text || !period_text) return std::nullopt;
  const auto quota = parse_count(*quota_text);  // "-1" (no quota) does not parse
  const auto period = parse_count(*period_text);
  if (!quota || !period || *period <= 0 || *quota <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

}  // namespace

std::optional<double> cgroup_cpu_quota(const std::string& cgroup_mount, const std::string& proc_self_cgroup) {
  // Lines "ID:CONTROLLERS:PATH": v2's "0::/PATH", v1's "N:cpu,cpuacct:/PATH" (mounted at MOUNT/cpu,cpuacct or
  // MOUNT/cpu). Inside a container the path is often one of the host's while the folder mounted is the
  // container's own, so each candidate is tried from the full path down to the mount's root.
  std::vector<std::string> bases;
  std::vector<std::string> paths;
  size_t start = 0;
  while (start < proc_self_cgroup.size()) {
    size_t end = proc_self_cgroup.find('\n', start);
    if (end == std::string::npos) end = proc_self_cgroup.size();
    const std::string line = proc_self_cgroup.substr(start, end - start);
    start = end + 1;
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? std::string::npos : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (controllers.empty()) {
      bases.push_back(cgroup_mount);
      paths.push_back(path);
    } else {
      bool cpu = false;
      size_t s = 0;
      while (s <= controllers.size()) {
        size_t e = controllers.find(',', s);
        if (e == std::string::npos) e = controllers.size();
        if (controllers.compare(s, e - s, "cpu") == 0) cpu = true;
        s = e + 1;
      }
      if (!cpu) continue;
      for (const char* name : {"/cpu,cpuacct", "/cpuacct,cpu", "/cpu"}) {
        bases.push_back(cgroup_mount + name);
        paths.push_back(path);
      }
    }
  }
  std::optional<double> best;
  for (size_t i = 0; i < bases.size(); ++i) {
    std::string path = paths[i];
    for (;;) {
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      const std::string dir = path == "/" ? bases[i] : bases[i] + path;
      if (const auto q = folder_quota(dir); q && (!best || *q < *best)) best = q;
      if (path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  return best;
}

int usable_cores() {
  int n = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) {
    const unsigned hw = std::thread::hardware_concurrency();
    n = hw > 0 ? static_cast<int>(hw) : 1;
  }
  std::ifstream in("/proc/self/cgroup");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (const auto quota = cgroup_cpu_quota("/sys/fs/cgroup", text)) {
    // Rounded down: threads beyond the quota are throttled together, and a spinning team waits on the slowest.
    n = std::min(n, std::max(1, static_cast<int>(std::floor(*quota))));
  }
  return n;
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

bool openmp_wait_chosen(const char* const* envp) {
  if (envp == nullptr) return false;
  for (const char* const* e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 || std::strncmp(*e, "GOMP_SPINCOUNT=", 15) == 0) return true;
  }
  return false;
}

int configure_threads(int threads) {
  const int n = threads > 0 ? threads : usable_cores();
  at::set_num_threads(n);
  parallel::set_threads(n);
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
