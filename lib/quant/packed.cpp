#include "quant/packed.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "nn/kernels.h"
#include "nn/layers.h"

namespace swiftcpp {

at::Tensor pack_rows(const at::Tensor& values, int64_t bits) {
  const int64_t per = 32 / bits, rows = values.size(0), cols = values.size(1);
  TORCH_CHECK(rows % per == 0, "pack_rows: ", rows, " rows do not divide into ", per, " per int32");
  // [rows / per, per, cols] << (bits * k), summed over k (disjoint bits: a sum is an or). int64 so the top nibble
  // does not overflow, then reinterpreted as int32.
  const at::Tensor v = values.to(at::kLong).view({rows / per, per, cols});
  const at::Tensor shifts = (at::arange(per, at::kLong) * bits).to(values.device()).view({1, per, 1});
  const at::Tensor packed = at::bitwise_left_shift(v, shifts).sum(1);  // [rows / per, cols], values in [0, 2^32)
  return packed.where(packed < (int64_t{1} << 31), packed - (int64_t{1} << 32)).to(at::kInt);
}

at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits) {
  const int64_t per = 32 / bits, mask = (int64_t{1} << bits) - 1;
  const at::Tensor p = packed.to(at::kLong).bitwise_and(int64_t{0xFFFFFFFF}).unsqueeze(1);  // [R, 1, cols]
  const at::Tensor shifts = (at::arange(per, at::kLong) * bits).to(packed.device()).view({1, per, 1});
  return at::bitwise_right_shift(p, shifts).bitwise_and(mask).reshape({packed.size(0) * per, packed.size(1)}).to(at::kInt);
}

at::Tensor PackedWeight::dequantize(at::ScalarType dtype) const {
  return dequantize_rows(0, out_features, dtype).contiguous();  // [out, in]
}

namespace {

// Scales and zero points of output columns [first, first + count) as float32: {[groups, count], [groups, count]}.
std::pair<at::Tensor, at::Tensor> column_params(const PackedWeight& p, int64_t first, int64_t count) {
  const int64_t per = 32 / p.bits;
  const at::Tensor s = p.scales.narrow(1, first, count).to(at::kFloat).contiguous();
  const at::Tensor z = unpack_rows(p.qzeros.narrow(1, first / per, count / per).t(), p.bits).t().add(1);
  return {s, z.to(at::kFloat).contiguous()};
}

// The CPU kernels below read the packed words directly (no intermediate integer tensors).
bool cpu_kernels(const PackedWeight& p) {
  return p.qweight.is_cpu() && p.qweight.scalar_type() == at::kInt && p.qweight.is_contiguous() &&
         p.g_idx.scalar_type() == at::kInt && p.g_idx.is_contiguous();
}

// dst[i, c] = s[g[i], c] * (q(i, c) - z[g[i], c]) for input rows [i0, i1) and `count` columns, q(i, c) the bits of
// input i in word row[c] (row = the packed row of i). Compiled for AVX-512, AVX2 and plain x86-64; the loader picks.
// ThreadSanitizer builds take the plain version: the loader runs the clones' resolver before the sanitizer's runtime
// is initialised, and the instrumented resolver then crashes at start-up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SWIFTCPP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SWIFTCPP_CLONES
#endif

SWIFTCPP_CLONES
void dequantize_block(const int32_t* qweight, int64_t out_features, int64_t first, int64_t count, const int32_t* g_idx,
                      const float* scales, const float* zeros, int64_t bits, int64_t i0, int64_t i1, float* dst) {
  const int64_t per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = i0; i < i1; ++i) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(qweight + (i / per) * out_features + first);
    const uint32_t shift = static_cast<uint32_t>(bits * (i % per));
    const float* s = scales + static_cast<int64_t>(g_idx[i]) * count;
    const float* z = zeros + static_cast<int64_t>(g_idx[i]) * count;
    float* d = dst + (i - i0) * count;
    for (int64_t c = 0; c < count; ++c) d[c] = s[c] * (static_cast<float>((row[c] >> shift) & mask) - z[c]);
  }
}

// acc[m, c] += sum over inputs i of the group [i0, i1) of x[m, i] q(i, c), then y[m, c] += s[c] * (acc - z[c] *
// sum_i x[m, i]); `x` rows have stride `in`. One group of contiguous inputs (no act-order).
SWIFTCPP_CLONES
void gemv_group(const int32_t* qweight, int64_t out_features, int64_t first, int64_t count, const float* s,
                const float* z, int64_t bits, int64_t i0, int64_t i1, const float* x, int64_t rows, int64_t in,
                float* acc, float* y) {
  const int64_t per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t m = 0; m < rows; ++m) {
    float* a = acc + m * count;
    for (int64_t c = 0; c < count; ++c) a[c] = 0;
    float xsum = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const float xv = x[m * in + i];
      xsum += xv;
      const uint32_t* row = reinterpret_cast<const uint32_t*>(qweight + (i / per) * out_features + first);
      const uint32_t shift = static_cast<uint32_t>(bits * (i % per));
      for (int64_t c = 0; c < count; ++c) a[c] += xv * static_cast<float>((row[c] >> shift) & mask);
    }
    float* out = y + m * count;
    for (int64_t c = 0; c < count; ++c) out[c] += s[c] * (a[c] - z[c] * xsum);
  }
}

