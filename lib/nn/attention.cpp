#include "nn/attention.h"

#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace swiftcpp::nn {

namespace {
std::atomic<AttentionBackend> g_backend{AttentionBackend::kAuto};

// Explicit path. Query heads of one K/V group are laid side by side so one batched matmul per group serves
// them all without copying K/V: q [B, Hkv, G*T, Dh] @ k^T [B, Hkv, Dh, S].
at::Tensor attention_math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), G = H / Hkv;
  const at::Tensor qg = q.contiguous().view({B, Hkv, G * T, Dh});
  at::Tensor scores = at::matmul(qg, k.transpose(-1, -2));  // [B, Hkv, G*T, S]
  scores.div_(std::sqrt(static_cast<double>(Dh)));
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

#if TORCH_VERSION_MAJOR >= 2
at::Tensor attention_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const int64_t G = q.size(1) / k.size(1);
  const at::Tensor kr = G > 1 ? k.repeat_interleave(G, 1) : k;
  const at::Tensor vr = G > 1 ? v.repeat_interleave(G, 1) : v;
  if (mask.defined()) return at::scaled_dot_product_attention(q, kr, vr, mask);
  return at::scaled_dot_product_attention(q, kr, vr);
}
#endif
}  // namespace

bool sdpa_available() { return TORCH_VERSION_MAJOR >= 2; }

void set_attention_backend(AttentionBackend backend) {
  if (backend == AttentionBackend::kSdpa && !sdpa_available()) {
    fail<ConfigError>("attention backend 'sdpa' needs LibTorch 2.x; this build has {}", TORCH_VERSION);
  }
  g_backend = backend;
}

AttentionBackend attention_backend() { return g_backend; }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention expects 4-d q, k, v");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads ", q.size(1), " not a multiple of K/V heads ", k.size(1));
#if TORCH_VERSION_MAJOR >= 2
  if (g_backend != AttentionBackend::kMath) return attention_sdpa(q, k, v, mask);
#endif
  return attention_math(q, k, v, mask);
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
