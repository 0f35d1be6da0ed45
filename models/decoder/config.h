// The typed configuration of the shared Llama-family decoder, decoded from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layer_config.h"

namespace swiftcpp {

class JsonObject;
class VisionEncoderImpl;

/// Products and sums of sizes read from a config.json, with overflow remembered instead of wrapped, so absurd
/// sizes cannot turn into a small parameter count.
struct CheckedCount {
  bool overflow = false;
  int64_t mul(int64_t a, int64_t b) {
    int64_t r = 0;
    overflow = overflow || __builtin_mul_overflow(a, b, &r);
    return r;
  }
  int64_t add(int64_t a, int64_t b) {
    int64_t r = 0;
    overflow = overflow || __builtin_add_overflow(a, b, &r);
    return r;
  }
};

/// What a vision-language model adds around its language model (LLaVA: vision tower -> aligner -> LLM; Qwen2-VL:
/// visual.{patch_embed, blocks} -> visual.merger -> LLM): where each part lives in the module tree (Hugging Face's
/// module paths, so freezing and LoRA targets speak the checkpoint's names), how images enter the token sequence,
/// and how the family builds its vision encoder. How many tokens an image becomes is the image processor's to
/// say (vision::ImageProcessor); image_seq_length is only the fixed count of families that have one.
struct MultimodalConfig {
  /// Module path of the language model; "" when its `model` and `lm_head` sit at the top (Qwen2-VL).
  std::string language_model = "language_model";
  std::vector<std::string> vision_tower = {"vision_tower"};       // module paths frozen by freeze_vit
  std::vector<std::string> aligner = {"multi_modal_projector"};   // module paths frozen by freeze_aligner
  int64_t image_token_index = -1;  // the id whose positions receive image features
  int64_t video_token_id = -1;     // the id a video's positions hold (Qwen2-VL's <|video_pad|>); -1: none
  /// What each image placeholder ("<image>") becomes in the rendered text before tokenising: the family's own
  /// markup, holding the image token once (Qwen2-VL: "<|vision_start|><|image_pad|><|vision_end|>").
  std::string image_markup = "<image>";
  int64_t image_seq_length = 0;    // fixed-count families (LLaVA-1.5): features per image; 0: per image
  int64_t image_size = 0;          // fixed-size families: the square input resolution; 0: any size
  int64_t num_channels = 3;
  /// M-RoPE families: the token that opens an image (vision_start_token_id) and the side of the patch blocks
  /// merged into one token (spatial_merge_size): image tokens get (t, h, w) positions from image_grid_thw.
  int64_t vision_start_token_id = -1;
  int64_t spatial_merge_size = 1;
  /// Builds the family's vision encoder (uninitialised weights; load_weights fills them). Its child modules are
  /// registered at the top of the model under their own names (vision_tower, multi_modal_projector; visual).
  std::function<std::shared_ptr<VisionEncoderImpl>()> make_encoder;
  /// Parameters of the vision tower and aligner, for parameter_count() and the size checks.
  int64_t parameter_count = 0;
};

// Bounds of the config.json sizes validate() accepts: far above any published checkpoint (the largest dense
// Llama-family models have vocabularies of 256k, hidden sizes of 16k, 126 layers and contexts of 1M), low enough
// that shapes and products of them cannot overflow and that nothing absurd is built or allocated.
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;         // 16,777,216
constexpr int64_t kMaxHiddenSize = int64_t{1} << 20;        // 1,048,576
constexpr int64_t kMaxIntermediateSize = int64_t{1} << 22;  // 4,194,304
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 24;         // max_position_embeddings, sliding_window
constexpr int64_t kMaxParameters = int64_t{1} << 40;        // 1,099,511,627,776 (parameter_count())

/// How a decoder block combines attention and MLP.
enum class BlockLayout {
  kSequential,  // h = x + attn(norm1(x)); out = h + mlp(norm2(h))  (Llama)
  kParallel,    // out = x + attn(norm1(x)) + mlp(norm1(x)); no second norm  (Phi)
  kSandwich,    // h = x + post_attn_norm(attn(norm1(x))); out = h + post_ff_norm(mlp(pre_ff_norm(h)))  (Gemma 2)
};

/// The MLP of the decoder blocks.
enum class MlpKind {
  kGated,  // down(act(gate(x)) * up(x))  (Llama, Gemma, Phi-3 with gate_up_proj fused)
  kPlain,  // down(act(up(x)))            (StarCoder2's c_fc/c_proj, Phi's fc1/fc2)
};

/// Hugging Face module names that differ between families (module paths inside a block, and the final norm).
struct ModuleNames {
  std::string o_proj = "o_proj";        // Phi: dense
  std::string qkv_proj = "qkv_proj";    // fused q/k/v (Phi-3), when DecoderConfig::fused_qkv
  std::string mlp = "mlp";
  std::string gate_proj = "gate_proj";
  std::string up_proj = "up_proj";      // kPlain: the input projection (c_fc, fc1)
  std::string down_proj = "down_proj";  // kPlain: the output projection (c_proj, fc2)
  std::string gate_up_proj = "gate_up_proj";  // fused gate/up (Phi-3), when DecoderConfig::fused_gate_up
  std::string final_norm = "norm";      // Phi: final_layernorm
};

/// Mixture-of-experts feed-forward blocks (Mixtral, Qwen2-MoE): a router picks top_k of num_experts gated MLPs per
/// token; Qwen2-MoE adds an always-on shared expert scaled by a sigmoid gate.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: every block is dense
  int64_t top_k = 0;        // num_experts_per_tok
  bool norm_topk_prob = true;  // the top-k probabilities renormalised to sum to 1 (Mixtral), or raw (Qwen2-MoE)
  int64_t intermediate_size = 0;         // each expert's FFN width
  int64_t shared_intermediate_size = 0;  // the shared expert's width (0: none)
  double router_aux_loss_coef = 0;       // weight of the load-balancing loss in training
  bool output_router_logits = false;     // whether training adds the load-balancing loss (as transformers does)
  /// Per layer: whether it is sparse (decoder_sparse_step, mlp_only_layers); dense layers use the plain MLP of
  /// DecoderConfig::intermediate_size.
  std::vector<bool> sparse_layers;
  // Hugging Face names: the block (Mixtral: block_sparse_moe), its router, experts list and each expert's linears.
  std::string block = "mlp";
  std::string router = "gate";
  std::string experts = "experts";
  std::string gate_proj = "gate_proj", up_proj = "up_proj", down_proj = "down_proj";  // Mixtral: w1, w3, w2
  std::string shared_expert = "shared_expert";
  std::string shared_expert_gate = "shared_expert_gate";