// W^T [in, count] (float32) for output columns [first, first + count), on the CPU.
at::Tensor dequantize_columns_cpu(const PackedWeight& p, int64_t first, int64_t count) {
  const auto [s, z] = column_params(p, first, count);
  at::Tensor w = at::empty({p.in_features, count}, at::kFloat);
  const int32_t* q = p.qweight.data_ptr<int32_t>();
  const int32_t* g = p.g_idx.data_ptr<int32_t>();
  const float* sp = s.data_ptr<float>();
  const float* zp = z.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  parallel::for_range(0, p.in_features, count, [&](int64_t i0, int64_t i1) {
    dequantize_block(q, p.out_features, first, count, g, sp, zp, p.bits, i0, i1, wp + i0 * count);
  });
  return w;
}

// y [rows, out] = x [rows, in] W^T for a few rows (decoding), on the CPU, never forming W: the packed words are
// read once per row and column block. Groups of contiguous inputs (no act-order) multiply the integers first and
// apply scale and zero point once per group; act-order layers dequantise each input row of a block on the fly.
at::Tensor packed_gemv_cpu(const PackedWeight& p, const at::Tensor& x) {
  const int64_t rows = x.size(0), in = p.in_features, out = p.out_features;
  const auto [s, z] = column_params(p, 0, out);  // [groups, out]
  const int64_t groups = s.size(0), group = in / groups;
  const int32_t* g = p.g_idx.data_ptr<int32_t>();
  bool ordered = in % groups == 0;
  for (int64_t i = 0; i < in && ordered; ++i) ordered = g[i] == i / group;
  at::Tensor y = at::zeros({rows, out}, at::kFloat);
  const int32_t* q = p.qweight.data_ptr<int32_t>();
  const float* xp = x.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* zp = z.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t kBlock = 256;  // output columns per task: the accumulators stay in L1
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  parallel::for_range(0, blocks, rows * kBlock * in, [&](int64_t b0, int64_t b1) {
    std::vector<float> acc(static_cast<size_t>(rows * kBlock)), part(static_cast<size_t>(rows * kBlock));
    std::vector<float> tile;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = b * kBlock, count = std::min(kBlock, out - first);
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (ordered) {
        std::vector<float> sg(static_cast<size_t>(count)), zg(static_cast<size_t>(count));
        for (int64_t gi = 0; gi < groups; ++gi) {
          std::copy(sp + gi * out + first, sp + gi * out + first + count, sg.begin());
          std::copy(zp + gi * out + first, zp + gi * out + first + count, zg.begin());
          gemv_group(q, out, first, count, sg.data(), zg.data(), p.bits, gi * group, (gi + 1) * group, xp, rows, in,
                     part.data(), acc.data());
        }
      } else {
        // Dequantise 64 input rows of this column block at a time, then multiply.
        constexpr int64_t kRows = 64;
        std::vector<float> sb(static_cast<size_t>(groups * count)), zb(static_cast<size_t>(groups * count));
        for (int64_t gi = 0; gi < groups; ++gi) {
          std::copy(sp + gi * out + first, sp + gi * out + first + count, sb.begin() + gi * count);
          std::copy(zp + gi * out + first, zp + gi * out + first + count, zb.begin() + gi * count);
        }
        tile.resize(static_cast<size_t>(kRows * count));
        for (int64_t i0 = 0; i0 < in; i0 += kRows) {
          const int64_t i1 = std::min(in, i0 + kRows);
          dequantize_block(q, out, first, count, g, sb.data(), zb.data(), p.bits, i0, i1, tile.data());
          for (int64_t m = 0; m < rows; ++m) {
            float* a = acc.data() + m * count;
            for (int64_t i = i0; i < i1; ++i) {
              const float xv = xp[m * in + i];
              const float* w = tile.data() + (i - i0) * count;
              for (int64_t c = 0; c < count; ++c) a[c] += xv * w[c];
            }
          }
        }
      }
      for (int64_t m = 0; m < rows; ++m) std::copy(acc.begin() + m * count, acc.begin() + (m + 1) * count, yp + m * out + first);
    }
  });
  return y;
}

}  // namespace

