#include "nn/attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "nn/gemm.h"
#include "nn/kernels.h"

namespace swiftcpp::nn {

namespace {
std::atomic<AttentionBackend> g_backend{AttentionBackend::kAuto};
std::atomic<bool> g_recompute{true};
std::atomic<int64_t> g_small_head_dim{kSmallHeadDim};
std::atomic<int64_t> g_max_whole_scores{kMaxWholeScores};
// The transient scores of one query-row block of attention_blocks (2^23 float32, 32 MiB).
constexpr int64_t kBlockWorkspace = int64_t{1} << 23;

// Explicit path. Query heads of one K/V group are laid side by side so one batched matmul per group serves
// them all without copying K/V: q [B, Hkv, G*T, Dh] @ k^T [B, Hkv, Dh, S].
at::Tensor attention_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          const ScoreOptions& score) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), G = H / Hkv;
  const at::Tensor qg = q.contiguous().view({B, Hkv, G * T, Dh});
  at::Tensor scores = at::matmul(qg, k.transpose(-1, -2));  // [B, Hkv, G*T, S]
  if (score.scale == 0) {
    scores.div_(std::sqrt(static_cast<double>(Dh)));
  } else {
    scores.mul_(score.scale);
  }
  if (score.softcap > 0) {  // as Gemma 2's eager path; out of place under autograd (tanh's backward keeps its output)
    scores = at::GradMode::is_enabled() ? at::tanh(scores / score.softcap) * score.softcap
                                        : scores.div_(score.softcap).tanh_().mul_(score.softcap);
  }
  if (mask.defined()) {
    // mask [B|1, 1, T, S] -> [B|1, 1, 1, T, S] against scores viewed [B, Hkv, G, T, S]
    const at::Tensor blocked = mask.logical_not().unsqueeze(1);
    scores = scores.view({B, Hkv, G, T, S})
                 .masked_fill(blocked, -std::numeric_limits<double>::infinity())
                 .view({B, Hkv, G * T, S});
  }
  // Every query sees at least its own key (build_attention_mask guarantees it), so no row is all -inf.
  const auto softmax_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor probs = at::softmax(scores, -1, softmax_dtype).to(q.scalar_type());
  return at::matmul(probs, v).view({B, H, T, Dh});
}

// Decode steps (a few queries per row, float32, CPU, no autograd) over K/V whose rows are contiguous (the cache's
// views): per (row, head, query) the scores are one GEMV over the keys and the output one pass over the values,
// with no intermediate tensors. The same operations as attention_math in another summation order.
constexpr int64_t kDecodeQueries = 16;
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const auto contiguous_rows = [&](const at::Tensor& t) { return t.stride(3) == 1 && t.stride(2) == q.size(3); };
  const auto dtype = q.scalar_type();
  return !at::GradMode::is_enabled() && q.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
         k.scalar_type() == dtype && v.scalar_type() == dtype && q.size(2) <= kDecodeQueries &&
         contiguous_rows(k) && contiguous_rows(v) && k.size(3) == q.size(3) &&
         (!mask.defined() || (mask.dim() == 4 && mask.size(2) == q.size(2) && mask.size(3) == k.size(2)));
}

at::Tensor attention_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            const ScoreOptions& score) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
  const int64_t S = k.size(2), G = H / k.size(1);
  // bfloat16: scores, softmax and sums in float32 from the bfloat16 values, the output rounded once.
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  const at::Tensor qc = q.to(at::kFloat).contiguous();
  const at::Tensor m = mask.defined() ? mask.to(at::kBool).contiguous() : at::Tensor();  // [B|1, 1, T, S]
  at::Tensor out = at::zeros({B, H, T, Dh}, q.options().dtype(at::kFloat));
  const float* qp = qc.data_ptr<float>();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  const int64_t item = k.element_size();
  const bool* mp = m.defined() ? m.data_ptr<bool>() : nullptr;
  float* op = out.data_ptr<float>();
  const float root = std::sqrt(static_cast<float>(Dh)), scale = static_cast<float>(score.scale);
  const float cap = static_cast<float>(score.softcap);
  parallel::for_range(0, B * H, 2 * T * S * Dh, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(S));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, h = i % H;
      const char* kh = kp + (b * k.stride(0) + (h / G) * k.stride(1)) * item;  // [S, Dh]
      const char* vh = vp + (b * v.stride(0) + (h / G) * v.stride(1)) * item;  // [S, Dh]
      for (int64_t t = 0; t < T; ++t) {
        const float* qrow = qp + ((b * H + h) * T + t) * Dh;
        if (bf16) {  // q . k_j
          kernels::gemv_bf16(reinterpret_cast<const uint16_t*>(kh), Dh, qrow, Dh, 1, p.data(), S, 0, S);
        } else {
          kernels::gemv_f32(reinterpret_cast<const float*>(kh), Dh, qrow, Dh, 1, p.data(), S, 0, S);
        }
        const bool* allowed = mp == nullptr ? nullptr : mp + ((m.size(0) == 1 ? 0 : b) * T + t) * S;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          float s = scale == 0 ? p[j] / root : p[j] * scale;
          if (cap > 0) s = std::tanh(s / cap) * cap;
          if (allowed != nullptr && !allowed[j]) s = -std::numeric_limits<float>::infinity();
          p[j] = s;
          top = std::max(top, s);
        }
        float sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          p[j] = std::exp(p[j] - top);
          sum += p[j];
        }
        for (int64_t j = 0; j < S; ++j) p[j] /= sum;
        float* orow = op + ((b * H + h) * T + t) * Dh;
        if (bf16) {
          kernels::accumulate_rows_bf16(p.data(), reinterpret_cast<const uint16_t*>(vh), Dh, S, Dh, orow);
        } else {
          kernels::accumulate_rows(p.data(), reinterpret_cast<const float*>(vh), Dh, S, Dh, orow);
        }
      }
    }
  });
  return out.to(q.scalar_type());
}

