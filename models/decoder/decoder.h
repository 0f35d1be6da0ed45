// The one Llama-family decoder every registered architecture maps onto. Module and parameter names are
// Hugging Face's (model.layers.N.self_attn.q_proj.weight, ...), so checkpoints and adapters map one to one.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "core/fs.h"
#include "models/decoder/config.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace swiftcpp {

class Checkpoint;

/// Options of one decoder forward pass.
struct ForwardOptions {
  nn::KVCache* cache = nullptr;  // when set, new K/V are written at [cache->length, +T) and the cache advances
  nn::ChunkKV* chunk = nullptr;  // ChunkFlow: attend to earlier chunks' K/V (past = chunk->past_length) and
                                 // hand this chunk's K/V back; not with `cache`
  at::Tensor position_ids;       // [B, T] int64; default past + arange(T)
  at::Tensor key_valid;          // [B, past + T] bool: false on padding keys; undefined = all valid
  at::Tensor segment_ids;        // [B, past + T] int64: packed samples; tokens attend only within their segment
  bool last_token_only = false;  // compute logits for the last position only ([B, 1, V])
  /// Vision-language models: the images of this forward, [N, C, H, W] float, in row-major order of their
  /// image-token runs in input_ids (each image fills image_seq_length positions holding image_token_index).
  at::Tensor pixel_values;
  /// [N, F, D]: the vision encoder's output for this forward's images, computed beforehand (used instead of
  /// pixel_values), so a forward that runs twice (ChunkFlow's recomputation) runs the vision tower once.
  at::Tensor image_features;
  /// [B, T, D]: used instead of looking input_ids up (and instead of pixel_values); input_ids still give B and T.
  at::Tensor inputs_embeds;
};

/// The seam a vision-language family fills: images in, language-model input embeddings out. Its child modules
/// (e.g. vision_tower, multi_modal_projector) become top-level modules of the CausalLM that holds it, so their
/// parameters carry the checkpoint's names.
class VisionEncoderImpl : public torch::nn::Module {
 public:
  /// pixel_values: [N, C, H, W] -> image features [N, F, D_lm] (F = image_seq_length) in the model dtype.
  virtual at::Tensor encode(const at::Tensor& pixel_values) = 0;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const DecoderConfig& config);
  /// x: [B, T, D] -> [B, T, D]. cos/sin: [B, 1, T, Dh]; mask as nn::attention takes it.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer);

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  nn::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const DecoderConfig& config);
  /// x: [B, T, D] -> down(silu(gate(x)) * up(x)): [B, T, D]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const DecoderConfig& config);
  /// Pre-norm residual block. x: [B, T, D] -> [B, T, D]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer);

  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

/// Hugging Face's `model` submodule: embeddings, layers, final norm.
class DecoderBodyImpl : public torch::nn::Module {
 public:
  explicit DecoderBodyImpl(const DecoderConfig& config);

  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(DecoderBody);

/// The language model of a vision-language model (`language_model`: its `model` and `lm_head`).
class LanguageModelPartImpl : public torch::nn::Module {};
TORCH_MODULE(LanguageModelPart);

/// Decoder + language-model head (`lm_head`, or the embedding matrix when tie_word_embeddings). For a
/// vision-language model (config.multimodal) the decoder and head sit under `language_model` and the vision
/// encoder's modules beside it, as Hugging Face names them; `model` and `lm_head` still point at the decoder and
/// head, so everything that runs the language model runs the same code.
class CausalLMImpl : public torch::nn::Module {
 public:
  explicit CausalLMImpl(DecoderConfig config);

  /// Input embeddings: input_ids [B, T] looked up, then, with pixel_values [N, C, H, W] (or their features
  /// [N, F, D] from vision()->encode, given as image_features), the positions holding image_token_index
  /// (row-major) replaced by the vision encoder's features -> [B, T, D]. Throws ModelError when the model has no
  /// vision encoder, or the image positions are not N * image_seq_length.
  at::Tensor embed(const at::Tensor& input_ids, const at::Tensor& pixel_values = {},
                   const at::Tensor& image_features = {});
  /// The vision encoder (null for text models).
  const std::shared_ptr<VisionEncoderImpl>& vision() const { return vision_; }
  /// Module-path prefix of the language model: "" for text models, "language_model." for LLaVA.
  std::string language_model_prefix() const;