at::Tensor PackedWeight::dequantize_rows(int64_t first, int64_t count, at::ScalarType dtype) const {
  const int64_t per = 32 / bits;
  TORCH_CHECK(first % per == 0 && count % per == 0, "dequantize_rows: rows ", first, "+", count, " are not whole words");
  if (cpu_kernels(*this)) return dequantize_columns_cpu(*this, first, count).t().to(dtype);  // [count, in] (a view)
  const at::Tensor q = unpack_rows(qweight.narrow(1, first, count), bits);                    // [in, count]
  const auto [s, z] = column_params(*this, first, count);                                    // [groups, count]
  const at::Tensor g = g_idx.to(at::kLong);
  const at::Tensor w = (q.to(at::kFloat) - z.index_select(0, g)) * s.index_select(0, g);      // [in, count]
  return w.t().to(dtype);                                                                     // [count, in]
}

int64_t PackedWeight::tile_rows() const {
  const int64_t per = 32 / bits;
  const int64_t rows = std::max<int64_t>(per, ((int64_t{1} << 21) / std::max<int64_t>(in_features, 1)) / per * per);
  return std::min(rows, out_features);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

PackedWeight packed_from(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                         const at::Tensor& g_idx, int64_t bits, int64_t out) {
  PackedWeight p;
  p.qweight = qweight;
  p.qzeros = qzeros;
  p.scales = scales;
  p.g_idx = g_idx;
  p.bits = bits;
  p.in_features = g_idx.size(0);
  p.out_features = out;
  return p;
}

// y = x W^T tile by tile; backward: dx = sum over tiles dy[..., tile] W[tile, :], the tiles dequantised again.
class PackedLinearFn : public torch::autograd::Function<PackedLinearFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& qweight,
                            const at::Tensor& qzeros, const at::Tensor& scales, const at::Tensor& g_idx, int64_t bits,
                            int64_t out) {
    const PackedWeight p = packed_from(qweight, qzeros, scales, g_idx, bits, out);
    ctx->save_for_backward({qweight, qzeros, scales, g_idx});
    ctx->saved_data["bits"] = bits;
    ctx->saved_data["out"] = out;
    // A few rows (decoding) on the CPU: straight from the packed words. More rows: dequantised tiles and GEMM.
    constexpr int64_t kGemvRows = 8;
    if (cpu_kernels(p) && x.numel() <= kGemvRows * p.in_features) {
      auto shape = x.sizes().vec();
      shape.back() = out;
      const at::Tensor x2 = x.reshape({-1, p.in_features}).to(at::kFloat).contiguous();
      return packed_gemv_cpu(p, x2).to(x.scalar_type()).view(shape);  // [..., out]
    }
    const int64_t tile = p.tile_rows();
    const bool one_row = x.numel() == p.in_features;  // a decode step: gemv, as nn::Linear does
    const at::Tensor row = one_row ? x.reshape({-1}) : at::Tensor();
    std::vector<at::Tensor> parts;
    for (int64_t o = 0; o < out; o += tile) {
      const int64_t n = std::min(tile, out - o);
      const at::Tensor w = p.dequantize_rows(o, n, x.scalar_type());  // [n, in]
      parts.push_back(one_row ? at::mv(w, row) : at::matmul(x, w.t()));
    }
    at::Tensor y = parts.size() == 1 ? parts[0] : at::cat(parts, -1);
    if (one_row) {
      auto shape = x.sizes().vec();
      shape.back() = out;
      y = y.view(shape);
    }
    return y;  // [..., out]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const PackedWeight p = packed_from(saved[0], saved[1], saved[2], saved[3], ctx->saved_data["bits"].toInt(),
                                       ctx->saved_data["out"].toInt());
    const at::Tensor& dy = grads[0];  // [..., out]
    const int64_t tile = p.tile_rows();
    at::Tensor dx;
    for (int64_t o = 0; o < p.out_features; o += tile) {
      const int64_t n = std::min(tile, p.out_features - o);
      const at::Tensor part = at::matmul(dy.narrow(-1, o, n), p.dequantize_rows(o, n, dy.scalar_type()));
      dx = dx.defined() ? dx.add_(part) : part;
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor packed_linear(const at::Tensor& x, const std::shared_ptr<const PackedWeight>& packed, const at::Tensor& bias) {
  const PackedWeight& p = *packed;
  at::Tensor y = PackedLinearFn::apply(x, p.qweight, p.qzeros, p.scales, p.g_idx, p.bits, p.out_features);
  return bias.defined() ? y + bias : y;
}

std::pair<at::Tensor, at::Tensor> group_scale_zero(const at::Tensor& w, int64_t bits, bool sym) {
  const double maxq = static_cast<double>((int64_t{1} << bits) - 1);
  at::Tensor lo = w.amin(1).clamp_max(0), hi = w.amax(1).clamp_min(0);  // the range always holds 0
  if (sym) {
    hi = at::maximum(lo.abs(), hi);
    lo = -hi;
  }
  const at::Tensor empty = (lo == 0) & (hi == 0);
  lo = lo.where(~empty, at::full_like(lo, -1));
  hi = hi.where(~empty, at::full_like(hi, 1));
  // The scale is stored as float16: quantise against what will be read back.
  const at::Tensor scale = ((hi - lo) / maxq).to(at::kHalf).to(at::kFloat);
  // The format stores zero - 1, so a zero point of 0 cannot be written (AutoGPTQ's v1 checkpoints corrupt it):
  // zero points start at 1, at the cost of the top level when a group has no negative weight.
  const at::Tensor zero = (sym ? at::full_like(scale, (maxq + 1) / 2) : (-lo / scale).round()).clamp(1, maxq);
  return {scale, zero};
}

PackedWeight pack_gptq(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                       int64_t group_size, const at::Tensor& g_idx) {
  PackedWeight p;
  p.bits = bits;
  p.out_features = q.size(0);
  p.in_features = q.size(1);
  p.qweight = pack_rows(q.t().contiguous(), bits);                          // [in * bits / 32, out]
  p.qzeros = pack_rows((zeros.to(at::kLong) - 1).t().contiguous(), bits).t().contiguous();  // [groups, out * bits / 32]
  p.scales = scales.to(at::kHalf).contiguous();
  p.g_idx = g_idx.defined() ? g_idx.to(at::kInt).contiguous()
                            : (at::arange(p.in_features, at::kLong) / group_size).to(at::kInt);
  return p;
}

std::shared_ptr<const nn::QuantBlocks> to_quant_blocks(const PackedWeight& p) {
  if (!p.qweight.is_cpu()) return nullptr;
  constexpr int64_t kBlock = kernels::kBlock;
  const int64_t in = p.in_features, blocks = (in + kBlock - 1) / kBlock;
  // Each block's group, from its first column; every column of the block must share it.
  at::Tensor g = p.g_idx.to(at::kLong);                                              // [in]
  if (blocks * kBlock != in) g = at::cat({g, g.narrow(0, in - 1, 1).expand({blocks * kBlock - in})});
  const at::Tensor per_block = g.view({blocks, kBlock});
  const at::Tensor first = per_block.select(1, 0).contiguous();                      // [blocks]
  if (!per_block.eq(first.unsqueeze(1)).all().item<bool>()) return nullptr;
  const at::Tensor q = unpack_rows(p.qweight, p.bits).t();                         // [out, in]
  const at::Tensor zeros = unpack_rows(p.qzeros.t(), p.bits).t().add(1);          // [groups, out]
  const at::Tensor scales = p.scales.to(at::kFloat);                                // [groups, out]
  return std::make_shared<const nn::QuantBlocks>(nn::QuantBlocks::from_values(
      q, scales.index_select(0, first).t(), zeros.index_select(0, first).t(), static_cast<int>(p.bits)));
}

int64_t checked_group_size(int64_t out, int64_t in, const QuantSpec& spec, const std::string& name) {
  if (spec.bits != 4 && spec.bits != 8) fail<ConfigError>("{}: bits must be 4 or 8 (got {})", name, spec.bits);
  const int64_t group = spec.group_size > 0 ? spec.group_size : in;
  if (in % group != 0) {
    fail<ConfigError>("{}: group size {} does not divide its {} input columns", name, group, in);
  }
  if (out % (32 / spec.bits) != 0) {
    fail<ConfigError>("{}: {} output rows do not pack {} to an int32", name, out, 32 / spec.bits);
  }
  return group;
}

PackedWeight quantize_rtn(const at::Tensor& weight, const QuantSpec& spec, const std::string& name) {
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t group = checked_group_size(out, in, spec, name);
  const double maxq = static_cast<double>((int64_t{1} << spec.bits) - 1);
  const at::Tensor w = weight.to(at::kFloat);
  std::vector<at::Tensor> qs, scales, zeros;
  for (int64_t g = 0; g < in / group; ++g) {
    const at::Tensor block = w.narrow(1, g * group, group);  // [out, group]
    const auto [scale, zero] = group_scale_zero(block, spec.bits, spec.sym);
    qs.push_back((block / scale.unsqueeze(1)).round().add(zero.unsqueeze(1)).clamp(0, maxq).to(at::kInt));
    scales.push_back(scale);
    zeros.push_back(zero.to(at::kInt));
  }
  return pack_gptq(at::cat(qs, 1), at::stack(scales), at::stack(zeros), spec.bits, group);
}

}  // namespace swiftcpp