// Softmax statistics and products run in float32 for float32/bf16/fp16 inputs, float64 for float64.
at::ScalarType accumulate_dtype(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Rows of one query block, grouped as attention_math groups them: q [B, H, T, Dh] -> [B, Hkv, G*rows, Dh].
at::Tensor query_rows(const at::Tensor& x, int64_t Hkv, int64_t first, int64_t rows) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), Dh = x.size(3);
  return x.view({B, Hkv, H / Hkv, T, Dh}).narrow(3, first, rows).reshape({B, Hkv, (H / Hkv) * rows, Dh});
}

// Masked, scaled (and capped) scores of one query block against every key block: [B, Hkv, G*rows, S] in the
// accumulate dtype. With a cap and `cap_slope`, also d(capped)/d(scaled) = 1 - tanh^2, taken before masking.
at::Tensor block_scores(const at::Tensor& qb, at::TensorList keys, const at::Tensor& mask, int64_t G, int64_t first,
                        int64_t rows, double scale, double softcap, at::ScalarType acc, at::Tensor* cap_slope = nullptr) {
  std::vector<at::Tensor> parts;
  parts.reserve(keys.size());
  for (const auto& k : keys) parts.push_back(nn::bmm(qb, k.transpose(-1, -2)));
  at::Tensor scores = (parts.size() == 1 ? parts[0] : at::cat(parts, -1)).to(acc).mul_(scale);
  if (softcap > 0) {
    scores.div_(softcap).tanh_();
    if (cap_slope != nullptr) *cap_slope = 1 - scores.square();
    scores.mul_(softcap);
  }
  if (mask.defined()) {
    const int64_t B = scores.size(0), Hkv = scores.size(1), S = scores.size(3);
    // mask [B|1, 1, T, S] -> rows [B|1, 1, 1, rows, S] against scores [B, Hkv, G, rows, S]
    const at::Tensor blocked = mask.narrow(2, first, rows).logical_not().unsqueeze(1);
    scores.view({B, Hkv, G, rows, S}).masked_fill_(blocked, -std::numeric_limits<double>::infinity());
  }
  return scores;
}

int64_t rows_per_block(int64_t B, int64_t H, int64_t T, int64_t S, int64_t workspace) {
  const int64_t per_row = std::max<int64_t>(1, B * H * S);
  return std::min(T, std::max<int64_t>(16, workspace / per_row));
}

// Query rows per block when blocks skip the keys no query of theirs may see: small enough that a causal block's
// keys stop near its last query, large enough for the products to stay efficient.
constexpr int64_t kSkipRows = 128;
// Per-row tiles pay a handful of operations each; below this many scores a tile (heads x rows x keys) one tile over
// the whole batch with the masked scores computed runs faster. Measured on the Qwen2-VL demo's training step
// (8 heads of 8, 16 rows of about 140 tokens, 150K scores a per-row tile): the batch in one tile ran the step 15%
// faster.
constexpr int64_t kMinSplitTile = int64_t{1} << 18;

// Per query block of R rows and batch row of B: the keys [lo, hi) some query of the block may see (mask [B|1, 1, T, S]
// bool), as [blocks, B, 2] int64 on the CPU; the whole [0, S) where a block's queries see no key at all. One pass
// with memchr/memrchr over each query's mask row, which stop at the first / last key it sees.
at::Tensor visible_key_ranges(const at::Tensor& mask, int64_t B, int64_t R) {
  const at::Tensor m = mask.to(at::kCPU, at::kBool).contiguous();
  const int64_t T = m.size(2), S = m.size(3), blocks = (T + R - 1) / R;
  at::Tensor ranges = at::empty({blocks, B, 2}, at::kLong);
  int64_t* out = ranges.data_ptr<int64_t>();
  const auto* bytes = reinterpret_cast<const unsigned char*>(m.data_ptr<bool>());
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t b = 0; b < B; ++b) {
      int64_t lo = S, hi = 0;
      for (int64_t t = blk * R; t < std::min(T, (blk + 1) * R); ++t) {
        const unsigned char* row = bytes + ((m.size(0) == 1 ? 0 : b) * T + t) * S;
        if (const void* first = std::memchr(row, 1, static_cast<size_t>(lo))) {
          lo = static_cast<const unsigned char*>(first) - row;
        }
        if (const void* last = memrchr(row + hi, 1, static_cast<size_t>(S - hi))) {
          hi = static_cast<const unsigned char*>(last) - row + 1;
        }
      }
      if (lo >= hi) lo = 0, hi = S;
      out[(blk * B + b) * 2] = lo;
      out[(blk * B + b) * 2 + 1] = hi;
    }
  }
  return ranges;
}

