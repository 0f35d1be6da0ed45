#include "nn/layers.h"

#include <ATen/ATen.h>

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "core/error.h"
#include "core/parallel.h"
#include "nn/gemm.h"
#include "nn/kernels.h"
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
// Input rows of x [..., in] when a decode kernel should take it: no autograd, CPU, at most kKernelMaxRows rows;
// 0 otherwise.
int64_t kernel_rows(const at::Tensor& x, int64_t in) {
  if (at::GradMode::is_enabled() || !x.device().is_cpu() || x.numel() == 0 || x.size(-1) != in) return 0;
  const int64_t rows = x.numel() / in;
  return rows <= kKernelMaxRows ? rows : 0;
}

// Runs fn(o0, o1) over output rows [0, out) on the library's thread team (core/parallel.h). The rows go in chunks of
// whole 16-row groups, about eight a thread, claimed in turn by whichever thread is free: a thread that starts late
// or runs slow (a shared machine) takes fewer chunks, and one that never starts holds nobody up.
template <typename Fn>
void over_rows(int64_t out, int64_t work_per_row, Fn fn) {
  const int64_t threads = std::max<int64_t>(1, parallel::threads());
  if (threads == 1 || out * work_per_row < 2 * parallel::kMinParallelWork) {
    fn(int64_t{0}, out);
    return;
  }
  const int64_t chunk = std::max<int64_t>(16, (out + 8 * threads - 1) / (8 * threads) + 15) / 16 * 16;
  const int64_t chunks = (out + chunk - 1) / chunk;
  parallel::for_chunks(chunks, [&](int64_t c) { fn(c * chunk, std::min(out, (c + 1) * chunk)); });
}

kernels::QuantMatrix view_of(const QuantBlocks& b) {
  kernels::QuantMatrix m;
  m.q = b.q.data_ptr<uint8_t>();
  m.scales = b.scales.data_ptr<float>();
  m.zeros = b.zeros.data_ptr<uint8_t>();
  m.rows = b.rows;
  m.cols = b.cols;
  m.blocks = b.blocks;
  m.bits = b.bits;
  return m;
}

// The input of a kernel pass: x as float32 rows [M, in], and for block-quantised weights padded to whole blocks
// [M, blocks * 32] with each block's sum [M, blocks], or (kernels::quant_takes_int8_activations) quantised to int8
// per block: xq [M, blocks * 32], d [M, blocks], xq's block sums [M, blocks].
struct KernelInput {
  int64_t rows = 0, in = 0, blocks = 0;
  bool int8 = false;
  at::Tensor x, padded, sums, xq, d, xqsum;
  KernelInput(const at::Tensor& input, int64_t rows_, int64_t in_, bool quantised) : rows(rows_), in(in_) {
    x = input.reshape({rows, in}).to(at::kFloat).contiguous();
    if (!quantised) return;
    blocks = (in + kernels::kBlock - 1) / kernels::kBlock;
    padded = blocks * kernels::kBlock == in ? x : at::constant_pad_nd(x, {0, blocks * kernels::kBlock - in}).contiguous();
    int8 = kernels::quant_takes_int8_activations();
    if (!int8) {
      sums = padded.view({rows, blocks, kernels::kBlock}).sum(-1).contiguous();
      return;
    }
    xq = at::empty({rows, blocks * kernels::kBlock}, at::kChar);
    d = at::empty({rows, blocks}, at::kFloat);
    xqsum = at::empty({rows, blocks}, at::kInt);
    kernels::quantize_activations(padded.data_ptr<float>(), rows, blocks, xq.data_ptr<int8_t>(), d.data_ptr<float>(),
                                  xqsum.data_ptr<int32_t>());
  }
};

// One layer's share of a kernel pass: its weight, output width and bias.
struct KernelJob {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  const QuantBlocks* quant = nullptr;
  int64_t out = 0;
  at::Tensor bias;
  at::Tensor y;  // [rows, out] float32
};

