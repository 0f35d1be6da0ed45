// Skrull ("Towards Efficient Long Context Fine-tuning through Dynamic Data Scheduling", NeurIPS 2025): which
// data-parallel (DP) rank, which micro-batch and which context-parallel (CP) rank each sequence of one global batch
// goes to. Scheduling moves sequences, never tokens between sequences, so the optimizer step is unchanged as long as
// the loss is normalised over the whole global batch (ranks get unequal token counts).
//
// Pure and deterministic: only the standard library and nlohmann::json, no RNG, no threads, no hash-map order;
// every tie is broken by item id, then rank index. Every rank of a job running the same binary on the same lengths
// computes the identical plan (floating-point comparisons decide some placements, so keep one build per job).
//
// Units: lengths and budgets in tokens, times in seconds, FLOPs as double counts, bandwidth in bytes/s.
// Docs: ../shared/docs/LONG_CONTEXT.md section 3.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace swiftcpp::skrull {

// ---------------------------------------------------------------------------------------------------------------
// Cost model
// ---------------------------------------------------------------------------------------------------------------

/// The parts of a decoder that set its FLOPs. kv_hidden = num_key_value_heads * head_dim.
struct ModelShape {
  int64_t hidden = 0;     // h
  int64_t kv_hidden = 0;  // h_kv
  int64_t layers = 0;
  int64_t vocab = 0;      // 0: the LM head is left out of the FLOPs; else it adds 2*h*vocab per row (forward)

  /// Throws ConfigError when hidden, kv_hidden or layers < 1 or vocab < 0.
  void validate() const;
};

/// Forward FLOPs of one decoder layer for `rows` query tokens attending to `keys` key tokens:
/// (20h^2 + 4h*h_kv) * rows + 4h * rows * keys. A whole sequence of S tokens has rows = keys = S, giving
/// (20h^2 + 4h*h_kv)*S + 4h*S^2; a CP shard of it has rows = ceil(S/N), keys = S.
double layer_forward_flops(const ModelShape& shape, int64_t rows, int64_t keys);

/// Training FLOPs (forward + backward = 3x forward) of `rows` rows over all layers, plus the LM head when
/// shape.vocab > 0: 3 * (layers * layer_forward_flops(rows, keys) + 2*h*vocab*rows).
double training_flops(const ModelShape& shape, int64_t rows, int64_t keys);

/// One measured point of the compute-efficiency curve: `flops_per_s` achieved by a call over `tokens` rows.
struct EfficiencyPoint {
  double tokens = 0;
  double flops_per_s = 0;
};

/// What the cost model knows about a device and its interconnect. Stored as JSON (to_json / from_json) so it can
/// be measured once per machine and reused:
///   {"name": "...", "source": "...",                        (optional strings)
///    "efficiency": [{"tokens": 64, "flops_per_s": 2.0e13}, ...],   (tokens strictly ascending, all > 0)
///    "collective_latency_s": 2e-5, "bandwidth_bytes_per_s": 1e11, "bytes_per_element": 2}
struct DeviceProfile {
  std::string name;
  std::string source;                     // how it was obtained ("measured by ...", "paper constants")
  std::vector<EfficiencyPoint> efficiency;
  double collective_latency_s = 0;        // fixed cost of one collective (all-gather or reduce-scatter)
  double bandwidth_bytes_per_s = 0;       // per-rank collective bandwidth
  double bytes_per_element = 2;           // of the K/V activations that travel (2: bf16)

  /// Throws ConfigError on an empty or unordered curve, non-positive values or a negative latency.
  void validate() const;

  /// Achieved FLOP/s for a call over `tokens` rows: piecewise linear in log(tokens) between the measured points,
  /// clamped to the first/last point outside them. Precondition: validate() passed.
  double flops_per_s(double tokens) const;

  nlohmann::json to_json() const;

  /// Parses the object to_json writes. Throws ConfigError naming `origin` and the key on a missing, unknown or
  /// mistyped key, and whatever validate() throws.
  static DeviceProfile from_json(const nlohmann::json& j, const std::string& origin = "device profile");

  /// Reads a JSON file. Throws IoError when unreadable, FormatError when not JSON, ConfigError as from_json.
  static DeviceProfile load(const std::string& path);
};