// One tile of work: batch rows [b0, b0 + nb) against key positions [lo, lo + len) of a single key block, or every
// key block whole (split == false).
struct Tile {
  int64_t b0, nb, lo, len;
  bool split;
};

// The tiles of query block `block`: one for the whole batch and every key, or (one key block and a mask) one per
// batch row over just the keys its block's queries may see (ranges from visible_key_ranges).
std::vector<Tile> tiles_of(const at::Tensor& ranges, int64_t block, int64_t B, int64_t S) {
  if (!ranges.defined()) return {Tile{0, B, 0, S, false}};
  std::vector<Tile> tiles;
  const int64_t* r = ranges.data_ptr<int64_t>() + block * B * 2;
  for (int64_t b = 0; b < B; ++b) tiles.push_back(Tile{b, 1, r[2 * b], r[2 * b + 1] - r[2 * b], true});
  return tiles;
}

// The tile's key (or value) blocks and mask: narrowed to its batch rows and key range.
std::vector<at::Tensor> tile_blocks(at::TensorList blocks, const Tile& t) {
  std::vector<at::Tensor> out;
  for (const auto& k : blocks) {
    const at::Tensor rows = k.narrow(0, t.b0, t.nb);
    out.push_back(t.split ? rows.narrow(2, t.lo, t.len) : rows);
  }
  return out;
}
at::Tensor tile_mask(const at::Tensor& mask, const Tile& t) {
  if (!mask.defined()) return mask;
  const at::Tensor rows = mask.size(0) == 1 ? mask : mask.narrow(0, t.b0, t.nb);
  return t.split ? rows.narrow(3, t.lo, t.len) : rows;
}

// Whether the fused row kernels (kernels::softmax_row, softmax_backward_row) run the softmax and its backward:
// float32 products on the CPU without a score cap. Elsewhere the tensor operations of block_scores run.
bool fused_softmax(const at::Tensor& q, at::ScalarType acc, double softcap) {
  return q.device().is_cpu() && acc == at::kFloat && softcap == 0;
}

// a . b_i^T for every block b_i, side by side: [nb, Hkv, R, sum S_i] float32, contiguous (a [nb, Hkv, R, Dh]).
at::Tensor products(const at::Tensor& a, at::TensorList blocks) {
  std::vector<at::Tensor> parts;
  parts.reserve(blocks.size());
  for (const auto& b : blocks) parts.push_back(nn::bmm(a, b.transpose(-1, -2)));
  return (parts.size() == 1 ? parts[0] : at::cat(parts, -1)).contiguous();
}

// Runs fn(i, mask_row) for every row i of a tile's scores [t.nb, Hkv, G*rows, width] (row-major), spread over the
// threads; mask_row: the `width` mask bytes of that row's query over the tile's keys (mask: contiguous bool
// [B|1, 1, T, S]), null without a mask.
template <typename Fn>
void for_each_score_row(int64_t Hkv, int64_t G, int64_t rows, int64_t width, const at::Tensor& mask,
                        const Tile& t, int64_t first, const Fn& fn) {
  const int64_t per_batch_row = Hkv * G * rows, total = t.nb * per_batch_row;
  const bool* m = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t T = mask.defined() ? mask.size(2) : 0, S = mask.defined() ? mask.size(3) : 0;
  const int64_t lo = t.split ? t.lo : 0;
  const bool shared = mask.defined() && mask.size(0) == 1;
  parallel::for_range(0, total, 4 * width, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const bool* row = nullptr;
      if (m != nullptr) {
        const int64_t b = shared ? 0 : t.b0 + i / per_batch_row;
        row = m + (b * T + first + i % rows) * S + lo;
      }
      fn(i, row);
    }
  });
}

// Training attention of small heads (kernels::attention_rows_*): float32 on the CPU without a score cap, head
// dimension at most small_head_dim(). There a score GEMM does Dh multiply-adds per score it writes, and the step is
// spent moving [T, S] score and gradient matrices through memory; the row kernels keep a KV head's keys and values
// in L1 and never form them.
bool small_head_rows(const at::Tensor& q, at::TensorList keys, at::TensorList values, double softcap) {
  if (!q.device().is_cpu() || q.scalar_type() != at::kFloat || softcap != 0 || q.size(3) > g_small_head_dim.load()) {
    return false;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].scalar_type() != at::kFloat || values[i].scalar_type() != at::kFloat) return false;
  }
  return true;
}

// Keys or values as one transposed block per (batch row, KV head): blocks [B, Hkv, S_i, Dh] -> [B, Hkv, Dh, S].
at::Tensor transposed_blocks(at::TensorList blocks) {
  const at::Tensor all = blocks.size() == 1 ? blocks[0] : at::cat(blocks, 2);
  return all.transpose(2, 3).contiguous();
}