// A job for `weight` (float32 or bfloat16, contiguous, CPU) when the kernels can run it with input dtype `dtype`.
bool dense_job(const at::Tensor& weight, at::ScalarType dtype, KernelJob& job) {
  if (!weight.defined() || weight.dim() != 2 || !weight.device().is_cpu() || !weight.is_contiguous() ||
      weight.scalar_type() != dtype) {
    return false;
  }
  if (dtype == at::kFloat) {
    job.f32 = weight.data_ptr<float>();
  } else if (dtype == at::kBFloat16) {
    job.bf16 = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  } else {
    return false;
  }
  job.out = weight.size(0);
  return true;
}

// Runs every job's rows in one pass over the threads; each job's y is filled.
void run_jobs(std::vector<KernelJob>& jobs, const KernelInput& in) {
  int64_t total = 0;
  for (KernelJob& j : jobs) {
    j.y = at::empty({in.rows, j.out}, at::TensorOptions().dtype(at::kFloat));
    total += j.out;
  }
  std::vector<kernels::QuantMatrix> views(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].quant != nullptr) views[i] = view_of(*jobs[i].quant);
  }
  over_rows(total, in.in * in.rows, [&](int64_t r0, int64_t r1) {
    int64_t offset = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const KernelJob& j = jobs[i];
      const int64_t lo = std::max(r0, offset) - offset, hi = std::min(r1, offset + j.out) - offset;
      offset += j.out;
      if (lo >= hi) continue;
      float* y = j.y.data_ptr<float>();
      if (j.quant != nullptr && in.int8) {
        kernels::gemv_quant_q8(views[i], in.xq.data_ptr<int8_t>(), in.d.data_ptr<float>(), in.xqsum.data_ptr<int32_t>(),
                               in.rows, y, j.out, lo, hi);
      } else if (j.quant != nullptr) {
        kernels::gemv_quant(views[i], in.padded.data_ptr<float>(), in.blocks * kernels::kBlock, in.sums.data_ptr<float>(),
                            in.rows, y, j.out, lo, hi);
      } else if (j.f32 != nullptr) {
        kernels::gemv_f32(j.f32, in.in, in.x.data_ptr<float>(), in.in, in.rows, y, j.out, lo, hi);
      } else {
        kernels::gemv_bf16(j.bf16, in.in, in.x.data_ptr<float>(), in.in, in.rows, y, j.out, lo, hi);
      }
    }
  });
}

// y [rows, out] float32 -> the caller's shape and dtype, plus bias.
at::Tensor finish_rows(at::Tensor y, const at::Tensor& x, const at::Tensor& bias) {
  if (bias.defined()) y.add_(bias.to(at::kFloat));
  auto shape = x.sizes().vec();
  shape.back() = y.size(1);
  return y.to(x.scalar_type()).view(shape);
}

// Rows [o0, o0 + n) of W as float32 [n, cols].
at::Tensor dequantize_tile(const QuantBlocks& b, int64_t o0, int64_t n) {
  at::Tensor w = at::empty({n, b.cols}, at::TensorOptions().dtype(at::kFloat));
  const kernels::QuantMatrix m = view_of(b);
  float* out = w.data_ptr<float>();
  over_rows(n, b.cols, [&](int64_t r0, int64_t r1) {
    kernels::dequantize_rows(m, o0 + r0, o0 + r1, out + r0 * b.cols, b.cols);
  });
  return w;
}
}  // namespace

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t rows = kernel_rows(x, in);
  std::vector<KernelJob> jobs(1);
  if (rows > 0 && dense_job(weight, x.scalar_type(), jobs[0])) {
    run_jobs(jobs, KernelInput(x, rows, in, false));
    return finish_rows(jobs[0].y, x, bias);
  }
  // One row elsewhere (a decode step at batch 1 on another device or dtype): LibTorch 1.13 sends a one-row linear
  // to sgemm, several times slower than gemv on large weights.
  if (x.numel() == in) {
    auto shape = x.sizes().vec();
    shape.back() = out;
    const at::Tensor row = x.reshape({-1});
    return (bias.defined() ? at::addmv(bias, weight, row) : at::mv(weight, row)).view(shape);
  }
  return nn::linear(x, weight, bias);
}