/// A synthetic curve flops_per_s(t) = peak * t / (t + half_tokens), sampled at t = 1, 2, 4, ..., 2^22 tokens.
/// Throws ConfigError on non-positive arguments (latency may be 0).
DeviceProfile saturating_profile(double peak_flops_per_s, double half_tokens, double bandwidth_bytes_per_s,
                                 double collective_latency_s, double bytes_per_element, const std::string& name);

/// The constants of LONG_CONTEXT.md's simulation: 400 TFLOP/s peak, half efficiency at 256 tokens per call
/// (flops_per_s(t) = 400e12 * t / (t + 256)), 100 GB/s, 20 us per collective, bf16 K/V.
DeviceProfile paper_profile();

/// Modelled times of items on one CP group. A sequence kept local on one rank costs
///   local(S) = training_flops(S, S) / flops_per_s(S).
/// Distributed over N ranks, each rank computes rows ceil(S/N) against all S keys:
///   shard(S, N) = training_flops(ceil(S/N), S) / flops_per_s(ceil(S/N)).
/// The K/V of the distributed items of one micro-batch are all-gathered in the forward and their gradients
/// reduce-scattered in the backward, per layer:
///   comm = layers * 2 * (k * latency + 2 * R * h_kv * bytes * (N - 1) / N / bandwidth)
/// where R = the distributed rows of the micro-batch and k = the number of collectives per direction: 1 when
/// all distributed items of a micro-batch share one collective (default), their count when
/// collective_per_sequence. comm = 0 when N == 1 or nothing is distributed.
/// On CP rank j of a micro-batch: compute_j = T_local_j + T_dist, busy_j = max(comm, T_local_j) + T_dist (the
/// K/V exchange overlaps the rank's local work), and the micro-batch takes max_j busy_j.
/// An item with begin > 0 (a piece of a chunked sequence) attends to keys = end: rows = end - begin.
/// Every item (or shard) is costed as a call of its own, at the efficiency of its own rows; a runtime that packs
/// a rank's short items into one call runs them faster than this model says, which narrows the gap between
/// keeping short sequences local and sharding them.
/// Methods: precondition validate() passed; rows >= 1, keys >= rows, cp >= 1; results in seconds.
struct CostModel {
  ModelShape shape;
  DeviceProfile device;
  bool collective_per_sequence = false;

  /// Throws ConfigError from shape.validate() or device.validate().
  void validate() const;
  double local_seconds(int64_t rows, int64_t keys) const;
  double shard_seconds(int64_t rows, int64_t keys, int64_t cp) const;
  /// `rows` distributed rows in `items` items over a CP group of `cp` ranks.
  double comm_seconds(int64_t rows, int64_t items, int64_t cp) const;
};

// ---------------------------------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------------------------------

/// A unit the schedulers place: a whole sequence, a truncated one, or one piece of a chunked one.
struct Item {
  int64_t sequence = 0;  // index into the caller's lengths
  int64_t begin = 0;     // tokens [begin, end) of that sequence
  int64_t end = 0;
  int32_t piece = 0;     // 0-based; pieces == 1 unless the sequence was chunked
  int32_t pieces = 1;
  int64_t rows() const { return end - begin; }
};

/// One gradient-accumulation step of one DP rank's CP group of N ranks.
struct MicroBatch {
  std::vector<std::vector<int64_t>> local;  // [N] item ids kept whole on CP rank j
  std::vector<int64_t> distributed;         // item ids sharded over all N CP ranks (each holds ceil(rows/N))
  std::vector<int64_t> load;                // [N] tokens on CP rank j: its local rows + ceil(rows/N) per distributed
};

struct RankPlan {
  std::vector<MicroBatch> micro_batches;  // in run order
  int64_t tokens = 0;                     // rows of every item this DP rank trains
};

struct PlanStats {
  int64_t micro_batches = 0;
  int64_t local = 0;        // items kept whole on one CP rank
  int64_t distributed = 0;  // items sharded over their CP group
  int64_t rollbacks = 0;    // DACP roll-backs: a local item turned distributed to make room
  int64_t gds_raises = 0;   // times GDS raised a DP rank's micro-batch count because DACP failed
  int64_t chunked = 0;      // sequences longer than cp * budget split into pieces
  int64_t truncated = 0;    // sequences longer than cp * budget cut to it
};

