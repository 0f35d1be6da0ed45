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

at::Tensor RMSNormImpl::forward(const at::Tensor& x) { return rms_norm(x, weight, eps); }

NormImpl::NormImpl(NormKind kind_, int64_t dim, double eps_) : kind(kind_), eps(eps_) {
  weight = register_parameter("weight", kind == NormKind::kRMSNormOffset ? at::zeros({dim}) : at::ones({dim}));
  if (kind == NormKind::kLayerNorm) bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  if (kind == NormKind::kLayerNorm) return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  return rms_norm(x, weight, eps, kind == NormKind::kRMSNormOffset);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool unit_offset) {
  const auto input_dtype = x.scalar_type();
  // Half-precision inputs are normalised in float32 as Hugging Face does; float32 and float64 stay as they are.
  const bool upcast = input_dtype != at::kFloat && input_dtype != at::kDouble;
  const at::Tensor h = upcast ? x.to(at::kFloat) : x;
  const at::Tensor inv_rms = h.square().mean(-1, /*keepdim=*/true).add_(eps).rsqrt_();
  at::Tensor normed = h * inv_rms;
  if (unit_offset) {
    // Gemma: (1 + w) in float32, multiplied before the cast back.
    const at::Tensor scale = weight.to(normed.scalar_type()) + 1.0;
    normed = at::GradMode::is_enabled() ? normed * scale : normed.mul_(scale);
    return upcast ? normed.to(input_dtype) : normed;
  }
  if (upcast) normed = normed.to(input_dtype);
  return at::GradMode::is_enabled() ? normed * weight : normed.mul_(weight);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, const RopeScaling& scaling,
                                 int64_t initial_positions, int64_t rotary_dim)
    : rotary_dim_(rotary_dim > 0 ? rotary_dim : head_dim) {
  if (rotary_dim_ % 2 != 0 || rotary_dim_ > head_dim) {
    fail<ConfigError>("rotary embedding needs an even rotary width of at most head_dim {}, got {}", head_dim,
                      rotary_dim_);
  }
  // Same float32 arithmetic as Hugging Face: 1 / theta^(arange(0, d, 2) / d).
  const at::Tensor exponents =
      at::arange(0, rotary_dim_, 2, at::kLong).to(at::kFloat) / static_cast<double>(rotary_dim_);
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
  } else if (scaling.type == "longrope") {
    const auto half = static_cast<size_t>(rotary_dim_ / 2);
    if (scaling.short_factor.size() != half || scaling.long_factor.size() != half) {
      fail<ConfigError>("rope_scaling longrope: short_factor and long_factor need {} values (rotary width {} / 2), "
                        "got {} and {}", half, rotary_dim_, scaling.short_factor.size(), scaling.long_factor.size());
    }
    // Hugging Face: 1 / (factor_i * theta^(2i/d)), float32.
    const at::Tensor base = at::pow(theta, exponents);
    const auto factors = [](const std::vector<double>& v) { return at::tensor(v, at::kDouble).to(at::kFloat); };
    inv_freq = 1.0 / (factors(scaling.short_factor) * base);
    long_.inv_freq = 1.0 / (factors(scaling.long_factor) * base);
    long_from_ = scaling.original_max_position_embeddings;
    attention_factor_ = scaling.attention_factor;
  } else if (scaling.type != "default") {
    fail<ConfigError>("unsupported rope_scaling type '{}' (supported: default, linear, llama3, longrope)",
                      scaling.type);
  }
  short_.inv_freq = inv_freq;
  grow(short_, std::max<int64_t>(initial_positions, 1), at::Device(at::kCPU));
}

void RotaryEmbedding::grow(Table& table, int64_t positions, const at::Device& device) const {
  // freqs[p, i] = p * inv_freq[i] in float32; emb = [freqs, freqs] (rotate-half layout).
  const at::Tensor p = at::arange(positions, at::kLong).to(at::kFloat);
  const at::Tensor freqs = p.unsqueeze(1) * table.inv_freq.unsqueeze(0);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos();
  at::Tensor sin = emb.sin();
  if (attention_factor_ != 1.0) {  // longrope's magnitude correction, in float32 as Hugging Face applies it
    cos = cos * attention_factor_;
    sin = sin * attention_factor_;
  }
  table.cos = cos.to(device);
  // Sine with the rotate-half sign folded in: [-sin(first half), +sin(second half)].
  const int64_t half = rotary_dim_ / 2;
  table.sin = at::cat({-sin.narrow(1, 0, half), sin.narrow(1, half, half)}, 1).to(device);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& positions, int64_t position_bound,
                                                           at::ScalarType dtype) {
  // positions: [B, T]
  const int64_t needed = std::max<int64_t>(position_bound, 1);
  Table& table = long_.inv_freq.defined() && position_bound > long_from_ ? long_ : short_;
  const int64_t have = table.cos.defined() ? table.cos.size(0) : 0;
  if (needed > have || table.cos.device() != positions.device()) {
    grow(table, std::max<int64_t>(needed, have), positions.device());
  }
  const at::Tensor flat = positions.reshape({-1});
  const auto shape = std::vector<int64_t>{positions.size(0), 1, positions.size(1), rotary_dim_};
  at::Tensor cos = table.cos.index_select(0, flat).view(shape).to(dtype);
  at::Tensor sin = table.sin.index_select(0, flat).view(shape).to(dtype);
  return {cos, sin};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rotated = cos.size(-1);
  if (rotated < x.size(-1)) {  // partial rotary: the leading dimensions rotate, the rest pass
    const at::Tensor head = apply_rotary(x.narrow(-1, 0, rotated), cos, sin);
    return at::cat({head, x.narrow(-1, rotated, x.size(-1) - rotated)}, -1);
  }
  // rotate_half(x) * sin = [x2, x1] * [-sin1, sin2]: the sign lives in the table, one op less per call.
  const int64_t half = x.size(-1) / 2;
  const at::Tensor swapped = at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return (x * cos).addcmul_(swapped, sin);
}

Activation parse_activation(const std::string& name, const std::string& origin) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return Activation::kGeluTanh;
  if (name == "gelu") return Activation::kGelu;
  fail<ConfigError>("{}: hidden_act '{}' is not supported (supported: silu, swish, gelu, gelu_pytorch_tanh, gelu_new, "
                    "gelu_fast)", origin, name);
}

at::Tensor activate(Activation act, at::Tensor x) {
  switch (act) {
    case Activation::kSilu:
      return at::GradMode::is_enabled() ? at::silu(x) : at::silu_(x);
    case Activation::kGeluTanh:
      return at::gelu(x, "tanh");
    case Activation::kGelu:
      return at::gelu(x);
  }
  return x;
}

}  // namespace swiftcpp::nn