QuantBlocks QuantBlocks::from_values(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros, int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("QuantBlocks: bits must be 4 or 8");
  if (q.dim() != 2) throw std::invalid_argument("QuantBlocks: q must be [rows, cols]");
  QuantBlocks b;
  b.rows = q.size(0);
  b.cols = q.size(1);
  b.blocks = (b.cols + kernels::kBlock - 1) / kernels::kBlock;
  b.bits = bits;
  if (scales.sizes() != at::IntArrayRef{b.rows, b.blocks} || zeros.sizes() != at::IntArrayRef{b.rows, b.blocks}) {
    throw std::invalid_argument("QuantBlocks: scales and zeros must be [rows, blocks]");
  }
  b.scales = scales.to(at::kCPU, at::kFloat).contiguous();
  b.zeros = zeros.to(at::kCPU, at::kByte).contiguous();
  // Pad to whole blocks with each row's last zero point (weights of zero there).
  at::Tensor values = q.to(at::kCPU, at::kByte);
  const int64_t padded = b.blocks * kernels::kBlock;
  if (padded != b.cols) {
    const at::Tensor pad = b.zeros.narrow(1, b.blocks - 1, 1).expand({b.rows, padded - b.cols});
    values = at::cat({values, pad}, 1);
  }
  values = values.contiguous();
  if (bits == 8) {
    b.q = values;
  } else {
    // [rows, blocks, 2, 16] -> byte j of a block: low nibble column j, high nibble column j + 16.
    const at::Tensor v = values.view({b.rows, b.blocks, 2, kernels::kBlock / 2});
    b.q = (v.select(2, 0) | v.select(2, 1).mul(16)).contiguous().view({b.rows, b.blocks * kernels::kBlock / 2});
  }
  return b;
}

QuantBlocks QuantBlocks::select_rows(const at::Tensor& order) const {
  QuantBlocks b = *this;
  b.q = q.index_select(0, order).contiguous();
  b.scales = scales.index_select(0, order).contiguous();
  b.zeros = zeros.index_select(0, order).contiguous();
  return b;
}

at::Tensor QuantBlocks::dequantize() const { return dequantize_tile(*this, 0, rows); }

int64_t QuantBlocks::nbytes() const {
  return static_cast<int64_t>(q.nbytes() + scales.nbytes() + zeros.nbytes());
}

at::Tensor quant_blocks_linear(const at::Tensor& x, const QuantBlocks& w, const at::Tensor& bias) {
  const int64_t rows = kernel_rows(x, w.cols);
  if (rows > 0) {
    std::vector<KernelJob> jobs(1);
    jobs[0].quant = &w;
    jobs[0].out = w.rows;
    run_jobs(jobs, KernelInput(x, rows, w.cols, true));
    return finish_rows(jobs[0].y, x, bias);
  }
  // Many rows, or autograd: W expanded to x's dtype tile by tile (about 2^22 weights each), constants to autograd.
  const int64_t tile = std::max<int64_t>(16, (int64_t{1} << 22) / std::max<int64_t>(w.cols, 1));
  if (tile >= w.rows) return nn::linear(x, dequantize_tile(w, 0, w.rows).to(x.device(), x.scalar_type()), bias);
  std::vector<at::Tensor> parts;
  for (int64_t o0 = 0; o0 < w.rows; o0 += tile) {
    const int64_t n = std::min(tile, w.rows - o0);
    parts.push_back(nn::linear(x, dequantize_tile(w, o0, n).to(x.device(), x.scalar_type()),
                               bias.defined() ? bias.narrow(0, o0, n) : at::Tensor()));
  }
  return at::cat(parts, -1);
}

namespace {
thread_local const RowAdapters* t_row_adapters = nullptr;
}  // namespace

