// Weight-only integer quantisation in the Hugging Face GPTQ layout (AutoGPTQ / optimum "gptq" checkpoint format):
// for a linear layer with weight W [out, in], `bits` in {4, 8} and `group_size` input columns per group,
//   qweight int32 [in * bits / 32, out]      32 / bits consecutive input rows of the integer matrix Q^T per int32,
//                                            the first in the lowest bits
//   qzeros  int32 [in / group, out * bits / 32]  zero points minus one (the format's convention), packed along out
//   scales  float16 [in / group, out]
//   g_idx   int32 [in]                       the group of each input column (i / group_size without act-order)
// and W[o, i] = scales[g_idx[i], o] * (Q[o, i] - zeros[g_idx[i], o]).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace swiftcpp {
namespace nn {
struct QuantBlocks;
}

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
  /// Output rows [first, first + count) of W: [count, in] in `dtype`. `first` and `count` must be multiples of
  /// 32 / bits (whole int32 words of qzeros).
  at::Tensor dequantize_rows(int64_t first, int64_t count, at::ScalarType dtype) const;
  /// Output rows per tile in packed_linear: about 2^21 weights per tile, whole int32 words of qzeros.
  int64_t tile_rows() const;
};

/// x [..., in] -> x W^T [..., out] (+ bias [out]) without ever holding W whole: each tile of tile_rows() output
/// rows is dequantised, multiplied and dropped. Differentiable in x (backward dequantises the tiles again and
/// keeps nothing but the packed tensors), so a frozen packed base trains adapters above it (QLoRA); the packed
/// weights themselves get no gradient.
at::Tensor packed_linear(const at::Tensor& x, const std::shared_ptr<const PackedWeight>& packed, const at::Tensor& bias);

/// The same integers, scales and zero points in the decode kernels' layout (nn::QuantBlocks, exact); null when a
/// 32-column block would span two groups (act-order, or a group size that is not a multiple of 32) or the tensors
/// are not on the CPU.
std::shared_ptr<const nn::QuantBlocks> to_quant_blocks(const PackedWeight& packed);

/// Packs integers [rows, cols] (each in [0, 2^bits)) along dim 0: -> int32 [rows * bits / 32, cols].
at::Tensor pack_rows(const at::Tensor& values, int64_t bits);
/// The inverse: int32 [rows * bits / 32, cols] -> int32 [rows, cols].
at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits);

/// Round-to-nearest quantisation of W [out, in] (any float dtype). Throws ConfigError when bits is not 4 or 8 or
/// group_size does not divide `in`, naming `name`.
PackedWeight quantize_rtn(const at::Tensor& weight, const QuantSpec& spec, const std::string& name);

/// Integer matrix, scales and zero points from per-group min/max (sym: +-max|w|), as GPTQ's quantizer computes
/// them: scale = (max - min) / (2^bits - 1), zero = round(-min / scale) (sym: 2^(bits-1)), then made storable:
/// the scale rounded to float16, the zero point clamped to [1, 2^bits - 1] (the layout stores zero - 1).
/// w: [out, columns]. Returns {scale [out], zero [out]} in float32.
std::pair<at::Tensor, at::Tensor> group_scale_zero(const at::Tensor& w, int64_t bits, bool sym);

/// Packs Q [out, in] (int), scales [groups, out], zeros [groups, out] (int) into the layout above. g_idx [in]
/// (int) names each input column's group; undefined: column i is in group i / group_size.
PackedWeight pack_gptq(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros, int64_t bits,
                       int64_t group_size, const at::Tensor& g_idx = {});

/// Checks that a layer W [out, in] can be stored with `spec` (bits 4 or 8, the group size divides `in`, `out`
/// fills whole int32 words) and returns the group size in columns. Throws ConfigError naming `name`.
int64_t checked_group_size(int64_t out, int64_t in, const QuantSpec& spec, const std::string& name);

}  // namespace swiftcpp
