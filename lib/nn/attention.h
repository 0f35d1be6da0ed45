// Scaled dot-product attention with grouped K/V heads, explicit masks and a preallocated KV cache.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <utility>
#include <vector>

namespace swiftcpp::nn {

/// Which attention kernel runs: the explicit matmul/softmax path (every LibTorch) or
/// at::scaled_dot_product_attention (LibTorch 2.x only).
enum class AttentionBackend { kAuto, kMath, kSdpa };

/// True when this build's LibTorch has scaled_dot_product_attention.
bool sdpa_available();

/// Sets the backend used by attention() process-wide; kAuto picks SDPA where available. Throws
/// ConfigError when kSdpa is asked for on a LibTorch without it.
void set_attention_backend(AttentionBackend backend);

/// How raw attention scores are formed before the mask: s = q k^T * scale, then, with softcap > 0,
/// softcap * tanh(s / softcap) (Gemma 2's attn_logit_softcapping).
struct ScoreOptions {
  double scale = 0;    // 0: 1 / sqrt(Dh)
  double softcap = 0;  // 0: no cap
  bool plain() const { return scale == 0 && softcap == 0; }
};

/// softmax(q k^T / sqrt(Dh) + mask) v with K/V heads shared by groups of query heads (scores as `score` says).
/// q: [B, H, T, Dh], k/v: [B, Hkv, S, Dh] (H a multiple of Hkv),
/// mask: undefined (attend to all S keys) or bool [B or 1, 1, T, S], true where a query may attend.
/// Softmax runs in float32 and is cast back, as Hugging Face's eager attention does.
/// Returns [B, H, T, Dh].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     const ScoreOptions& score = {});

/// The same attention with keys and values given as consecutive blocks along S (for example the stored K/V of
/// earlier chunks of a sequence followed by a chunk's own), never concatenated, and a backward that recomputes
/// the probabilities from q, k and the saved log-sum-exp instead of keeping them: per layer it keeps q, the K/V
/// blocks, the output and [B, H, T] statistics, not the [B, H, T, S] probabilities. Queries run in row blocks
/// sized so one block's scores stay under `workspace_elements` (at least 16 rows), so the transient workspace
/// does not grow with T either. q: [B, H, T, Dh]; keys/values: blocks [B, Hkv, S_i, Dh]; mask as attention()
/// takes it over S = sum S_i. Returns [B, H, T, Dh]; differentiable in q and every block.
at::Tensor attention_blocks(const at::Tensor& q, at::TensorList keys, at::TensorList values, const at::Tensor& mask,
                            int64_t workspace_elements = int64_t{1} << 23, const ScoreOptions& score = {});

/// Whether attention_blocks with a mask and one key block tiles each batch row separately over just the keys its
/// queries may see (causal future, other packed samples, padding skipped), or runs the whole batch as one tile with
/// the masked scores computed (cheaper where tiles would be small: heads x min(128, T) x S under 2^18).
bool attention_tiles_per_row(int64_t heads, int64_t queries, int64_t keys);

/// Whether attention() itself uses the recomputing kernel of attention_blocks while autograd records (training on
/// the math backend); on by default. Process-wide.
void set_recompute_attention(bool on);

/// Heads of at most this many dimensions train (attention_blocks, float32 on the CPU, no score cap) with row
/// kernels that never form the [T, S] scores (kernels::attention_rows_forward/backward).
inline constexpr int64_t kSmallHeadDim = 32;
/// The largest head dimension that takes the small-head path (default kSmallHeadDim; 0: none, every head takes
/// the score GEMMs). Process-wide; for tests and benchmarks.
void set_small_head_dim(int64_t max_dim);
int64_t small_head_dim();

/// attention() forms the whole [B, H, T, S] scores at once only up to this many of them (16 MiB of float32); past it
/// the queries run in row blocks (attention_blocks' forward: workspace under 2^23 scores, the small-head row kernels
/// where they apply), so memory stays linear in the sequence: a vision tower's tens of thousands of patches, a long
/// prefill. Decode steps (kernels over the cache) and the SDPA backend are unaffected.
inline constexpr int64_t kMaxWholeScores = int64_t{1} << 22;
/// The score count past which attention() runs in row blocks (default kMaxWholeScores; at least 1). Process-wide; for
/// tests and benchmarks.
void set_max_whole_scores(int64_t scores);
int64_t max_whole_scores();

/// Context parallelism: one rank's shard of a sequence sharded over a group of ranks, at positions
/// [past_length, past_length + T) of it. In every layer the shard's K/V are exchanged with the group's.
class KVExchange {
 public:
  virtual ~KVExchange() = default;
  /// k, v: [B, Hkv, T, Dh] of this shard -> the K/V of positions [0, past_length + T) from every shard of the
  /// group, differentiable: in backward the gradients of the other shards' K/V travel back to their ranks. A
  /// collective: every rank of the group calls it for the same layers in the same order.
  virtual std::pair<at::Tensor, at::Tensor> exchange(const at::Tensor& k, const at::Tensor& v, int64_t layer) = 0;
};

/// K/V of the earlier chunks of a split sequence and the K/V one chunk produces (ChunkFlow): a dependent chunk's
/// queries attend to `past_*` blocks, then causally to their own keys. With `exchange` (context parallelism) the
/// earlier positions' K/V come from the other ranks of the group in each layer instead, and past_* stay empty.
struct ChunkKV {
  std::vector<std::vector<at::Tensor>> past_keys, past_values;  // per layer: blocks [B, Hkv, S_i, Dh], in order
  int64_t past_length = 0;                                      // sum of S_i (the shard's offset with `exchange`)
  std::vector<at::Tensor> keys, values;                         // per layer, set by the forward: [B, Hkv, T, Dh]
  KVExchange* exchange = nullptr;
};

/// Per-layer key/value storage allocated once for `capacity` positions.
///
/// Two ways to use it. Shared length: the batch's rows are storage rows [0, B), all filled to `length`, and new
/// K/V go to positions [length, length + T). Per-row (continuous batching, `rows` non-empty): the forward's batch
/// row b is storage row rows[b], filled to lengths[b] positions; its T new K/V go to [lengths[b], lengths[b] + T)
/// and it attends to its own keys only. The forward advances `length` or every lengths[b] by T.
struct KVCache {
  std::vector<at::Tensor> keys;    // per layer [rows, Hkv, capacity, Dh]
  std::vector<at::Tensor> values;  // per layer [rows, Hkv, capacity, Dh]
  int64_t length = 0;              // positions filled so far (shared-length use)
  std::vector<int64_t> rows;       // per-row use: the storage row of each batch row
  std::vector<int64_t> lengths;    // per-row use: positions filled in each batch row's storage row
  /// M-RoPE (Qwen2-VL): per storage row, what later tokens add to their position counted in real tokens (the
  /// cache index, or the explicit positions of a caller that pads): images take fewer positions than tokens
  /// (Hugging Face's rope_deltas, for rows without padding). Set by the forward that fills a row from index 0;
  /// shorter than the storage means 0.
  std::vector<int64_t> position_offsets;