const RowAdapters* current_row_adapters() { return t_row_adapters; }
RowAdaptersScope::RowAdaptersScope(const RowAdapters* adapters) : previous_(t_row_adapters) { t_row_adapters = adapters; }
RowAdaptersScope::~RowAdaptersScope() { t_row_adapters = previous_; }

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (input_observer) input_observer(x);
  // A packed layer multiplies tile by tile and never holds its float weight (DoRA's norm below excepted).
  at::Tensor out = blocks ? quant_blocks_linear(x, *blocks, bias)
                   : packed ? packed_linear(x, packed, bias)
                            : dense_linear(x, weight, bias);  // [..., out]
  if (const RowAdapters* rows = t_row_adapters) out = rows->apply(*this, x, out);
  if (!lora) return out;
  const LoraWeights& a = *lora;
  const at::Tensor xd = (a.dropout > 0 && is_training()) ? at::dropout(x, a.dropout, /*train=*/true) : x;
  const at::Tensor delta = nn::linear(nn::linear(xd, a.lora_A), a.lora_B);  // [..., out]
  if (!a.magnitude.defined()) return at::add(out, delta, a.scale);
  // DoRA (PEFT): base(x) + (m / ||W + s B A|| - 1) * (dropout(x) W^T) + (m / ||W + s B A||) * s * B A dropout(x)
  at::Tensor norm;
  {
    at::NoGradGuard no_grad;
    const at::Tensor w = blocks ? blocks->dequantize() : packed ? packed->dequantize(at::kFloat) : weight;  // [out, in]
    const at::Tensor merged = w.to(at::kFloat) + a.scale * at::mm(a.lora_B.to(at::kFloat), a.lora_A.to(at::kFloat));
    norm = merged.norm(2, {1}).to(a.magnitude.scalar_type());  // [out]
  }
  const at::Tensor ratio = a.magnitude / norm;  // [out]
  const at::Tensor base_d = xd.is_same(x) && !bias.defined() ? out
                            : blocks                       ? quant_blocks_linear(xd, *blocks, at::Tensor())
                            : packed                       ? packed_linear(xd, packed, at::Tensor())
                                                           : nn::linear(xd, weight);
  return out + (ratio - 1) * base_d + ratio * delta * a.scale;
}

std::vector<at::Tensor> linear_group(const std::vector<LinearImpl*>& layers, const at::Tensor& x) {
  const int64_t in = layers.empty() ? 0 : layers.front()->in_features();
  const int64_t rows = kernel_rows(x, in);
  std::vector<KernelJob> jobs(layers.size());
  bool ready = rows > 0 && t_row_adapters == nullptr, quantised = false;
  for (size_t i = 0; ready && i < layers.size(); ++i) {
    const LinearImpl& l = *layers[i];
    ready = l.in_features() == in && !l.lora && !l.input_observer && !l.packed;
    if (ready && l.blocks) {
      jobs[i].quant = l.blocks.get();
      jobs[i].out = l.blocks->rows;
      quantised = true;
    } else if (ready) {
      ready = dense_job(l.weight, x.scalar_type(), jobs[i]);
    }
    jobs[i].bias = l.bias;
  }
  std::vector<at::Tensor> outs;
  if (!ready) {
    for (LinearImpl* l : layers) outs.push_back(l->forward(x));
    return outs;
  }
  run_jobs(jobs, KernelInput(x, rows, in, quantised));
  for (KernelJob& j : jobs) outs.push_back(finish_rows(j.y, x, j.bias));
  return outs;
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
  if (kind == NormKind::kLayerNorm) {
    // A bfloat16 activation of float32 weights (autocast) runs in float32 and stays so, as autocast's float32 op
    // list has layer_norm (LibTorch 1.13's CPU kernel refuses the mixed dtypes).
    const at::Tensor in = x.scalar_type() == weight.scalar_type() ? x : x.to(weight.scalar_type());
    return at::layer_norm(in, {weight.size(0)}, weight, bias, eps);
  }
  return rms_norm(x, weight, eps, kind == NormKind::kRMSNormOffset);
}