/// One global batch's schedule. ids in micro-batches index `items`. Pieces of a chunked sequence all sit on one DP
/// rank, each alone in its own micro-batch, consecutive and in piece order, before that rank's other micro-batches,
/// so the caller can run them as dependent ChunkFlow chunks.
struct Plan {
  std::string scheduler;
  int64_t dp = 0;
  int64_t cp = 0;
  int64_t budget = 0;
  std::vector<Item> items;
  std::vector<RankPlan> ranks;     // [dp]
  std::vector<std::string> notes;  // what was done to sequences no CP group can hold, one line each
  PlanStats stats;
};

/// The whole plan as JSON (for logs and for comparing plans).
nlohmann::json plan_to_json(const Plan& plan);

// ---------------------------------------------------------------------------------------------------------------
// Schedulers
// ---------------------------------------------------------------------------------------------------------------

enum class Scheduler {
  kSkrull,         // "skrull": cost-aware DACP (longest first, local only when it lowers the modelled time) + GDS
  kSkrullPaper,    // "skrull_paper": DACP and GDS as published
  kRoundRobin,     // "round_robin": sequences dealt to DP ranks in order, every one context-parallel
  kSorted,         // "sorted": LongAlign's sorted batching, every sequence context-parallel
  kFlopsBalanced,  // "flops_balanced": DP ranks balanced by FLOPs (largest first), every sequence context-parallel
};

/// Throws ConfigError listing the valid names.
Scheduler parse_scheduler(const std::string& name);
const char* scheduler_name(Scheduler s);
/// All schedulers in the order above.
const std::vector<Scheduler>& all_schedulers();

/// What happens to a sequence longer than cp * budget, which no CP group can hold.
enum class OverBudget {
  kChunk,     // "chunk": pieces of at most cp * budget tokens (the last shorter), trained as dependent chunks
  kTruncate,  // "truncate": cut to cp * budget tokens
};

/// Throws ConfigError listing the valid names.
OverBudget parse_over_budget(const std::string& name);

struct ScheduleOptions {
  Scheduler scheduler = Scheduler::kSkrull;
  int64_t dp = 1;      // data-parallel ranks
  int64_t cp = 1;      // N: ranks of one context-parallel group
  int64_t budget = 0;  // C: tokens one rank holds in one micro-batch
  OverBudget over_budget = OverBudget::kChunk;
  // skrull only. true: the local side of the objective is also bounded below by the balanced finish
  // (sum_j T_local_j + local time of the micro-batch's items not yet placed) / N, so the first long items are not
  // sharded merely because a still-empty rank would become the maximum. false: the bare greedy objective of
  // LONG_CONTEXT.md, which shards everything when communication is free (see bench/skrull_model.cpp).
  bool lookahead = true;

  /// Throws ConfigError when dp, cp or budget < 1.
  void validate() const;
};

