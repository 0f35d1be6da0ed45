#include "quant/packed.h"

#include <torch/autograd.h>

#include <algorithm>

#include "core/error.h"

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
  const at::Tensor q = unpack_rows(qweight, bits);                             // [in, out]
  const at::Tensor z = unpack_rows(qzeros.t(), bits).t().add(1);               // [groups, out]
  const at::Tensor g = g_idx.to(at::kLong);
  const at::Tensor w = (q - z.index_select(0, g)).to(at::kFloat) * scales.to(at::kFloat).index_select(0, g);  // [in, out]
  return w.t().contiguous().to(dtype);                                         // [out, in]
}

at::Tensor PackedWeight::dequantize_rows(int64_t first, int64_t count, at::ScalarType dtype) const {
  const int64_t per = 32 / bits;
  TORCH_CHECK(first % per == 0 && count % per == 0, "dequantize_rows: rows ", first, "+", count, " are not whole words");
  const at::Tensor q = unpack_rows(qweight.narrow(1, first, count), bits);                            // [in, count]
  const at::Tensor z = unpack_rows(qzeros.narrow(1, first / per, count / per).t(), bits).t().add(1);  // [groups, count]
  const at::Tensor g = g_idx.to(at::kLong);
  const at::Tensor s = scales.narrow(1, first, count).to(at::kFloat);                                 // [groups, count]
  const at::Tensor w = (q - z.index_select(0, g)).to(at::kFloat) * s.index_select(0, g);              // [in, count]
  return w.t().contiguous().to(dtype);                                                                // [count, in]
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