  /// input_ids: [B, T] int64 -> logits [B, T, V] (or [B, 1, V] with last_token_only), in the model dtype.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& options = {});

  /// Final hidden states after the last norm: input_ids [B, T] -> [B, T, D].
  at::Tensor hidden_states(const at::Tensor& input_ids, const ForwardOptions& options = {});

  /// Decoder layer `layer` alone on hidden states h [B, T, D] at positions 0..T-1, causal, no cache:
  /// [B, T, D] -> [B, T, D], what the full forward computes there (layer-by-layer passes such as GPTQ's).
  at::Tensor forward_layer(int64_t layer, const at::Tensor& h);
  /// Logits from final hidden states: [..., D] -> [..., V].
  at::Tensor logits(const at::Tensor& hidden);

  /// A KV cache sized for this model.
  nn::KVCache make_cache(int64_t batch, int64_t capacity) const;

  const DecoderConfig& config() const { return config_; }
  /// True when some linear layer holds packed integer weights (a GPTQ-layout checkpoint).
  bool has_packed_weights() const;
  at::Device device() const;
  at::ScalarType dtype() const;

  /// Training memory for compute: in training mode with autograd on, each layer's activations are dropped after
  /// its forward and recomputed in backward.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  DecoderBody model{nullptr};
  nn::Linear lm_head{nullptr};  // null when tied

 private:
  std::shared_ptr<VisionEncoderImpl> vision_;
  DecoderConfig config_;
  bool gradient_checkpointing_ = false;
  std::vector<std::shared_ptr<void>> checkpoint_calls_;  // alive until the next checkpointed forward
  nn::RotaryEmbedding rotary_;
};
TORCH_MODULE(CausalLM);

/// Length the rotary tables of a new model start at (they grow with the positions used).
constexpr int64_t kInitialRotaryPositions = 4096;

/// Where and in which dtype to load a model.
struct LoadOptions {
  at::Device device = at::Device(at::kCPU);
  at::ScalarType dtype = at::kFloat;
};

/// Sets every parameter of `model` from `checkpoint` (names as Hugging Face writes them), on the device and in
/// the dtype of `options`; CPU tensors already in that dtype are used in place (copy-on-write file views).
/// Every shape is checked before anything is copied; weights that hold NaN or Inf raise a warning naming them
/// (warn_nonfinite_weights). Throws ModelError naming the checkpoint and listing missing, unexpected and misshaped
/// tensors.
void load_weights(CausalLM& model, const Checkpoint& checkpoint, const std::string& origin,
                  const LoadOptions& options = {});

/// Whether every value of a floating-point `tensor` is finite (integer and undefined tensors are). Reads the
/// tensor in chunks, without a temporary of its size. Throws nothing of its own.
bool all_finite(const at::Tensor& tensor);

/// Names of the parameters of `model` (and the scales of its packed layers) that hold NaN or Inf.
std::vector<std::string> nonfinite_weights(CausalLM& model);

/// Raises one warning (core/runtime.h's warn) naming `origin` and the tensors of `model` that hold NaN or Inf;
/// nothing when every weight is finite. load_weights and the GGUF loader call it after loading.
void warn_nonfinite_weights(CausalLM& model, const std::string& origin);

/// Reads config.json through the registry, builds the decoder and loads the safetensors weights.
/// Throws the errors of load_decoder_config, Checkpoint::open and load_weights.
CausalLM load_causal_lm(const fs::path& model_dir, const LoadOptions& options = {});

/// Parses "float32" | "bfloat16" | "float16" (and the short forms fp32, bf16, fp16). Throws ConfigError.
at::ScalarType parse_dtype(const std::string& name);
/// Parses "cpu" | "cuda" | "cuda:N". Throws ConfigError, also when CUDA is asked for but unavailable.
at::Device parse_device(const std::string& name);

}  // namespace swiftcpp
