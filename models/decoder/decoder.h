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
  /// [B, T] int64; default past + arange(T). M-RoPE models (rope_scaling.mrope_section) also take [3, B, T]
  /// (temporal, height, width); by default they compute them from input_ids and image_grid_thw (mrope_positions).
  at::Tensor position_ids;
  at::Tensor key_valid;          // [B, past + T] bool: false on padding keys; undefined = all valid
  at::Tensor segment_ids;        // [B, past + T] int64: packed samples; tokens attend only within their segment
  bool last_token_only = false;  // compute logits for the last position only ([B, 1, V])
  /// Vision-language models: the images of this forward, [N, C, H, W] float, in row-major order of their
  /// image-token runs in input_ids (each image fills image_seq_length positions holding image_token_index).
  at::Tensor pixel_values;
  /// [N, 3] int64 (t, h, w in patches): the grids of this forward's images, for families whose images vary in
  /// size (Qwen2-VL: pixel_values is then [sum of t h w, C T P P], the patches of every image in order).
  at::Tensor image_grid_thw;
  /// [N, F, D] (or [M, D], the rows of every image in order): the vision encoder's output for this forward's images, computed beforehand (used instead of
  /// pixel_values), so a forward that runs twice (ChunkFlow's recomputation) runs the vision tower once.
  at::Tensor image_features;
  /// [B, T, D]: used instead of looking input_ids up (and instead of pixel_values); input_ids still give B and T.
  at::Tensor inputs_embeds;
  /// Mixture of experts: when set, receives each sparse layer's router logits [B*T, E] (float32, differentiable
  /// in training), in layer order, for the load-balancing loss.
  std::vector<at::Tensor>* router_logits = nullptr;
};

/// The seam a vision-language family fills: images in, language-model input embeddings out. Its child modules
/// (e.g. vision_tower, multi_modal_projector) become top-level modules of the CausalLM that holds it, so their
/// parameters carry the checkpoint's names.
class VisionEncoderImpl : public torch::nn::Module {
 public:
  /// The images of one forward -> their features in the model dtype: [N, F, D_lm] (LLaVA: pixel_values
  /// [N, C, H, W], F = image_seq_length) or [M, D_lm], the features of every image in order (Qwen2-VL:
  /// pixel_values [patches, C T P P] with image_grid_thw [N, 3]). Throws ModelError on inputs of the wrong shape.
  virtual at::Tensor encode(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw = {}) = 0;
  /// How many language-model positions the images take (the rows encode returns), computed from shapes only.
  /// Throws ModelError when the shapes do not fit the encoder.
  virtual int64_t feature_rows(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) const = 0;
};

/// M-RoPE position ids (Hugging Face's get_rope_index for images): per row, text tokens get (n, n, n) and n
/// advances by one; a run of image tokens takes the next grid of `image_grid_thw` [N, 3] (t, h, w in patches; its
/// t h w / merge^2 tokens) and the token at merged (i, j) gets (n, n + i, n + j), then n advances by
/// max(h, w) / merge. Invalid positions (`key_valid` false; may be undefined) get 1 on every axis; `segment_ids`
/// (may be undefined) restart the count at each new segment (packed samples). Returns positions [3, B, T] int64
/// on the device of input_ids and rope_deltas [B] (max position + 1 - T, Hugging Face's rule for decode
/// positions). Throws ModelError when the image tokens do not match the grids in number.
std::pair<at::Tensor, std::vector<int64_t>> mrope_positions(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                                            const at::Tensor& key_valid, const at::Tensor& segment_ids,
                                                            int64_t image_token, int64_t merge);

/// Linear layers of one decoder block that read the same input, in forward order, each with its module path
/// inside the block (self_attn.q_proj, ...): GPTQ quantizes a block group by group.
using LinearGroup = std::vector<std::pair<std::string, nn::LinearImpl*>>;

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const DecoderConfig& config);
  /// x: [B, T, D] -> [B, T, D]. cos/sin: [B, 1, T, R] (R rotary dims); mask as nn::attention takes it.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer);

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};  // null when fused
  nn::Linear qkv_proj{nullptr};  // fused q/k/v rows (Phi-3), else null
  nn::Linear o_proj{nullptr};    // registered as ModuleNames::o_proj (Phi: dense)
  nn::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  int64_t heads_, kv_heads_, head_dim_;
  nn::ScoreOptions score_;
};
TORCH_MODULE(Attention);

/// The block's MLP: gated (down(act(gate(x)) * up(x)), gate and up optionally fused in gate_up_proj) or plain
/// (down(act(up(x)))), under the family's module names.
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const DecoderConfig& config);
  /// x: [B, T, D] -> [B, T, D]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};  // gate_proj null when plain or fused
  nn::Linear gate_up_proj{nullptr};  // fused gate/up rows (Phi-3), else null

 private:
  nn::Activation act_;
  int64_t intermediate_;
};
TORCH_MODULE(MLP);

/// A sparse mixture-of-experts block (Mixtral's block_sparse_moe, Qwen2-MoE's mlp): the router's float32 softmax
/// picks top_k experts per token (renormalised when norm_topk_prob); each expert runs on the tokens routed to it,
/// gathered by index, and its weighted output is added back by index; Qwen2-MoE's shared expert adds
/// sigmoid(shared_expert_gate(x)) * shared_expert(x) for every token.
class SparseMoeImpl : public torch::nn::Module {
 public:
  explicit SparseMoeImpl(const DecoderConfig& config);
  /// x: [B, T, D] -> [B, T, D]; the router logits [B*T, E] (float32) are kept in router_logits.
  at::Tensor forward(const at::Tensor& x);