namespace {
// Decode rows of float32 on the CPU without autograd: one loop instead of LibTorch's six ops.
bool small_float_rows(const at::Tensor& x, int64_t width, at::ScalarType dtype = at::kFloat) {
  return !at::GradMode::is_enabled() && x.device().is_cpu() && x.scalar_type() == dtype && x.numel() > 0 &&
         x.numel() / width <= kKernelMaxRows * 64;
}
}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool unit_offset) {
  const int64_t dim = x.size(-1);
  if (small_float_rows(x, dim) && x.is_contiguous() && weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
      weight.numel() == dim) {
    at::Tensor out = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float offset = unit_offset ? 1.0f : 0.0f;
    for (int64_t r = 0; r < x.numel() / dim; ++r) {
      const float* row = in + r * dim;
      float sum = 0;
      for (int64_t i = 0; i < dim; ++i) sum += row[i] * row[i];
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + static_cast<float>(eps));
      for (int64_t i = 0; i < dim; ++i) o[r * dim + i] = row[i] * inv * (w[i] + offset);
    }
    return out;
  }
  if (small_float_rows(x, dim, at::kBFloat16) && x.is_contiguous() && weight.scalar_type() == at::kBFloat16 &&
      weight.is_contiguous() && weight.numel() == dim) {
    // As the path below rounds: normalised in float32, cast to bfloat16, times the bfloat16 weight (Gemma: times
    // (1 + w) in float32 before the cast).
    at::Tensor out = at::empty_like(x);
    const auto* in = x.data_ptr<at::BFloat16>();
    const auto* w = weight.data_ptr<at::BFloat16>();
    auto* o = out.data_ptr<at::BFloat16>();
    for (int64_t r = 0; r < x.numel() / dim; ++r) {
      const at::BFloat16* row = in + r * dim;
      float sum = 0;
      for (int64_t i = 0; i < dim; ++i) sum += static_cast<float>(row[i]) * static_cast<float>(row[i]);
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + static_cast<float>(eps));
      for (int64_t i = 0; i < dim; ++i) {
        const float normed = static_cast<float>(row[i]) * inv;
        o[r * dim + i] = unit_offset ? at::BFloat16(normed * (static_cast<float>(w[i]) + 1.0f))
                                     : at::BFloat16(static_cast<float>(at::BFloat16(normed)) * static_cast<float>(w[i]));
      }
    }
    return out;
  }
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
  if (!scaling.mrope_section.empty()) {
    int64_t total = 0;
    for (const int64_t part : scaling.mrope_section) {
      if (part < 0) fail<ConfigError>("rope_scaling.mrope_section holds a negative size {}", part);
      total += part;
    }
    if (scaling.mrope_section.size() != 3 || 2 * total != rotary_dim_) {
      fail<ConfigError>("rope_scaling.mrope_section [{}] must be three sizes summing to half the rotary width ({})",
                        fmt::join(scaling.mrope_section, ", "), rotary_dim_ / 2);
    }
    mrope_section_ = scaling.mrope_section;
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
  if (positions.dim() == 3) {
    // M-RoPE: positions [3, B, T]; the columns of frequency j (j and j + R/2) come from the axis of j's section.
    TORCH_CHECK(!mrope_section_.empty() && positions.size(0) == 3, "rotary: [3, B, T] positions need M-RoPE, got ",
                positions.sizes());
    const int64_t B = positions.size(1), T = positions.size(2), half = rotary_dim_ / 2;
    const auto shape = std::vector<int64_t>{B, 1, T, rotary_dim_};
    const auto pick = [&](const at::Tensor& source) {
      std::vector<at::Tensor> axes;  // each [B T, R]
      for (int64_t a = 0; a < 3; ++a) axes.push_back(source.index_select(0, positions[a].reshape({-1})));
      std::vector<at::Tensor> parts;
      for (int64_t offset : {int64_t{0}, half}) {
        int64_t start = 0;
        for (int64_t a = 0; a < 3; ++a) {
          const int64_t width = mrope_section_[static_cast<size_t>(a)];
          if (width > 0) parts.push_back(axes[static_cast<size_t>(a)].narrow(1, offset + start, width));
          start += width;
        }
      }
      return at::cat(parts, 1).view(shape).to(dtype);
    };
    return {pick(table.cos), pick(table.sin)};
  }
  const at::Tensor flat = positions.reshape({-1});
  const auto shape = std::vector<int64_t>{positions.size(0), 1, positions.size(1), rotary_dim_};
  at::Tensor cos = table.cos.index_select(0, flat).view(shape).to(dtype);
  at::Tensor sin = table.sin.index_select(0, flat).view(shape).to(dtype);
  return {cos, sin};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rotated = cos.size(-1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  if (x.dim() == 4 && small_float_rows(x, x.size(-1), bf16 ? at::kBFloat16 : at::kFloat) &&
      cos.scalar_type() == x.scalar_type() && cos.dim() == 4 && cos.size(1) == 1 && cos.size(2) == x.size(2) &&
      (cos.size(0) == x.size(0) || cos.size(0) == 1)) {
    // x [B, H, T, Dh] (any strides) -> contiguous [B, H, T, Dh]; cos/sin [B or 1, 1, T, R]. bfloat16 rounds as the
    // path below: x * cos to bfloat16, then the sum once.
    const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), half = rotated / 2;
    const at::Tensor c = cos.contiguous(), s = sin.contiguous();
    at::Tensor out = at::empty({B, H, T, D}, x.options());
    const auto run = [&](auto* xp, const auto* cp, const auto* sp, auto* op) {
      using T_ = std::remove_const_t<std::remove_pointer_t<decltype(op)>>;
      const auto round = [](float v) { return static_cast<float>(T_(v)); };
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t t = 0; t < T; ++t) {
            const auto* in = xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2);
            const int64_t st = x.stride(3);
            const auto* cr = cp + ((c.size(0) == 1 ? 0 : b) * T + t) * rotated;
            const auto* sr = sp + ((s.size(0) == 1 ? 0 : b) * T + t) * rotated;
            T_* o = op + ((b * H + h) * T + t) * D;
            for (int64_t i = 0; i < rotated; ++i) {
              const int64_t partner = i < half ? i + half : i - half;
              const float xc = round(static_cast<float>(in[i * st]) * static_cast<float>(cr[i]));
              o[i] = T_(xc + static_cast<float>(in[partner * st]) * static_cast<float>(sr[i]));
            }
            for (int64_t i = rotated; i < D; ++i) o[i] = in[i * st];
          }
        }
      }
    };
    if (bf16) {
      run(x.data_ptr<at::BFloat16>(), c.data_ptr<at::BFloat16>(), s.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>());
    } else {
      run(x.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), out.data_ptr<float>());
    }
    return out;
  }
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

