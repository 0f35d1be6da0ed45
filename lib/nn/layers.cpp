#include "nn/layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "core/error.h"
#include "nn/row_adapters.h"
#include "quant/packed.h"

namespace swiftcpp::nn {

namespace {
// A parameter of the right shape that owns no memory (one element seen through zero strides): checkpoints replace
// it (load_weights), so building a model never allocates its float weights, which a packed or memory-mapped
// checkpoint would then not need.
at::Tensor placeholder(at::IntArrayRef shape) { return at::empty({1}).expand(shape); }
}  // namespace

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool has_bias)
    : in_features_(in_features), out_features_(out_features) {
  weight = register_parameter("weight", placeholder({out_features, in_features}));
  if (has_bias) bias = register_parameter("bias", placeholder({out_features}));
}

namespace {
at::Tensor base_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // One row (a decode step at batch 1): LibTorch 1.13 sends a one-row linear to sgemm, which is several times
  // slower than gemv on large weights (the 32000 x 512 lm_head: 12.6 ms against 5 ms here).
  if (x.numel() == weight.size(1)) {
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    const at::Tensor row = x.reshape({-1});
    return (bias.defined() ? at::addmv(bias, weight, row) : at::mv(weight, row)).view(shape);
  }
  return at::linear(x, weight, bias);
}
}  // namespace

namespace {
thread_local const RowAdapters* t_row_adapters = nullptr;
}  // namespace

const RowAdapters* current_row_adapters() { return t_row_adapters; }
RowAdaptersScope::RowAdaptersScope(const RowAdapters* adapters) : previous_(t_row_adapters) { t_row_adapters = adapters; }
RowAdaptersScope::~RowAdaptersScope() { t_row_adapters = previous_; }

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (input_observer) input_observer(x);
  // A packed layer multiplies tile by tile and never holds its float weight (DoRA's norm below excepted).
  at::Tensor out = packed ? packed_linear(x, packed, bias) : base_linear(x, weight, bias);  // [..., out]
  if (const RowAdapters* rows = t_row_adapters) out = rows->apply(*this, x, out);
  if (!lora) return out;
  const LoraWeights& a = *lora;
  const at::Tensor xd = (a.dropout > 0 && is_training()) ? at::dropout(x, a.dropout, /*train=*/true) : x;
  const at::Tensor delta = at::linear(at::linear(xd, a.lora_A), a.lora_B);  // [..., out]
  if (!a.magnitude.defined()) return at::add(out, delta, a.scale);
  // DoRA (PEFT): base(x) + (m / ||W + s B A|| - 1) * (dropout(x) W^T) + (m / ||W + s B A||) * s * B A dropout(x)
  at::Tensor norm;
  {
    at::NoGradGuard no_grad;
    const at::Tensor w = packed ? packed->dequantize(at::kFloat) : weight;  // [out, in]
    const at::Tensor merged = w.to(at::kFloat) + a.scale * at::mm(a.lora_B.to(at::kFloat), a.lora_A.to(at::kFloat));
    norm = merged.norm(2, {1}).to(a.magnitude.scalar_type());  // [out]
  }
  const at::Tensor ratio = a.magnitude / norm;  // [out]
  const at::Tensor base_d = xd.is_same(x) && !bias.defined() ? out
                            : packed                       ? packed_linear(xd, packed, at::Tensor())
                                                           : at::linear(xd, weight);
  return out + (ratio - 1) * base_d + ratio * delta * a.scale;
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim) {
  weight = register_parameter("weight", placeholder({num_embeddings, dim}));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", placeholder({dim}));
  bias = register_parameter("bias", placeholder({dim}));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const auto input_dtype = x.scalar_type();
  // Half-precision inputs are normalised in float32 as Hugging Face does; float32 and float64 stay as they are.
  const bool upcast = input_dtype != at::kFloat && input_dtype != at::kDouble;
  const at::Tensor h = upcast ? x.to(at::kFloat) : x;
  const at::Tensor inv_rms = h.square().mean(-1, /*keepdim=*/true).add_(eps).rsqrt_();
  at::Tensor normed = h * inv_rms;
  if (upcast) normed = normed.to(input_dtype);
  return at::GradMode::is_enabled() ? normed * weight : normed.mul_(weight);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, const RopeScaling& scaling,
                                 int64_t initial_positions)
    : head_dim_(head_dim) {
  if (head_dim % 2 != 0) fail<ConfigError>("rotary embedding needs an even head_dim, got {}", head_dim);
  // Same float32 arithmetic as Hugging Face: 1 / theta^(arange(0, d, 2) / d).
  const at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  at::Tensor inv_freq = 1.0 / at::pow(theta, exponents);
  if (scaling.type == "linear") {
    inv_freq = inv_freq / scaling.factor;
  } else if (scaling.type == "llama3") {
    const double old_context = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / scaling.low_freq_factor;
    const double high_freq_wavelen = old_context / scaling.high_freq_factor;
    auto* f = inv_freq.data_ptr<float>();
    for (int64_t i = 0; i < inv_freq.numel(); ++i) {
      const double freq = f[i];
      const double wavelen = 2.0 * M_PI / freq;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f[i] = static_cast<float>(freq / scaling.factor);
      } else {
        const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        f[i] = static_cast<float>((1.0 - smooth) * freq / scaling.factor + smooth * freq);
      }
    }
  } else if (scaling.type != "default") {
    fail<ConfigError>("unsupported rope_scaling type '{}' (supported: default, linear, llama3)", scaling.type);
  }
  inv_freq_ = inv_freq;
  grow(std::max<int64_t>(initial_positions, 1), at::Device(at::kCPU));
}

void RotaryEmbedding::grow(int64_t positions, const at::Device& device) {
  // freqs[p, i] = p * inv_freq[i] in float32; emb = [freqs, freqs] (rotate-half layout).
  const at::Tensor p = at::arange(positions, at::kLong).to(at::kFloat);
  const at::Tensor freqs = p.unsqueeze(1) * inv_freq_.unsqueeze(0);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  cos_ = emb.cos().to(device);
  // Sine with the rotate-half sign folded in: [-sin(first half), +sin(second half)].
  const at::Tensor sin = emb.sin();
  sin_ = at::cat({-sin.narrow(1, 0, head_dim_ / 2), sin.narrow(1, head_dim_ / 2, head_dim_ / 2)}, 1).to(device);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& positions, int64_t position_bound,
                                                           at::ScalarType dtype) {
  // positions: [B, T]
  const int64_t needed = std::max<int64_t>(position_bound, 1);
  if (needed > cos_.size(0) || cos_.device() != positions.device()) {
    grow(std::max<int64_t>(needed, cos_.size(0)), positions.device());
  }
  const at::Tensor flat = positions.reshape({-1});
  const auto shape = std::vector<int64_t>{positions.size(0), 1, positions.size(1), head_dim_};
  at::Tensor cos = cos_.index_select(0, flat).view(shape).to(dtype);
  at::Tensor sin = sin_.index_select(0, flat).view(shape).to(dtype);
  return {cos, sin};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // rotate_half(x) * sin = [x2, x1] * [-sin1, sin2]: the sign lives in the table, one op less per call.
  const int64_t half = x.size(-1) / 2;
  const at::Tensor swapped = at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return (x * cos).addcmul_(swapped, sin);
}

}  // namespace swiftcpp::nn
