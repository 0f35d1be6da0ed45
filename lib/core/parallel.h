// The library's own thread team for the loops it splits itself (decode GEMVs, decode attention, score rows,
// batched GEMMs, packed weights): a caller that never waits for a thread that has not started.
//
// OpenMP's fork-join (at::parallel_for) hands every thread of the team its share and waits at the end for all of
// them. On a busy machine one of those threads is often not running when the region opens (the scheduler gave
// its core to another process for a slice of milliseconds), and the whole region waits for it: decode ran 2-40x
// slower at two threads than at one beside a busy process. Here the work is cut into chunks that threads claim
// one at a time; the caller claims chunks too, and waits only for chunks another thread has claimed and is
// running. A thread that wakes late finds the chunks gone and goes back to waiting. Idle threads spin for a
// bounded time (kSpinMicroseconds: the next region of a decode layer usually opens within it), then sleep on a
// condition variable, so they burn no core between steps.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace swiftcpp::parallel {

/// How long an idle thread of the team spins on the next job before it sleeps.
inline constexpr int kSpinMicroseconds = 50;

/// Below this many multiply-adds (or comparable element operations) a loop runs on the calling thread: handing
/// work to a second thread costs a few microseconds, about what 64k multiply-adds take on one core.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

/// Sets the team's size (threads including the caller; <= 1: every loop runs on the caller). The workers start
/// when a loop first needs them; a smaller count stops the extra ones. Not to be called while a loop runs.
void set_threads(int threads);

/// The team's size, including the calling thread.
int threads();

/// Whether the calling thread is running a chunk of a loop (loops inside one run on that thread alone).
bool in_parallel_chunk();

namespace detail {
using ChunkFn = void (*)(const void* ctx, int64_t chunk);
/// Runs fn(ctx, c) for every chunk c in [0, chunks) on the team; rethrows the first exception a chunk threw
/// (after every claimed chunk has finished).
void run(int64_t chunks, ChunkFn fn, const void* ctx);
}  // namespace detail

/// Runs fn(c) for every chunk c in [0, chunks), on the team when it has more than one thread and the caller is
/// not itself inside a chunk, else in order on the calling thread. Chunks run in any order and on any thread; fn
/// must not depend on which.
template <typename Fn>
void for_chunks(int64_t chunks, const Fn& fn) {
  if (chunks <= 0) return;
  if (chunks == 1 || threads() <= 1 || in_parallel_chunk()) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  detail::run(
      chunks, [](const void* ctx, int64_t c) { (*static_cast<const Fn*>(ctx))(c); }, &fn);
}

/// Runs fn(i0, i1) over [begin, end) split into ranges. `work_per_item` is the cost of one index in multiply-adds:
/// a range holds at least kMinParallelWork of work (so a small loop runs on the caller in one call), and the loop
/// is cut into about four ranges a thread, so a thread that runs slow takes fewer of them.
template <typename Fn>
void for_range(int64_t begin, int64_t end, int64_t work_per_item, const Fn& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t team = threads();
  const int64_t per_item = work_per_item < 1 ? 1 : work_per_item;
  const int64_t min_items = (kMinParallelWork + per_item - 1) / per_item;
  if (team <= 1 || n < 2 * min_items || in_parallel_chunk()) {
    fn(begin, end);
    return;
  }
  int64_t size = (n + 4 * team - 1) / (4 * team);
  if (size < min_items) size = min_items;
  const int64_t chunks = (n + size - 1) / size;
  for_chunks(chunks, [&](int64_t c) {
    const int64_t i0 = begin + c * size;
    fn(i0, i0 + size < end ? i0 + size : end);
  });
}

}  // namespace swiftcpp::parallel