// ---------------------------------------------------------------------------------------------------------------
// GEMM-backed products with their own backward, and the chunked head loss (nn/gemm.h).

namespace {
// The leading dimension of a 2-D tensor whose rows are contiguous (a row-major matrix), 0 when they are not.
int64_t row_major_ld(const at::Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  if (t.stride(1) != 1 && c != 1) return 0;
  const int64_t ld = r == 1 ? c : t.stride(0);
  return ld >= std::max<int64_t>(1, c) ? ld : 0;
}

// A 2-D tensor as a row-major BLAS operand: 'N' when its rows are contiguous, 'T' when its columns are (a transposed
// view); false otherwise.
bool blas_operand(const at::Tensor& t, char& trans, int64_t& ld) {
  if ((ld = row_major_ld(t)) > 0) {
    trans = 'N';
    return true;
  }
  if ((ld = row_major_ld(t.t())) > 0) {
    trans = 'T';
    return true;
  }
  return false;
}

bool fast_gemm_operands(const at::Tensor& a, const at::Tensor& b) {
  return kernels::has_fast_gemm() && a.dim() == 2 && b.dim() == 2 && a.device().is_cpu() && b.device().is_cpu() &&
         a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.size(0) > 0 && a.size(1) > 0 &&
         b.size(1) > 0;
}

// c [M, N] (row-contiguous) = a @ b + beta * c through kernels::sgemm; false when it does not apply.
bool sgemm_into(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, float beta) {
  if (!fast_gemm_operands(a, b) || c.scalar_type() != at::kFloat || !c.device().is_cpu()) return false;
  char ta = 'N', tb = 'N';
  int64_t lda = 0, ldb = 0;
  if (!blas_operand(a, ta, lda) || !blas_operand(b, tb, ldb)) return false;
  if (c.stride(1) != 1 && c.size(1) != 1) return false;
  const int64_t ldc = c.size(0) == 1 ? c.size(1) : c.stride(0);
  if (ldc < c.size(1)) return false;
  return kernels::sgemm(ta, tb, a.size(0), b.size(1), a.size(1), 1.0f, a.data_ptr<float>(), lda,
                        b.data_ptr<float>(), ldb, beta, c.data_ptr<float>(), ldc);
}

bool autocast_on(const at::Tensor& x) {
  return x.device().is_cpu() ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}

// x [N, in] @ weight [out, in]^T with the backward's products through nn::mm too.
class GemmLinear : public torch::autograd::Function<GemmLinear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return nn::mm(x, weight.t());  // [N, out]
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].contiguous();  // [N, out]
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = nn::mm(dy, saved[1]);      // [N, out] @ [out, in]
    if (ctx->needs_input_grad(1)) dw = nn::mm(dy.t(), saved[0]);  // [out, N] @ [N, in]
    return {dx, dw};
  }
};

