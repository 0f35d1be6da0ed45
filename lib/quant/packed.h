// Weight-only integer quantisation in the Hugging Face GPTQ layout (AutoGPTQ / optimum "gptq" checkpoint format):
// for a linear layer with weight W [out, in], `bits` in {4, 8} and `group_size` input columns per group,
//   qweight int32 [in * bits / 32, out]      32 / bits consecutive input rows of the integer matrix Q^T per int32,
//                                            the first in the lowest bits
//   qzeros  int32 [in / group, out * bits / 32]  zero points minus one (the format's convention), packed along out
//   scales  float16 [in / group, out]
//   g_idx   int32 [in]                       the group of each input column (i / group_size without act-order)
// and W[o, i] = scales[g_idx[i], o] * (Q[o, i] - zeros[g_idx[i], o]).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace swiftcpp {

struct QuantSpec {
  int64_t bits = 4;
  int64_t group_size = 128;  // -1: one group over all input columns (per output channel)
  bool sym = true;           // symmetric: zero point 2^(bits-1); else min/max with a zero point per group
};

/// A packed layer and how to expand it.
struct PackedWeight {
  at::Tensor qweight, qzeros, scales, g_idx;  // as above, CPU or device
  int64_t bits = 4;
  int64_t in_features = 0, out_features = 0;

  /// W [out, in] in `dtype` on the tensors' device (a transient tensor; nothing is cached).
  at::Tensor dequantize(at::ScalarType dtype) const;
};

/// Packs integers [rows, cols] (each in [0, 2^bits)) along dim 0: -> int32 [rows * bits / 32, cols].
at::Tensor pack_rows(const at::Tensor& values, int64_t bits);
/// The inverse: int32 [rows * bits / 32, cols] -> int32 [rows, cols].
at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits);

/// Round-to-nearest quantisation of W [out, in] (any float dtype). Throws ConfigError when bits is not 4 or 8 or
/// group_size does not divide `in`, naming `name`.
PackedWeight quantize_rtn(const at::Tensor& weight, const QuantSpec& spec, const std::string& name);

/// Integer matrix, scales and zero points from per-group min/max (sym: +-max|w|), as GPTQ's quantizer computes
/// them: scale = (max - min) / (2^bits - 1), zero = round(-min / scale) (sym: 2^(bits-1)). w: [out, columns].
/// Returns {scale [out], zero [out]} in float32.
std::pair<at::Tensor, at::Tensor> group_scale_zero(const at::Tensor& w, int64_t bits, bool sym);

/// Packs Q [out, in] (int), scales [groups, out], zeros [groups, out] (int) into the layout above.
PackedWeight pack_gptq(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                       int64_t group_size);

}  // namespace swiftcpp