  bool sparse(int64_t layer) const {
    return num_experts > 0 && layer >= 0 && layer < static_cast<int64_t>(sparse_layers.size()) &&
           sparse_layers[static_cast<size_t>(layer)];
  }
};

/// Everything the shared decoder needs to know about one checkpoint.
struct DecoderConfig {
  std::string model_type;      // registry key: llama, mistral, qwen2, qwen3, gemma, ...
  std::string architecture;    // e.g. LlamaForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  // every norm's epsilon (rms_norm_eps, norm_epsilon, layer_norm_eps)
  double rope_theta = 10000.0;
  nn::RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;          // biases on q/k/v projections (Qwen2; Llama's attention_bias)
  bool o_bias = false;            // bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;          // biases on gate/up/down (Llama's mlp_bias)
  bool qk_norm = false;           // per-head RMSNorm of q and k before rotary (Qwen3)
  int64_t sliding_window = 0;     // 0: full causal attention; else a query sees the keys fewer than this behind it
  /// Per layer (empty: every layer uses sliding_window): that layer's window, 0 for full attention (Gemma 2
  /// alternates windowed and global layers).
  std::vector<int64_t> layer_windows;
  std::string hidden_act = "silu";
  nn::Activation activation = nn::Activation::kSilu;  // hidden_act decoded (parse_llama_family_config)
  nn::NormKind norm = nn::NormKind::kRMSNorm;  // the blocks' norms and the final norm
  BlockLayout block = BlockLayout::kSequential;
  MlpKind mlp = MlpKind::kGated;
  ModuleNames names;
  bool fused_qkv = false;         // one qkv_proj [q + k + v rows, D] instead of q/k/v_proj (Phi-3)
  bool fused_gate_up = false;     // one gate_up_proj [2 I, D] instead of gate/up_proj (Phi-3)
  int64_t rotary_dim = 0;         // leading dims of each head that rotate (0: head_dim; Phi: partial_rotary_factor)
  double attention_scale = 0;     // scores' scale (0: 1/sqrt(head_dim); Gemma 2: query_pre_attn_scalar^-0.5)
  double attn_logit_softcapping = 0;   // 0: none; else scores -> c tanh(scores / c) (Gemma 2)
  double final_logit_softcapping = 0;  // 0: none; else logits -> c tanh(logits / c) (Gemma 2)
  double embedding_multiplier = 0;     // 0: none; else the input embeddings are scaled by it (Gemma: sqrt(hidden))
  bool lm_head_bias = false;      // Phi
  MoeConfig moe;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  /// Set for vision-language models (model_type llava): the language model above is then the text part, and
  /// model_type / architecture name the composite.
  std::shared_ptr<const MultimodalConfig> multimodal;

  /// Checks every size against its bound (kMax* above), the parameter count against kMaxParameters, the
  /// invariants between fields (GQA divisibility, even head_dim) and that the floating-point settings are finite.
  /// Throws ConfigError naming `origin`, the offending key and the limit.
  void validate(const std::string& origin) const;

  /// The sliding window of layer `layer` (0: full attention).
  int64_t window(int64_t layer) const {
    return layer_windows.empty() ? sliding_window : layer_windows[static_cast<size_t>(layer)];
  }

  /// Weights of the embeddings, the linear layers (biases aside), the norms and an untied lm_head, computed in
  /// checked arithmetic: -1 when the count does not fit an int64.
  int64_t parameter_count() const;
};

/// The `architectures` list of a config.json (empty when absent or null). Throws ConfigError naming the file when
/// it is not a list of strings.
std::vector<std::string> architecture_names(const JsonObject& json);

/// Throws ConfigError naming the file, `key` and its value: the key asks for `what`, which changes the computation
/// and which the decoder does not implement. Specs call it rather than ignore such a setting.
[[noreturn]] void refuse_key(const JsonObject& json, const std::string& key, const std::string& what);

/// Reads the fields every Llama-family config.json shares (sizes, norms, rotary, tying, token ids).
/// Family specs call this and then add their quirks. Throws ConfigError naming the file and key.
DecoderConfig parse_llama_family_config(const JsonObject& json);

}  // namespace swiftcpp