// Sum of the cross-entropy of hidden [N, D] @ weight [V, D]^T against targets [N], chunk by chunk (see
// linear_cross_entropy); with dh / dw defined ([N, D] / zeroed [V, D] float32), also its gradients.
at::Tensor head_loss_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, bool bf16,
                            int64_t chunk_elements, at::Tensor* correct, at::Tensor dh, at::Tensor dw) {
  const int64_t N = hidden.size(0), V = weight.size(0);
  const int64_t R = std::max<int64_t>(1, std::min(N, chunk_elements / std::max<int64_t>(1, V)));
  const at::Tensor w_op = bf16 ? weight.to(at::kBFloat16) : weight;  // [V, D]
  at::Tensor loss = at::zeros({}, hidden.options().dtype(at::kFloat));
  at::Tensor hits = at::zeros({}, targets.options());
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t n = std::min(R, N - r0);
    const at::Tensor h = hidden.narrow(0, r0, n);
    const at::Tensor h_op = bf16 ? h.to(at::kBFloat16) : h;
    const at::Tensor t = targets.narrow(0, r0, n).unsqueeze(1);  // [n, 1]
    at::Tensor logits = bf16 ? at::mm(h_op, w_op.t()).to(at::kFloat) : nn::mm(h, weight.t()).to(at::kFloat);  // [n, V]
    if (correct != nullptr) hits.add_(logits.argmax(1).eq(t.squeeze(1)).sum());
    const at::Tensor lse = at::logsumexp(logits, {1}, /*keepdim=*/true);  // [n, 1]
    loss.add_((lse - logits.gather(1, t)).sum());
    if (!dh.defined() && !dw.defined()) continue;
    // d(sum of losses)/d(logits) = softmax - one_hot, in place of the logits.
    at::Tensor g = logits.sub_(lse).exp_();
    g.scatter_add_(1, t, at::full({n, 1}, -1.0f, g.options()));
    if (bf16) {
      const at::Tensor g_op = g.to(at::kBFloat16);
      if (dh.defined()) dh.narrow(0, r0, n).copy_(at::mm(g_op, w_op));
      if (dw.defined()) dw.add_(at::mm(g_op.t(), h_op));
    } else {
      if (dh.defined()) {
        at::Tensor rows = dh.narrow(0, r0, n);
        nn::mm_into(g, weight, rows, 0.0f);
      }
      if (dw.defined()) nn::mm_into(g.t(), h, dw, 1.0f);
    }
  }
  if (correct != nullptr) *correct = correct->defined() ? *correct + hits : hits;
  return loss;
}