// The row kernels' view of (batch row b, KV head h): q [B, H, T, Dh] and kt, vt [B, Hkv, Dh, S] contiguous,
// mask bytes [B|1, 1, T, S] contiguous or undefined.
kernels::AttentionRows small_head_view(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& vt,
                                       const at::Tensor& mask, int64_t b, int64_t h, double scale) {
  const int64_t H = q.size(1), T = q.size(2), Dh = q.size(3), Hkv = kt.size(1), S = kt.size(3), G = H / Hkv;
  kernels::AttentionRows a;
  a.q = q.data_ptr<float>() + (b * H + h * G) * T * Dh;
  a.rows = G * T;
  a.T = T;
  a.kt = kt.data_ptr<float>() + (b * Hkv + h) * Dh * S;
  a.vt = vt.data_ptr<float>() + (b * Hkv + h) * Dh * S;
  a.S = S;
  a.Dh = Dh;
  a.scale = static_cast<float>(scale);
  a.mask = mask.defined() ? mask.data_ptr<bool>() + (mask.size(0) == 1 ? 0 : b) * T * S : nullptr;
  return a;
}

class BlockAttention : public torch::autograd::Function<BlockAttention> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, at::TensorList keys,
                            at::TensorList values, const c10::optional<at::Tensor>& mask_arg, int64_t workspace,
                            double score_scale, double softcap) {
    const at::Tensor mask = mask_arg.has_value() ? *mask_arg : at::Tensor();
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
    const int64_t Hkv = keys[0].size(1), G = H / Hkv;
    int64_t S = 0;
    for (const auto& k : keys) S += k.size(2);
    const auto acc = accumulate_dtype(q);
    const double scale = score_scale != 0 ? score_scale : 1.0 / std::sqrt(static_cast<double>(Dh));
    if (small_head_rows(q, keys, values, softcap)) {
      const at::Tensor qc = q.contiguous(), kt = transposed_blocks(keys), vt = transposed_blocks(values);
      const at::Tensor mask_bytes = mask.defined() ? mask.to(at::kBool).contiguous() : at::Tensor();
      at::Tensor out = at::empty({B, H, T, Dh}, q.options());
      at::Tensor lse = at::empty({B, Hkv, G, T}, q.options());
      float* op = out.data_ptr<float>();
      float* lp = lse.data_ptr<float>();
      parallel::for_range(0, B * Hkv, 2 * G * T * S * Dh, [&](int64_t i0, int64_t i1) {
        std::vector<float> scratch(static_cast<size_t>(S));
        for (int64_t i = i0; i < i1; ++i) {
          const kernels::AttentionRows a = small_head_view(qc, kt, vt, mask_bytes, i / Hkv, i % Hkv, scale);
          kernels::attention_rows_forward(a, op + i * G * T * Dh, lp + i * G * T, scratch.data());
        }
      });
      std::vector<at::Tensor> saved = {q, out, lse};
      saved.insert(saved.end(), keys.begin(), keys.end());
      saved.insert(saved.end(), values.begin(), values.end());
      ctx->save_for_backward(saved);
      ctx->saved_data["blocks"] = static_cast<int64_t>(keys.size());
      ctx->saved_data["small_heads"] = true;
      ctx->saved_data["scale"] = scale;
      ctx->saved_data["has_mask"] = mask.defined();
      if (mask.defined()) ctx->saved_data["mask"] = mask_bytes;
      return out;
    }
    // With one key block and a mask, each batch row's query blocks skip the keys none of their queries may see
    // (causal future, other packed samples, padding): scores and products over visible keys only.
    const bool split = mask.defined() && keys.size() == 1 && attention_tiles_per_row(H, T, S);
    const int64_t R = split ? std::min(kSkipRows, rows_per_block(1, H, T, S, workspace))
                            : rows_per_block(B, H, T, S, workspace);
    const at::Tensor ranges = split ? visible_key_ranges(mask, B, R) : at::Tensor();  // [blocks, B, 2]
    // Products in the accumulate dtype (float32 for half-precision inputs), float32 ones through nn::bmm.
    const at::Tensor qa = q.to(acc);
    std::vector<at::Tensor> keys_acc, values_acc;
    for (size_t i = 0; i < keys.size(); ++i) {
      keys_acc.push_back(keys[i].to(acc));
      values_acc.push_back(values[i].to(acc));
    }
    at::Tensor out = at::empty({B, Hkv, G, T, Dh}, q.options());
    at::Tensor lse = at::empty({B, Hkv, G, T}, q.options().dtype(acc));
    const bool fused = fused_softmax(q, acc, softcap);
    const at::Tensor mask_bytes = fused && mask.defined() ? mask.to(at::kBool).contiguous() : at::Tensor();
    for (int64_t first = 0; first < T; first += R) {
      const int64_t rows = std::min(R, T - first);
      for (const Tile& t : tiles_of(ranges, first / R, B, S)) {
        const std::vector<at::Tensor> ks = tile_blocks(keys_acc, t), vs = tile_blocks(values_acc, t);
        const at::Tensor qb = query_rows(qa.narrow(0, t.b0, t.nb), Hkv, first, rows);  // [nb, Hkv, G*rows, Dh]
        at::Tensor probs, row_lse;  // [nb, Hkv, G*rows, S'], [nb, Hkv, G*rows, 1]
        if (fused) {
          probs = products(qb, ks);
          row_lse = at::empty({t.nb, Hkv, G * rows, 1}, probs.options());
          float* sp = probs.data_ptr<float>();
          float* lp = row_lse.data_ptr<float>();
          const int64_t width = probs.size(-1);
          for_each_score_row(Hkv, G, rows, width, mask_bytes, t, first, [&](int64_t i, const bool* m) {
            lp[i] = kernels::softmax_row(sp + i * width, width, static_cast<float>(scale), m);
          });
        } else {
          const at::Tensor scores =
              block_scores(qb, ks, tile_mask(mask, t), G, first, rows, scale, softcap, acc);  // [nb, Hkv, G*rows, S']
          row_lse = at::logsumexp(scores, {-1}, /*keepdim=*/true);
          probs = scores.sub_(row_lse).exp_();
        }
        at::Tensor ob;
        int64_t offset = 0;
        for (size_t i = 0; i < ks.size(); ++i) {
          const int64_t n = ks[i].size(2);
          const at::Tensor part = nn::bmm(probs.narrow(-1, offset, n), vs[i]);  // [nb, Hkv, G*rows, Dh]
          ob = ob.defined() ? ob.add_(part) : part;
          offset += n;
        }
        out.narrow(0, t.b0, t.nb).narrow(3, first, rows).copy_(ob.view({t.nb, Hkv, G, rows, Dh}));
        lse.narrow(0, t.b0, t.nb).narrow(3, first, rows).copy_(row_lse.view({t.nb, Hkv, G, rows}));
      }
    }
    out = out.view({B, H, T, Dh});
    std::vector<at::Tensor> saved = {q, out, lse};
    saved.insert(saved.end(), keys.begin(), keys.end());
    saved.insert(saved.end(), values.begin(), values.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["blocks"] = static_cast<int64_t>(keys.size());
    ctx->saved_data["workspace"] = workspace;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["has_mask"] = mask.defined();
    if (mask.defined()) ctx->saved_data["mask"] = mask;
    if (ranges.defined()) ctx->saved_data["ranges"] = ranges;
    return out;
  }

  // The backward of the small-head path: q, out, lse, then the key and the value blocks were saved.
  static torch::autograd::variable_list small_head_backward(torch::autograd::AutogradContext* ctx,
                                                            const torch::autograd::variable_list& saved, size_t n,
                                                            const at::Tensor& grad) {
    const at::Tensor mask = ctx->saved_data["has_mask"].toBool() ? ctx->saved_data["mask"].toTensor() : at::Tensor();
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor q = saved[0].contiguous(), out = saved[1].contiguous(), lse = saved[2].contiguous();
    std::vector<at::Tensor> keys(saved.begin() + 3, saved.begin() + 3 + static_cast<std::ptrdiff_t>(n));
    std::vector<at::Tensor> values(saved.begin() + 3 + static_cast<std::ptrdiff_t>(n),
                                   saved.begin() + 3 + 2 * static_cast<std::ptrdiff_t>(n));
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3), Hkv = keys[0].size(1), G = H / Hkv;
    const at::Tensor kt = transposed_blocks(keys), vt = transposed_blocks(values);
    const int64_t S = kt.size(3);
    const at::Tensor go = grad.to(at::kFloat).contiguous();
    at::Tensor dq = at::empty({B, H, T, Dh}, q.options());
    at::Tensor dkt = at::zeros({B, Hkv, Dh, S}, q.options()), dvt = at::zeros({B, Hkv, Dh, S}, q.options());
    const float* gp = go.data_ptr<float>();
    const float* op = out.data_ptr<float>();
    const float* lp = lse.data_ptr<float>();
    float* dqp = dq.data_ptr<float>();
    float* dkp = dkt.data_ptr<float>();
    float* dvp = dvt.data_ptr<float>();
    parallel::for_range(0, B * Hkv, 5 * G * T * S * Dh, [&](int64_t i0, int64_t i1) {
      std::vector<float> scratch(static_cast<size_t>(2 * S));
      for (int64_t i = i0; i < i1; ++i) {
        const kernels::AttentionRows a = small_head_view(q, kt, vt, mask, i / Hkv, i % Hkv, scale);
        const int64_t rows = i * G * T;
        kernels::attention_rows_backward(a, gp + rows * Dh, op + rows * Dh, lp + rows, dqp + rows * Dh,
                                         dkp + i * Dh * S, dvp + i * Dh * S, scratch.data());
      }
    });
    const at::Tensor dk = dkt.transpose(2, 3), dv = dvt.transpose(2, 3);  // [B, Hkv, S, Dh]
    torch::autograd::variable_list result;
    result.push_back(dq);
    int64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      result.push_back(dk.narrow(2, offset, keys[i].size(2)).contiguous());
      offset += keys[i].size(2);
    }
    offset = 0;
    for (size_t i = 0; i < n; ++i) {
      result.push_back(dv.narrow(2, offset, values[i].size(2)).contiguous());
      offset += values[i].size(2);
    }
    for (int i = 0; i < 4; ++i) result.push_back(at::Tensor());  // mask, workspace, scale, softcap
    return result;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const size_t n = static_cast<size_t>(ctx->saved_data["blocks"].toInt());
    if (ctx->saved_data.count("small_heads") > 0) return small_head_backward(ctx, saved, n, grads[0]);
    const int64_t workspace = ctx->saved_data["workspace"].toInt();
    const at::Tensor mask = ctx->saved_data["has_mask"].toBool() ? ctx->saved_data["mask"].toTensor() : at::Tensor();
    const at::Tensor& q = saved[0];
    const at::Tensor& out = saved[1];
    const at::Tensor& lse = saved[2];
    const auto acc = accumulate_dtype(q);
    std::vector<at::Tensor> keys, values;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(saved[3 + i].to(acc));
      values.push_back(saved[3 + n + i].to(acc));
    }
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
    const int64_t Hkv = keys[0].size(1), G = H / Hkv;
    int64_t S = 0;
    for (const auto& k : keys) S += k.size(2);
    const double scale = ctx->saved_data["scale"].toDouble();
    const double softcap = ctx->saved_data["softcap"].toDouble();
    const bool split = ctx->saved_data.count("ranges") > 0;  // as the forward tiled
    const int64_t R = split ? std::min(kSkipRows, rows_per_block(1, H, T, S, workspace))
                            : rows_per_block(B, H, T, S, workspace);
    const at::Tensor ranges = split ? ctx->saved_data["ranges"].toTensor() : at::Tensor();
    const at::Tensor qa = q.to(acc), go = grads[0].to(acc).contiguous(), oa = out.to(acc);
    at::Tensor dq = at::empty({B, Hkv, G, T, Dh}, qa.options());
    std::vector<at::Tensor> dk, dv;
    for (size_t i = 0; i < n; ++i) {
      dk.push_back(at::zeros_like(keys[i]));
      dv.push_back(at::zeros_like(values[i]));
    }
    const bool fused = fused_softmax(q, acc, softcap);
    const at::Tensor mask_bytes = fused && mask.defined() ? mask.to(at::kBool).contiguous() : at::Tensor();
    for (int64_t first = 0; first < T; first += R) {
      const int64_t rows = std::min(R, T - first);
      for (const Tile& t : tiles_of(ranges, first / R, B, S)) {
        const std::vector<at::Tensor> ks = tile_blocks(keys, t), vs = tile_blocks(values, t);
        std::vector<at::Tensor> dks = tile_blocks(dk, t), dvs = tile_blocks(dv, t);  // views: updates land in dk, dv
        const at::Tensor qb = query_rows(qa.narrow(0, t.b0, t.nb), Hkv, first, rows);  // [nb, Hkv, G*rows, Dh]
        const at::Tensor gb = query_rows(go.narrow(0, t.b0, t.nb), Hkv, first, rows);  // dO rows
        const at::Tensor ob = query_rows(oa.narrow(0, t.b0, t.nb), Hkv, first, rows);
        const at::Tensor row_lse = lse.narrow(0, t.b0, t.nb).narrow(3, first, rows).reshape({t.nb, Hkv, G * rows, 1});
        if (fused) {
          // Probabilities and score gradients [nb, Hkv, G*rows, S'] over every key block at once, one pass a row.
          const at::Tensor p = products(qb, ks), ds = products(gb, vs);
          const at::Tensor delta = (gb * ob).sum(-1).contiguous();  // rowsum(dO * O): [nb, Hkv, G*rows]
          const at::Tensor lse_rows = row_lse.contiguous();
          float* pp = p.data_ptr<float>();
          float* dsp = ds.data_ptr<float>();
          const float* lp = lse_rows.data_ptr<float>();
          const float* dp = delta.data_ptr<float>();
          const int64_t width = p.size(-1);
          for_each_score_row(Hkv, G, rows, width, mask_bytes, t, first, [&](int64_t i, const bool* m) {
            kernels::softmax_backward_row(pp + i * width, dsp + i * width, width, static_cast<float>(scale), m, lp[i],
                                          dp[i]);
          });
          at::Tensor dqb;
          int64_t offset = 0;
          for (size_t i = 0; i < ks.size(); ++i) {
            const int64_t len = ks[i].size(2);
            const at::Tensor pi = p.narrow(-1, offset, len), dsi = ds.narrow(-1, offset, len);
            dvs[i].add_(nn::bmm(pi.transpose(-1, -2), gb));  // [nb, Hkv, S_i, Dh]
            dks[i].add_(nn::bmm(dsi.transpose(-1, -2), qb));
            const at::Tensor part = nn::bmm(dsi, ks[i]);     // [nb, Hkv, G*rows, Dh]
            dqb = dqb.defined() ? dqb.add_(part) : part;
            offset += len;
          }
          dq.narrow(0, t.b0, t.nb).narrow(3, first, rows).copy_(dqb.view({t.nb, Hkv, G, rows, Dh}));
          continue;
        }
        at::Tensor slope;  // softcap: d(capped)/d(scaled) [nb, Hkv, G*rows, S']
        const at::Tensor probs =
            block_scores(qb, ks, tile_mask(mask, t), G, first, rows, scale, softcap, acc, &slope).sub_(row_lse).exp_();
        const at::Tensor delta = (gb * ob).sum(-1, /*keepdim=*/true);  // rowsum(dO * O): [nb, Hkv, G*rows, 1]
        at::Tensor dqb;
        int64_t offset = 0;
        for (size_t i = 0; i < ks.size(); ++i) {
          const int64_t len = ks[i].size(2);
          const at::Tensor p = probs.narrow(-1, offset, len);                          // [nb, Hkv, G*rows, S_i]
          dvs[i].add_(nn::bmm(p.transpose(-1, -2), gb));                              // [nb, Hkv, S_i, Dh]
          at::Tensor ds = nn::bmm(gb, vs[i].transpose(-1, -2)).sub_(delta).mul_(p).mul_(scale);
          if (slope.defined()) ds.mul_(slope.narrow(-1, offset, len));
          dks[i].add_(nn::bmm(ds.transpose(-1, -2), qb));
          const at::Tensor part = nn::bmm(ds, ks[i]);                              // [nb, Hkv, G*rows, Dh]
          dqb = dqb.defined() ? dqb.add_(part) : part;
          offset += len;
        }
        dq.narrow(0, t.b0, t.nb).narrow(3, first, rows).copy_(dqb.view({t.nb, Hkv, G, rows, Dh}));
      }
    }
    torch::autograd::variable_list result;
    result.push_back(dq.view({B, H, T, Dh}).to(q.scalar_type()));
    for (size_t i = 0; i < n; ++i) result.push_back(dk[i].to(saved[3 + i].scalar_type()));
    for (size_t i = 0; i < n; ++i) result.push_back(dv[i].to(saved[3 + n + i].scalar_type()));
    result.push_back(at::Tensor());  // mask
    result.push_back(at::Tensor());  // workspace
    result.push_back(at::Tensor());  // scale
    result.push_back(at::Tensor());  // softcap
    return result;
  }
};