  /// Allocates zeroed storage for `layers` layers on `options`' device and dtype.
  KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          const at::TensorOptions& options);
  int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
  bool per_row() const { return !rows.empty(); }
  /// Per-row use: positions a forward of T new tokens attends over, max(lengths) + T.
  int64_t span(int64_t new_tokens) const;

  /// Per-row use: writes layer `layer`'s new k, v [B, Hkv, T, Dh] at each row's positions and returns the keys and
  /// values the batch attends to, [B, Hkv, span(T), Dh] (a view of the storage when the rows are consecutive, a
  /// gathered copy otherwise). Positions past a row's own length hold stale or zero values: the mask hides them.
  std::pair<at::Tensor, at::Tensor> write_rows(int64_t layer, const at::Tensor& k, const at::Tensor& v);
};

/// Per-row KV cache mask [B, 1, T, S] for T new queries per row, row b's at positions [lengths[b], lengths[b] + T)
/// over S keys: causal within the row, keys past the row's own length hidden, and the sliding window (0 = none).
at::Tensor build_row_mask(const std::vector<int64_t>& lengths, int64_t new_tokens, int64_t keys, int64_t window,
                          const at::Device& device);

/// Builds the boolean attention mask [B, 1, T, S] for T new queries at cache positions
/// [past, past + T) over S = past + T keys: causal, key padding (`key_valid` [B, S] bool, may be
/// undefined), packed samples (`segment_ids` [B, S] int64, may be undefined: a query sees only keys of its own
/// segment, so packed samples never see each other) and an optional sliding window (0 = none; a query sees keys
/// fewer than `window` behind it). Returns an undefined tensor when every query may see every key (a lone decode
/// step without padding).
at::Tensor build_attention_mask(int64_t batch, int64_t past, int64_t new_tokens, const at::Tensor& key_valid,
                                int64_t window, const at::Device& device, const at::Tensor& segment_ids = {});

}  // namespace swiftcpp::nn
