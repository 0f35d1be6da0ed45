// Building blocks of Llama-family decoders, named as Hugging Face names their parameters.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layer_config.h"

namespace swiftcpp {
struct PackedWeight;
}

namespace swiftcpp::nn {

/// Integer weights in the layout the CPU decode kernels read (nn/kernels.h QuantMatrix): W [rows, cols] with
/// columns in blocks of 32, W[o, i] = scales[o, b] * (q[o, i] - zeros[o, b]), the last block padded with zero
/// weights. GGUF Q8_0 / Q4_0 tensors and GPTQ-layout layers whose groups are whole blocks convert to it without
/// rounding anything.
struct QuantBlocks {
  at::Tensor q;       // uint8 [rows, blocks * 32 * bits / 8]: bits 8 one byte a column; bits 4 Q4_0's nibble order
  at::Tensor scales;  // float32 [rows, blocks]
  at::Tensor zeros;   // uint8 [rows, blocks]
  int64_t rows = 0, cols = 0, blocks = 0;
  int bits = 8;

  /// From integers q [rows, cols] in [0, 2^bits), scales [rows, blocks] and zero points [rows, blocks] (any
  /// numeric dtypes, CPU). Throws std::invalid_argument for bits other than 4 and 8 or mismatched shapes.
  static QuantBlocks from_values(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros, int bits);
  /// The same rows in another order: rows[k] of this becomes row k ([rows] int64).
  QuantBlocks select_rows(const at::Tensor& rows) const;
  /// W [rows, cols] float32 (a transient tensor).
  at::Tensor dequantize() const;
  /// Bytes held.
  int64_t nbytes() const;
};

/// y = x W^T + bias for x [..., cols] with W in QuantBlocks: a few rows (decode steps) without autograd run the
/// block kernels; otherwise W is expanded to float tile by tile and multiplied (differentiable in x).
at::Tensor quant_blocks_linear(const at::Tensor& x, const QuantBlocks& w, const at::Tensor& bias);

/// y = x W^T (+ bias) for a float weight [out, in]: a few rows (decode steps) of float32 or bfloat16 on the CPU
/// without autograd run the kernels of nn/kernels.h; anything else runs LibTorch's linear.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// Input rows up to which the decode kernels replace LibTorch's GEMM.
constexpr int64_t kKernelMaxRows = 16;

/// A low-rank adapter on a Linear (LoRA, optionally DoRA). Not registered as module parameters: the base model's
/// parameter list stays the checkpoint's, and lib/peft names these tensors in the PEFT layout.
struct LoraWeights {
  at::Tensor lora_A;     // [r, in]
  at::Tensor lora_B;     // [out, r]
  at::Tensor magnitude;  // [out], DoRA only (undefined for plain LoRA)
  double scale = 1.0;    // alpha / r, or alpha / sqrt(r) with rsLoRA
  double dropout = 0.0;  // on the adapter's input, in training mode only
};

/// y = x W^T (+ b), plus scale * B(A(dropout(x))) when a LoRA adapter is attached (PEFT's formula; DoRA
/// rescales each output row by magnitude / ||W + scale B A||, the norm taken without gradient as PEFT does).
/// Parameters `weight` [out, in] and optionally `bias` [out] start as placeholders of the right shape that own no
/// memory: they are meant to be filled from a checkpoint.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias);
  /// x: [..., in] -> [..., out]
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // empty ([0]) when `packed` holds the weight
  at::Tensor bias;  // undefined when the layer has none
  std::shared_ptr<LoraWeights> lora;  // null: a plain linear layer
  /// Integer weights in the GPTQ layout (lib/quant/packed.h), multiplied tile by tile (quant::packed_linear).
  /// Null: `weight` is used.
  std::shared_ptr<const PackedWeight> packed;
  /// Integer weights in the decode kernels' layout (inference: a GGUF's Q8_0/Q4_0 tensors, or `packed` converted
  /// by prepare_for_inference). Null: `packed` or `weight` is used.
  std::shared_ptr<const QuantBlocks> blocks;
  /// Called with each forward's input x [..., in] (GPTQ collects its Hessians this way). Empty: nothing.
  std::function<void(const at::Tensor&)> input_observer;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
};
TORCH_MODULE(Linear);