#if TORCH_VERSION_MAJOR >= 2
at::Tensor attention_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          double scale) {
  const int64_t G = q.size(1) / k.size(1);
  const at::Tensor kr = G > 1 ? k.repeat_interleave(G, 1) : k;
  const at::Tensor vr = G > 1 ? v.repeat_interleave(G, 1) : v;
  // A scale other than 1/sqrt(Dh) is folded into q (SDPA's own scale argument is not in every 2.x).
  const at::Tensor qs = scale == 0 ? q : q * (scale * std::sqrt(static_cast<double>(q.size(-1))));
  if (mask.defined()) return at::scaled_dot_product_attention(qs, kr, vr, mask);
  return at::scaled_dot_product_attention(qs, kr, vr);
}
#endif
}  // namespace

bool attention_tiles_per_row(int64_t heads, int64_t queries, int64_t keys) {
  return heads * std::min(kSkipRows, queries) * keys >= kMinSplitTile;
}

bool sdpa_available() { return TORCH_VERSION_MAJOR >= 2; }

void set_attention_backend(AttentionBackend backend) {
  if (backend == AttentionBackend::kSdpa && !sdpa_available()) {
    fail<ConfigError>("attention backend 'sdpa' needs LibTorch 2.x; this build has {}", TORCH_VERSION);
  }
  g_backend = backend;
}