class ChunkedHeadLoss : public torch::autograd::Function<ChunkedHeadLoss> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, bool bf16, int64_t chunk_elements, at::Tensor* correct) {
    const at::Tensor dh = hidden.requires_grad() ? at::empty(hidden.sizes(), hidden.options()) : at::Tensor();
    const at::Tensor dw = weight.requires_grad() ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat))
                                                 : at::Tensor();
    at::Tensor loss = head_loss_chunks(hidden, weight, targets, bf16, chunk_elements, correct, dh, dw);
    ctx->saved_data["dh"] = dh.defined() ? c10::IValue(dh) : c10::IValue();
    ctx->saved_data["dw"] = dw.defined() ? c10::IValue(dw.to(weight.scalar_type())) : c10::IValue();
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor scale = grads[0];
    const c10::IValue dh = ctx->saved_data["dh"], dw = ctx->saved_data["dw"];
    TORCH_CHECK(!(ctx->needs_input_grad(0) && dh.isNone()) && !(ctx->needs_input_grad(1) && dw.isNone()),
                "linear_cross_entropy: a gradient was asked for that the forward did not form (was autograd off?)");
    // One entry per forward argument: hidden, weight, then none for targets, bf16, chunk_elements, correct.
    return {dh.isNone() ? at::Tensor() : dh.toTensor() * scale, dw.isNone() ? at::Tensor() : dw.toTensor() * scale,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (fast_gemm_operands(a, b) && a.size(1) == b.size(0)) {
    at::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
    if (sgemm_into(a, b, c, 0.0f)) return c;
  }
  return at::mm(a, b);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  const int64_t d = a.dim();
  if (d < 3 || b.dim() != d || a.sizes().slice(0, d - 2) != b.sizes().slice(0, d - 2) || a.size(-1) != b.size(-2) ||
      a.numel() == 0 || b.numel() == 0) {
    return at::matmul(a, b);
  }
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const at::Tensor a3 = a.reshape({-1, M, K}), b3 = b.reshape({-1, K, N});  // views where the layout allows
  char ta = 'N', tb = 'N';
  int64_t lda = 0, ldb = 0;
  if (!fast_gemm_operands(a3[0], b3[0]) || !blas_operand(a3[0], ta, lda) || !blas_operand(b3[0], tb, ldb)) {
    return at::matmul(a, b);
  }
  const int64_t batch = a3.size(0);
  at::Tensor c = at::empty({batch, M, N}, a.options());
  const float* ap = a3.data_ptr<float>();
  const float* bp = b3.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  std::atomic<bool> ok{true};
  parallel::for_range(0, batch, M * N * K, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (!kernels::sgemm(ta, tb, M, N, K, 1.0f, ap + i * a3.stride(0), lda, bp + i * b3.stride(0), ldb, 0.0f,
                          cp + i * M * N, N)) {
        ok = false;
      }
    }
  });
  if (!ok) return at::matmul(a, b);
  auto shape = a.sizes().vec();
  shape.back() = N;
  return c.view(shape);
}

void mm_into(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, float beta) {
  if (sgemm_into(a, b, c, beta)) return;
  if (beta == 0) {
    c.copy_(at::mm(a, b));
  } else {
    c.mul_(beta).add_(at::mm(a, b));
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // Mismatched shapes go to at::linear too, which names them.
  if (autocast_on(x) || x.numel() == 0 || weight.dim() != 2 || x.size(-1) != weight.size(1)) {
    return at::linear(x, weight, bias);
  }
  const at::Tensor rows = x.reshape({-1, weight.size(1)});  // [N, in]
  if (!fast_gemm_operands(rows, weight)) return at::linear(x, weight, bias);
  const bool record = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  at::Tensor y = record ? GemmLinear::apply(rows, weight) : nn::mm(rows, weight.t());  // [N, out]
  auto shape = x.sizes().vec();
  shape.back() = weight.size(0);
  y = y.view(shape);
  if (!bias.defined()) return y;
  return record || bias.requires_grad() ? y + bias : y.add_(bias);
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                at::Tensor* correct, int64_t chunk_elements) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) && targets.dim() == 1 &&
                  targets.size(0) == hidden.size(0),
              "linear_cross_entropy expects hidden [N, D], weight [V, D], targets [N]; got ", hidden.sizes(), ", ",
              weight.sizes(), ", ", targets.sizes());
  const bool bf16 = autocast_on(hidden) && (hidden.device().is_cpu() ? at::autocast::get_autocast_cpu_dtype()
                                                                      : at::autocast::get_autocast_gpu_dtype()) ==
                                               at::kBFloat16;
  const bool grads = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  const at::Tensor t = targets.to(at::kLong);
  // No rows (a chunk without labels) still goes through the Function: a zero loss that backward accepts.
  if (!grads) return head_loss_chunks(hidden, weight, t, bf16, chunk_elements, correct, {}, {});
  return ChunkedHeadLoss::apply(hidden, weight, t, bf16, chunk_elements, correct);
}

}  // namespace swiftcpp::nn
