#include "core/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/resource.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>
#include <mutex>

#ifdef SWIFTCPP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define SWIFTCPP_ALLOCATOR_V23 1
#endif

namespace swiftcpp {

namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

// Each block carries its size in a header as long as the CPU allocator's alignment, so the raw deleter can count
// what it frees.
constexpr size_t kHeader = 64;

void count(int64_t bytes) {
  const int64_t now = g_current.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void tracked_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  count(-bytes);
  c10::free_cpu(base);
}

void* tracked_alloc(size_t bytes) {
  char* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
  const int64_t n = static_cast<int64_t>(bytes);
  std::memcpy(base, &n, sizeof n);
  count(n);
  return base + kHeader;
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
#ifdef SWIFTCPP_ALLOCATOR_V23
  c10::DataPtr allocate(size_t bytes) override {
#else
  c10::DataPtr allocate(size_t bytes) const override {
#endif
    void* data = tracked_alloc(bytes);
    return {data, data, &tracked_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
#ifdef SWIFTCPP_ALLOCATOR_V23
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif
};

#ifdef SWIFTCPP_WITH_CUDA
// allocated_bytes[0] is the aggregate over pools (StatType::AGGREGATE); `auto` keeps this independent of where
// LibTorch versions declare the statistics types.
int64_t cuda_allocated(const c10::Device& device, bool peak) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  return peak ? stats.allocated_bytes[0].peak : stats.allocated_bytes[0].current;
}
#endif

}  // namespace

void install_memory_tracking() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
}

int64_t current_memory_bytes(const c10::Device& device) {
#ifdef SWIFTCPP_WITH_CUDA
  if (device.is_cuda()) return cuda_allocated(device, false);
#endif
  return device.is_cpu() ? g_current.load() : 0;
}

int64_t peak_memory_bytes(const c10::Device& device) {
#ifdef SWIFTCPP_WITH_CUDA
  if (device.is_cuda()) return cuda_allocated(device, true);
#endif
  return device.is_cpu() ? g_peak.load() : 0;
}

void reset_peak_memory(const c10::Device& device) {
#ifdef SWIFTCPP_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
    return;
  }
#endif
  if (device.is_cpu()) g_peak = g_current.load();
}

std::string peak_memory_summary(const c10::Device& device) {
  return "peak memory: " + std::to_string(peak_rss_bytes() >> 20) + " MiB resident, " +
         std::to_string(peak_memory_bytes(device) >> 20) + " MiB of tensors on " + device.str();
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace swiftcpp