void set_recompute_attention(bool on) { g_recompute = on; }
void set_small_head_dim(int64_t max_dim) {
  if (max_dim < 0) throw ConfigError("small-head attention: head dimension limit " + std::to_string(max_dim) + " < 0");
  g_small_head_dim = max_dim;
}
int64_t small_head_dim() { return g_small_head_dim.load(); }
void set_max_whole_scores(int64_t scores) {
  if (scores < 1) throw ConfigError("attention: the whole-scores limit must be at least 1, got " + std::to_string(scores));
  g_max_whole_scores = scores;
}
int64_t max_whole_scores() { return g_max_whole_scores.load(); }

at::Tensor attention_blocks(const at::Tensor& q, at::TensorList keys, at::TensorList values, const at::Tensor& mask,
                            int64_t workspace_elements, const ScoreOptions& score) {
  TORCH_CHECK(q.dim() == 4 && !keys.empty() && keys.size() == values.size(), "attention_blocks expects 4-d q and as "
              "many key as value blocks");
  TORCH_CHECK(q.size(1) % keys[0].size(1) == 0, "query heads ", q.size(1), " not a multiple of K/V heads ",
              keys[0].size(1));
  // An undefined tensor cannot be a Function input; an empty optional can.
  const c10::optional<at::Tensor> mask_arg = mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt;
  return BlockAttention::apply(q, keys, values, mask_arg, workspace_elements, score.scale, score.softcap);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     const ScoreOptions& score) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention expects 4-d q, k, v");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads ", q.size(1), " not a multiple of K/V heads ", k.size(1));