  nn::Linear gate{nullptr};  // the router, registered as MoeConfig::router
  torch::nn::ModuleList experts{nullptr};
  MLP shared_expert{nullptr};             // Qwen2-MoE, else null
  nn::Linear shared_expert_gate{nullptr};  // Qwen2-MoE, else null
  at::Tensor router_logits;  // the last forward's [B*T, E]

 private:
  int64_t top_k_;
  bool norm_topk_;
};
TORCH_MODULE(SparseMoe);

/// Hugging Face's load-balancing loss (load_balancing_loss_func) over the router logits of every sparse layer
/// ([N, E] each, N tokens in the same order): E * sum_e f_e P_e summed over the k choices, f the fraction of
/// tokens whose k-th choice is e, P the mean router probability; tokens where `valid` [N] (bool, may be
/// undefined: all) is false are left out. A float32 scalar.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k, const at::Tensor& valid);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  /// Block `index` of the model (MoE: whether it is sparse).
  DecoderLayerImpl(const DecoderConfig& config, int64_t index);
  /// One residual block laid out as config.block says. x: [B, T, D] -> [B, T, D]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     nn::KVCache* cache, nn::ChunkKV* chunk, int64_t layer);

  /// The block's linear layers grouped by shared input, in forward order (routers left out: they stay float).
  std::vector<LinearGroup> linear_groups();
  /// The feed-forward part: x [B, T, D] -> [B, T, D].
  at::Tensor feed_forward(const at::Tensor& x) { return moe ? moe(x) : mlp(x); }

  Attention self_attn{nullptr};
  MLP mlp{nullptr};        // dense layers
  SparseMoe moe{nullptr};  // sparse layers, registered as MoeConfig::block
  nn::Norm input_layernorm{nullptr};
  nn::Norm post_attention_layernorm{nullptr};  // null in a parallel block (Phi)
  nn::Norm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // sandwich blocks (Gemma 2)

 private:
  BlockLayout block_;
  std::string mlp_name_;
};
TORCH_MODULE(DecoderLayer);

/// Hugging Face's `model` submodule: embeddings, layers, final norm.
class DecoderBodyImpl : public torch::nn::Module {
 public:
  explicit DecoderBodyImpl(const DecoderConfig& config);

  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  nn::Norm norm{nullptr};  // registered as ModuleNames::final_norm
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
                   const at::Tensor& image_features = {}, const at::Tensor& image_grid_thw = {});
  /// What the decoder body does to its input embeddings [B, T, D] before the first layer: scales them by
  /// embedding_multiplier (Gemma), cast to their dtype as Hugging Face does; the identity otherwise.
  at::Tensor scale_inputs(const at::Tensor& embeddings) const;
  /// The vision encoder (null for text models).
  const std::shared_ptr<VisionEncoderImpl>& vision() const { return vision_; }
  /// Module-path prefix of the language model: "" for text models and Qwen2-VL, "language_model." for LLaVA.
  std::string language_model_prefix() const;
  /// Whether the module or parameter at `path` belongs to the language model (not to the vision encoder's
  /// modules): what LoRA's target names and quantization select from.
  bool in_language_model(const std::string& path) const;

  /// input_ids: [B, T] int64 -> logits [B, T, V] (or [B, 1, V] with last_token_only), in the model dtype.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& options = {});

  /// Final hidden states after the last norm: input_ids [B, T] -> [B, T, D].
  at::Tensor hidden_states(const at::Tensor& input_ids, const ForwardOptions& options = {});

  /// Decoder layer `layer` alone on hidden states h [B, T, D] at positions 0..T-1, causal, no cache:
  /// [B, T, D] -> [B, T, D], what the full forward computes there (layer-by-layer passes such as GPTQ's).
  at::Tensor forward_layer(int64_t layer, const at::Tensor& h);
  /// Logits from final hidden states: [..., D] -> [..., V] (capped when final_logit_softcapping is set).
  at::Tensor logits(const at::Tensor& hidden);

  /// Whether the linear layer at `module_path` is a mixture-of-experts router or shared-expert gate (LoRA's
  /// all-linear and quantization leave those alone).
  bool is_router(const std::string& module_path) const;

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
  /// LoRA's modules_to_save: each parameter trained in full beside the adapters, with its value as loaded (PEFT's
  /// original_module), which a forward with the adapters switched off runs. Set by the adapter code; empty otherwise.
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_module_originals;  // (trainable parameter, original value)

 private:
  // M-RoPE positions [3, B, T] of a forward whose default or given positions are [B, T]: computed from the ids
  // and image grids when the forward starts its sequences (and the offsets stored in the cache), else the
  // positions plus each row's cache offset.
  at::Tensor mrope_forward_positions(const at::Tensor& input_ids, const at::Tensor& positions,
                                     const ForwardOptions& options);

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
  /// Inference only (infer, deploy, eval): integer layers keep their integers in the CPU decode kernels' layout
  /// (nn::QuantBlocks): a GGUF's Q8_0/Q4_0 tensors as they are, GPTQ-layout layers through prepare_for_inference.
  /// Off: GGUF tensors are decoded to float and GPTQ layers stay packed (training, export, merge).
  bool quantized_kernels = false;
};

/// Moves every packed integer layer (GPTQ layout) whose groups are whole 32-column blocks to the decode kernels'
/// layout (nn::QuantBlocks) on CPU models, dropping its GPTQ tensors: the model then serves inference only (it can
/// no longer train QLoRA or be saved as GPTQ). Returns the number of layers moved; others keep their packed form.
int64_t prepare_for_inference(CausalLM& model);

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
