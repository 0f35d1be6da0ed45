// The CLIP vision tower (Hugging Face's CLIPVisionModel), as vision-language models use it: patch and position
// embeddings, pre-norm, pre-LN encoder layers, and the hidden states of any layer.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "nn/layers.h"

namespace swiftcpp {

class JsonObject;

/// CLIPVisionConfig: the fields the tower uses. Defaults are the class defaults transformers fills in for keys a
/// config.json leaves out (it writes nested configs as a diff).
struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  int64_t num_channels = 3;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // quick_gelu | gelu (erf) | gelu_new / gelu_pytorch_tanh (tanh)

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  /// Parameters of the tower (post_layernorm included), computed in checked arithmetic: -1 on overflow.
  int64_t parameter_count() const;
  /// Bounds and invariants (image_size a multiple of patch_size, head divisibility, finite eps, a known act).
  /// Throws ConfigError naming `origin` and the key.
  void validate(const std::string& origin) const;
};

/// Reads a `vision_config` object (keys absent take the defaults above). Throws ConfigError naming the key.
ClipVisionConfig parse_clip_vision_config(const JsonObject& json);

/// The activation `name` (quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, relu, silu) applied to x.
at::Tensor apply_activation(const std::string& name, const at::Tensor& x);

class ClipAttentionImpl : public torch::nn::Module {
 public:
  explicit ClipAttentionImpl(const ClipVisionConfig& config);
  /// Bidirectional multi-head attention over all positions. x: [N, P, D] -> [N, P, D]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  int64_t heads_, head_dim_;
};
TORCH_MODULE(ClipAttention);

class ClipMLPImpl : public torch::nn::Module {
 public:
  explicit ClipMLPImpl(const ClipVisionConfig& config);
  /// x: [N, P, D] -> fc2(act(fc1(x))): [N, P, D]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(ClipMLP);

class ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderLayerImpl(const ClipVisionConfig& config);
  /// x + attn(ln1(x)), then + mlp(ln2(.)). [N, P, D] -> [N, P, D]
  at::Tensor forward(const at::Tensor& x);

  nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  ClipAttention self_attn{nullptr};
  ClipMLP mlp{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

/// `embeddings`: class_embedding [D], patch_embedding.weight [D, C, p, p] (a convolution with stride p, no bias),
/// position_embedding.weight [P + 1, D].
class ClipEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ClipEmbeddingsImpl(const ClipVisionConfig& config);
  /// pixel_values [N, C, H, W] -> [N, 1 + P, D]: the class embedding, then the patches row by row, plus positions.
  at::Tensor forward(const at::Tensor& pixel_values);

  at::Tensor class_embedding;
  at::Tensor patch_embedding_weight;  // registered as patch_embedding.weight
  nn::Embedding position_embedding{nullptr};

 private:
  int64_t patch_size_;
};
TORCH_MODULE(ClipEmbeddings);

/// CLIPVisionTransformer (`vision_model`): embeddings, pre_layrnorm (Hugging Face's spelling), encoder.layers,
/// post_layernorm.
class ClipVisionTransformerImpl : public torch::nn::Module {
 public:
  explicit ClipVisionTransformerImpl(const ClipVisionConfig& config);

  /// Hugging Face's hidden_states[index] (0: the embeddings after pre_layrnorm, i: the output of encoder layer
  /// i - 1; negative counts from the end, -1 being the last layer's output), running only the layers it needs.
  /// pixel_values [N, C, H, W] -> [N, 1 + P, D]. Throws ModelError when index is out of range.
  at::Tensor hidden_state(const at::Tensor& pixel_values, int64_t index);

  ClipEmbeddings embeddings{nullptr};
  nn::LayerNorm pre_layrnorm{nullptr}, post_layernorm{nullptr};
  torch::nn::Module* encoder = nullptr;  // holds `layers`
  torch::nn::ModuleList layers{nullptr};

 private:
  ClipVisionConfig config_;
};
TORCH_MODULE(ClipVisionTransformer);

/// CLIPVisionModel: `vision_model`.
class ClipVisionModelImpl : public torch::nn::Module {
 public:
  explicit ClipVisionModelImpl(const ClipVisionConfig& config);
  ClipVisionTransformer vision_model{nullptr};
};
TORCH_MODULE(ClipVisionModel);

}  // namespace swiftcpp