#if TORCH_VERSION_MAJOR >= 2
  // SDPA has no score cap: capped attention takes the paths below.
  if (g_backend != AttentionBackend::kMath && score.softcap == 0) return attention_sdpa(q, k, v, mask, score.scale);
#endif
  if (g_recompute && at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    return attention_blocks(q, {k}, {v}, mask, kBlockWorkspace, score);
  }
  if (g_backend != AttentionBackend::kMath && decode_attention_applies(q, k, v, mask)) {
    return attention_decode(q, k, v, mask, score);
  }
  // Scores past the limit (a tower over a large image, a long prefill): query-row blocks, memory linear in T and S.
  // Nothing requires a gradient here, so the Function records nothing.
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2);
  if (T > 0 && S > 0 && B * H > g_max_whole_scores.load() / T / S) {
    return attention_blocks(q, {k}, {v}, mask, kBlockWorkspace, score);
  }
  return attention_math(q, k, v, mask, score);
}

KVCache::KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                 const at::TensorOptions& options) {
  keys.reserve(layers);
  values.reserve(layers);
  for (int64_t i = 0; i < layers; ++i) {
    keys.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, options));
    values.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, options));
  }
}

int64_t KVCache::span(int64_t new_tokens) const {
  int64_t longest = 0;
  for (int64_t n : lengths) longest = std::max(longest, n);
  return longest + new_tokens;
}

