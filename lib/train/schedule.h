// Skrull scheduling in training: which samples of one global batch each data-parallel rank trains, in which
// micro-batch (lib/distributed/skrull.h decides; this file feeds it the model's shape and a device profile measured on
// the machine at hand, and turns its plan into packed micro-batches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/comm.h"
#include "distributed/skrull.h"
#include "models/decoder/config.h"

namespace swiftcpp {

class Trainer;

/// The cost model's view of a decoder: h, h_kv = num_key_value_heads * head_dim, layers, and the vocabulary (the
/// LM head's FLOPs are counted: on small models they are a large share).
skrull::ModelShape model_shape(const DecoderConfig& config);

/// Measures the device profile of the machine at hand for `trainer`'s model:
/// - efficiency curve: forward + backward of one packed row of t random tokens, t = 16, 32, ... up to
///   `max_tokens` (and max_tokens itself), median of `repeats` timed passes after one warm-up, FLOP/s =
///   skrull::training_flops(shape, t, t) / seconds;
/// - with `comm` (several processes): the collective latency (median all-gather of one float) and the per-rank
///   bandwidth (all-gather of 1 MiB per rank: bytes * (N - 1) / (seconds - latency)); one process: latency 0 and
///   bandwidth 1e12 (nothing travels).
/// A collective when `comm` is set: every rank calls it; the curve is rank 0's, sent to the others, so that every
/// rank plans with the same numbers. Gradients are cleared afterwards; weights are not changed.
skrull::DeviceProfile measure_device_profile(Trainer& trainer, dist::Communicator* comm, int64_t max_tokens,
                                             int repeats = 3);

/// The scheduling of one run: options (scheduler, DP ranks, CP ranks per group, the tokens one rank holds per
/// micro-batch) and the cost model.
struct GlobalBatchScheduler {
  skrull::ScheduleOptions options;
  skrull::CostModel cost;

  /// The plan of one global batch whose sample i has lengths[i] tokens.
  skrull::Plan plan(const std::vector<int64_t>& lengths) const;

  /// One micro-batch of one rank: the samples it keeps whole (positions into the lengths the plan was made from)
  /// and those sharded over its CP group, of which it trains its own shard (none when the group is one rank: the
  /// plan's distributed samples are then whole).
  struct Work {
    std::vector<size_t> local;
    std::vector<size_t> sharded;
  };

  /// The micro-batches of CP rank `cp_rank` of DP rank `dp_rank`, in the plan's order. Throws Error when the plan
  /// chunked or truncated a sample (the trainer's budgets hold every sample, so this means a caller's bug).
  static std::vector<Work> micro_batches_of(const skrull::Plan& plan, int dp_rank, int cp_rank);
};

}  // namespace swiftcpp
