#include "core/parallel.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/runtime.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace swiftcpp::parallel {

namespace {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The job word: epoch (24 bits) | chunks (20 bits) | next unclaimed chunk (20 bits). One word, so a thread's claim
// (a compare-and-swap that adds 1) can only succeed for the job it read, and only while chunks remain.
constexpr int kChunkBits = 20;
constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
constexpr int64_t kMaxChunks = static_cast<int64_t>(kChunkMask);
inline uint64_t epoch_of(uint64_t s) { return s >> (2 * kChunkBits); }
inline int64_t chunks_of(uint64_t s) { return static_cast<int64_t>((s >> kChunkBits) & kChunkMask); }
inline int64_t next_of(uint64_t s) { return static_cast<int64_t>(s & kChunkMask); }

thread_local bool t_in_chunk = false;

// OpenMP regions opened inside a chunk (a oneDNN GEMM, a LibTorch operation) run on the thread that opened them:
// the team is already busy, and a nested OpenMP team a thread would only fight it for the cores. OpenMP's thread
// count is a per-thread setting, so this holds for the chunk's thread alone and is put back afterwards.
class OpenmpSerial {
 public:
  OpenmpSerial() {
#ifdef _OPENMP
    saved_ = omp_get_max_threads();
    if (saved_ != 1) omp_set_num_threads(1);
#endif
  }
  ~OpenmpSerial() {
#ifdef _OPENMP
    if (saved_ != 1) omp_set_num_threads(saved_);
#endif
  }
  OpenmpSerial(const OpenmpSerial&) = delete;
  OpenmpSerial& operator=(const OpenmpSerial&) = delete;

 private:
  int saved_ = 1;
};

struct ChunkScope {
  ChunkScope() { t_in_chunk = true; }
  ~ChunkScope() { t_in_chunk = false; }
};

class Team {
 public:
  void set_threads(int n) {
    std::lock_guard<std::mutex> lock(busy_);
    if (n < 1) n = 1;
    if (n == size_.load()) return;  // 0 until set: usable_cores() then
    stop_workers();
    size_.store(n);
  }

  int size() {
    const int n = size_.load(std::memory_order_relaxed);
    if (n > 0) return n;
    int unset = 0;
    size_.compare_exchange_strong(unset, usable_cores());
    return size_.load();
  }

  void run(int64_t chunks, detail::ChunkFn fn, const void* ctx) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) {  // another thread's loop holds the team: this one runs alone
      run_inline(chunks, fn, ctx);
      return;
    }
    start_workers();
    // More chunks than one job word holds: whole groups of them a job chunk.
    const int64_t group = (chunks + kMaxChunks - 1) / kMaxChunks;
    group_ = group;
    total_ = chunks;
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    const int64_t jobs = (chunks + group - 1) / group;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t epoch = (epoch_of(state_.load(std::memory_order_relaxed)) + 1) & ((uint64_t{1} << 24) - 1);
    state_.store((epoch << (2 * kChunkBits)) | (static_cast<uint64_t>(jobs) << kChunkBits));
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> wake(sleep_mutex_); }
      wake_.notify_all();
    }
    {
      OpenmpSerial serial;
      work();
    }
    // Wait for the chunks other threads claimed; never for a thread that has not claimed one.
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0; done_.load(std::memory_order_acquire) < jobs; ++spins) {
      if ((spins & 15) == 15 && std::chrono::steady_clock::now() - start >
                                    std::chrono::microseconds(kSpinMicroseconds)) {
        std::this_thread::yield();
      } else {
        relax();
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static void run_inline(int64_t chunks, detail::ChunkFn fn, const void* ctx) {
    ChunkScope scope;
    OpenmpSerial serial;
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
  }

  // Claims and runs chunks of whatever job is current until none is left.
  void work() {
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      if (next_of(s) >= chunks_of(s)) return;
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const int64_t first = next_of(s) * group_, last = std::min(total_, first + group_);
      try {
        ChunkScope scope;
        for (int64_t c = first; c < last; ++c) fn_(ctx_, c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker_loop() {
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    uint64_t seen = epoch_of(state_.load());
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      bool fresh = false;
      for (int spins = 0;; ++spins) {
        if (stop_.load(std::memory_order_relaxed)) return;
        if (epoch_of(state_.load(std::memory_order_acquire)) != seen) {
          fresh = true;
          break;
        }
        if ((spins & 15) == 15 && std::chrono::steady_clock::now() - start >
                                      std::chrono::microseconds(kSpinMicroseconds)) {
          break;
        }
        relax();
      }
      if (!fresh) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1);
        while (epoch_of(state_.load()) == seen && !stop_.load()) wake_.wait(lock);
        sleepers_.fetch_sub(1);
        if (stop_.load()) return;
      }
      seen = epoch_of(state_.load(std::memory_order_acquire));
      work();
    }
  }

  void start_workers() {
    const int want = size() - 1;
    while (static_cast<int>(workers_.size()) < want) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      stop_.store(true);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    stop_.store(false);
  }

  std::mutex busy_;  // held by the loop that owns the team (and by set_threads)
  std::atomic<int> size_{0};
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  int64_t group_ = 1, total_ = 0;
  detail::ChunkFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Never destroyed: sleeping workers end with the process, and no static destructor races a late loop.
Team& team() {
  static Team* t = new Team;
  return *t;
}

}  // namespace

void set_threads(int threads) { team().set_threads(threads); }

int threads() { return team().size(); }

bool in_parallel_chunk() { return t_in_chunk; }

namespace detail {
void run(int64_t chunks, ChunkFn fn, const void* ctx) { team().run(chunks, fn, ctx); }
}  // namespace detail

}  // namespace swiftcpp::parallel