std::pair<at::Tensor, at::Tensor> KVCache::write_rows(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t B = k.size(0), T = k.size(2);
  TORCH_CHECK(static_cast<int64_t>(rows.size()) == B && static_cast<int64_t>(lengths.size()) == B,
              "KV cache rows/lengths do not match the batch of ", B);
  const int64_t S = span(T);
  TORCH_CHECK(S <= capacity(), "KV cache overflow: ", S, " > ", capacity());
  at::Tensor& ck = keys[layer];
  at::Tensor& cv = values[layer];
  bool consecutive = true;
  for (int64_t b = 0; b < B; ++b) {
    ck[rows[b]].narrow(1, lengths[b], T).copy_(k[b]);  // [Hkv, T, Dh]
    cv[rows[b]].narrow(1, lengths[b], T).copy_(v[b]);
    consecutive = consecutive && rows[b] == rows[0] + b;
  }
  if (consecutive) return {ck.narrow(0, rows[0], B).narrow(2, 0, S), cv.narrow(0, rows[0], B).narrow(2, 0, S)};
  const at::Tensor index = at::tensor(rows, at::kLong).to(ck.device());
  return {ck.narrow(2, 0, S).index_select(0, index), cv.narrow(2, 0, S).index_select(0, index)};
}

at::Tensor build_row_mask(const std::vector<int64_t>& lengths, int64_t new_tokens, int64_t keys, int64_t window,
                          const at::Device& device) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor starts = at::tensor(lengths, at::kLong).to(device).view({B, 1, 1, 1});
  const at::Tensor query_pos = starts + at::arange(new_tokens, long_opts).view({1, 1, new_tokens, 1});  // [B,1,T,1]
  const at::Tensor key_pos = at::arange(keys, long_opts).view({1, 1, 1, keys});                        // [1,1,1,S]
  at::Tensor mask = key_pos <= query_pos;  // [B, 1, T, S]
  if (window > 0) mask = mask.logical_and(query_pos - key_pos < window);
  return mask;
}

at::Tensor build_attention_mask(int64_t batch, int64_t past, int64_t new_tokens, const at::Tensor& key_valid,
                                int64_t window, const at::Device& device, const at::Tensor& segment_ids) {
  const int64_t S = past + new_tokens;
  const bool causal_needed = new_tokens > 1;
  const bool window_needed = window > 0 && S > window;
  if (!causal_needed && !window_needed && !key_valid.defined() && !segment_ids.defined()) return {};
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor query_pos = at::arange(past, S, long_opts).unsqueeze(1);  // [T, 1]
  const at::Tensor key_pos = at::arange(0, S, long_opts).unsqueeze(0);        // [1, S]
  at::Tensor mask = key_pos <= query_pos;                                     // [T, S]
  if (window_needed) mask = mask.logical_and(query_pos - key_pos < window);
  mask = mask.view({1, 1, new_tokens, S});
  if (segment_ids.defined()) {
    TORCH_CHECK(segment_ids.size(0) == batch && segment_ids.size(1) == S, "segment_ids must be [B, S]");
    const at::Tensor queries = segment_ids.narrow(1, past, new_tokens);  // [B, T]
    mask = mask.logical_and(queries.unsqueeze(2).eq(segment_ids.unsqueeze(1)).unsqueeze(1));  // [B, 1, T, S]
  }
  if (key_valid.defined()) {
    TORCH_CHECK(key_valid.size(0) == batch && key_valid.size(1) == S, "key_valid must be [B, S]");
    mask = mask.logical_and(key_valid.to(at::kBool).view({batch, 1, 1, S}));
    // A padding query sees no valid key; letting it see itself keeps its row finite (a fully masked row
    // would give NaN, and NaN values leak through zero probabilities in the next product).
    mask = mask.logical_or((key_pos == query_pos).view({1, 1, new_tokens, S}));
  }
  return mask;
}

}  // namespace swiftcpp::nn