/// Linear layers that read the same input x [..., in] (q/k/v, gate/up), run together: their outputs in order. Decode
/// rows without autograd, where every layer has kernel-ready weights (float32, bfloat16 or QuantBlocks on the CPU)
/// and nothing attached (no LoRA, row adapters or input observer), share one pass over the threads; otherwise each
/// layer runs its own forward.
std::vector<at::Tensor> linear_group(const std::vector<LinearImpl*>& layers, const at::Tensor& x);

/// Token embedding table `weight` [vocab, dim] (a placeholder until a checkpoint fills it, as in Linear).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim);
  /// ids: [...] int64 -> [..., dim]
  at::Tensor forward(const at::Tensor& ids);

  at::Tensor weight;
};
TORCH_MODULE(Embedding);

/// RMSNorm as Hugging Face computes it: x [..., dim] normalised in float32, cast back to the input dtype, then
/// scaled by `weight` [dim]. With `unit_offset` (Gemma) the scale is (1 + weight), applied in float32 before the
/// cast back.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool unit_offset = false);

/// RMSNorm with its `weight` [dim] (ones at first).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  /// x: [..., dim] -> [..., dim]
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

/// A decoder norm of any NormKind: parameters `weight` [dim] (ones, or zeros with kRMSNormOffset) and, for
/// kLayerNorm, `bias` [dim], under the names Hugging Face gives them.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t dim, double eps);
  /// x: [..., dim] -> [..., dim]
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  NormKind kind;
  double eps;
};
TORCH_MODULE(Norm);

/// LayerNorm with `weight` and `bias` [dim] (placeholders until a checkpoint fills them): normalised over the last
/// dimension as torch.nn.LayerNorm does (in float32 under autocast, as LibTorch's own layer_norm).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps);
  /// x: [..., dim] -> [..., dim]
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

/// Rotary position embedding tables (rotate-half layout, as Hugging Face stores q/k).
class RotaryEmbedding {
 public:
  /// inv_freq[i] = theta^(-2i/rotary_dim) for i < rotary_dim/2, then scaled as `scaling` says. rotary_dim (0: the
  /// whole head_dim) is how many leading dimensions of each head rotate (Phi's partial rotary); the rest pass.
  RotaryEmbedding(int64_t head_dim, double theta, const RopeScaling& scaling, int64_t initial_positions,
                  int64_t rotary_dim = 0);

  /// cos and signed sin for `positions` [B, T] (int64, any device), all below `position_bound`, -> each
  /// [B, 1, T, rotary_dim] in `dtype`, for apply_rotary. Tables grow as needed (no host sync on the positions).
  /// With M-RoPE (RopeScaling::mrope_section) positions may be [3, B, T] (temporal, height, width): each
  /// frequency takes the angle of its section's axis; [B, T] then means the same position on all three.
  /// longrope: position_bound (the forward's key length) chooses the short or the long factors.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, int64_t position_bound,
                                            at::ScalarType dtype);

  /// The (scaled) inverse frequencies [rotary_dim / 2], float32 (longrope: the short ones).
  const at::Tensor& inv_freq() const { return short_.inv_freq; }

 private:
  struct Table {
    at::Tensor inv_freq;  // [rotary_dim / 2] float32, CPU
    at::Tensor cos, sin;  // [P, rotary_dim] float32 on the device last asked for; sin carries the sign
  };
  void grow(Table& table, int64_t positions, const at::Device& device) const;
  std::vector<int64_t> mrope_section_;

  int64_t rotary_dim_;
  double attention_factor_ = 1.0;
  Table short_;          // every position (longrope: forwards whose keys stay within long_from_)
  Table long_;           // longrope only
  int64_t long_from_ = 0;  // longrope: key lengths above this use long_
};

/// x * cos + rotate_half(x) * sin over the first R = cos.size(-1) dimensions of each head; the rest pass
/// unchanged. x: [B, H, T, Dh], cos/sin: [B, 1, T, R] as RotaryEmbedding::cos_sin returns them (its sine carries
/// the rotate-half sign: -sin on the first half of the rotated part).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// act(x); silu runs in place on `x` when autograd does not record (pass a tensor the caller owns).
at::Tensor activate(Activation act, at::Tensor x);

}  // namespace swiftcpp::nn