/// Schedules one global batch. `lengths[i]` is sequence i's token count (>= 1). Every scheduler guarantees: every
/// token of every sequence (or of its truncation) is in exactly one item, every item in exactly one micro-batch;
/// no CP rank holds more than `budget` tokens in any micro-batch; an item longer than `budget` is never local.
///
/// - skrull_paper. GDS: items bin-packed across DP ranks, largest modelled rank-seconds first onto the DP rank with
///   the least total (an item's rank-seconds: local(S) if S <= C, else N * shard(S, N)). Per DP rank: sort
///   ascending, m = ceil(sum / (C*N)), micro-batch j gets sorted items j, j+m, j+2m, ...; m is raised until DACP
///   places every micro-batch. DACP, ascending: keep the item local on the CP rank with the least local modelled
///   time (ties: fewer tokens, lower index) if it fits, else on the rank with the most free tokens (ties: lower
///   index) if it fits; else shard it if the rank with the
///   least free tokens still has ceil(S/N); else roll back the longest local item S' on that rank that can be
///   rolled back (it gets back S' - ceil(S'/N) > 0 tokens, every other rank is charged ceil(S'/N), all must still
///   fit) and retry; fail when none can be. Only roll-backs of accepted micro-batches count in PlanStats.
/// - skrull. The same GDS; its DACP goes longest first and keeps an item local (on the fitting CP rank with the
///   least local time, ties: fewer tokens, lower index) only when that gives a strictly lower objective
///   max_j[max(comm, T_local_j)] + T_dist than sharding it (with options.lookahead, each side's local part is
///   first raised to its balanced floor, see ScheduleOptions); when neither placement fits it rolls back as above.
/// - round_robin: unit k (a sequence, or all pieces of a chunked one, in sequence order) to DP rank k % dp;
///   micro-batches filled in that order (a new one when the next item's ceil(S/N) does not fit).
///   sorted (LongAlign): units sorted ascending by tokens (ties: sequence id), cut into dp contiguous runs of equal
///   count (the first count % dp runs one longer), rank d taking run d; micro-batches filled in that order.
///   flops_balanced: largest training FLOPs first onto the DP rank with the fewest; per DP rank micro-batches
///   first-fit decreasing by ceil(S/N). All three shard every item.
///
/// Pieces of a chunked sequence travel together: one DP rank (by the scheduler's own rule; skrull and
/// flops_balanced weigh the unit by the sum of its pieces), one micro-batch each.
/// Throws ConfigError from options.validate(), cost.validate(), or when a length is < 1 (naming its index).
Plan schedule(const std::vector<int64_t>& lengths, const ScheduleOptions& options, const CostModel& cost);

// ---------------------------------------------------------------------------------------------------------------
// Modelled step
// ---------------------------------------------------------------------------------------------------------------

/// A plan's modelled optimizer step. Global GPU g = dp_rank * cp + cp_rank. The DP gradient all-reduce, equal for
/// every scheduler, is left out.
struct ModelledStep {
  std::vector<double> compute_s;  // [dp*cp] modelled compute of GPU g summed over its micro-batches
  std::vector<double> busy_s;     // [dp*cp] compute plus the communication not hidden behind local work
  std::vector<double> flops;      // [dp*cp] training FLOPs of GPU g
  std::vector<double> dp_time_s;  // [dp] sum over the rank's micro-batches of max_j busy_j
  double step_s = 0;              // max over DP ranks of dp_time_s
  double max_compute_s = 0;
  double mean_compute_s = 0;
  double max_over_mean_compute() const { return mean_compute_s > 0 ? max_compute_s / mean_compute_s : 0.0; }
};

/// Models `plan` with the formulas of CostModel. `lengths` are the ones the plan was made from. Throws Error when
/// the plan does not match them (an item outside its sequence, an id out of range, a wrong number of CP ranks),
/// ConfigError from cost.validate().
ModelledStep model_step(const Plan& plan, const std::vector<int64_t>& lengths, const CostModel& cost);

/// The same with the cost model spelled out.
ModelledStep model_step(const Plan& plan, const std::vector<int64_t>& lengths, const ModelShape& shape,
                        const DeviceProfile& device, bool collective_per_sequence = false);

// ---------------------------------------------------------------------------------------------------------------
// Synthetic workloads
// ---------------------------------------------------------------------------------------------------------------

/// LONG_CONTEXT.md's length distributions.
enum class Distribution {
  kWikipediaZh,     // "wikipedia_zh"
  kLmsysChat1M,     // "lmsys_chat_1m"
  kChatQA2LongSft,  // "chatqa2_long_sft"
};

/// Throws ConfigError listing the valid names.
Distribution parse_distribution(const std::string& name);
const char* distribution_name(Distribution d);

/// `count` lengths: a bucket picked by the published shares (edges 32, 1K, 4K, 8K, 32K, 128K and the longest
/// sequence, K = 1024; the first bucket starts at 32 tokens), then a length log-uniform inside it, then divided by
/// `scale` (rounded, at least 1). Uses its own splitmix64 generator seeded with `seed`, so the sequence is the same
/// on every standard library. Throws ConfigError when count < 0 or scale < 1.
std::vector<int64_t> sample_lengths(Distribution dist, int64_t count, uint64_t seed, int64_t scale = 1);

}  // namespace swiftcpp::skrull
