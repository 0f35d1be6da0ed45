// The typed configuration of the shared Llama-family decoder, decoded from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

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

/// What a vision-language model adds around its language model (LLaVA: vision tower -> aligner -> LLM): where
/// each part lives in the module tree (Hugging Face's module paths, so freezing and LoRA targets speak the
/// checkpoint's names), how images enter the token sequence, and how the family builds its vision encoder.
struct MultimodalConfig {
  std::string language_model = "language_model";                 // module path of the language model
  std::vector<std::string> vision_tower = {"vision_tower"};       // module paths frozen by freeze_vit
  std::vector<std::string> aligner = {"multi_modal_projector"};   // module paths frozen by freeze_aligner
  int64_t image_token_index = -1;  // the id whose positions receive image features
  int64_t image_seq_length = 0;    // language-model positions (features) per image
  int64_t image_size = 0;          // the square input resolution the vision tower takes
  int64_t num_channels = 3;
  /// Builds the family's vision encoder (uninitialised weights; load_weights fills them). Its child modules are
  /// registered at the top of the model under their own names (vision_tower, multi_modal_projector).
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
constexpr int64_t kMaxPositions = int64_t{1} << 24;         // max_position_embeddings, sliding_window
constexpr int64_t kMaxParameters = int64_t{1} << 40;        // 1,099,511,627,776 (parameter_count())

/// Everything the shared decoder needs to know about one checkpoint.
struct DecoderConfig {
  std::string model_type;      // registry key: llama, mistral, qwen2, qwen3
  std::string architecture;    // e.g. LlamaForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  nn::RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;          // biases on q/k/v projections (Qwen2; Llama's attention_bias)
  bool o_bias = false;            // bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;          // biases on gate/up/down (Llama's mlp_bias)
  bool qk_norm = false;           // per-head RMSNorm of q and k before rotary (Qwen3)
  int64_t sliding_window = 0;     // 0: full causal attention
  std::string hidden_act = "silu";
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  /// Set for vision-language models (model_type llava): the language model above is then the text part, and
  /// model_type / architecture name the composite.
  std::shared_ptr<const MultimodalConfig> multimodal;

  /// Checks every size against its bound (kMax* above), the parameter count against kMaxParameters, the
  /// invariants between fields (GQA divisibility, even head_dim) and that the floating-point settings are finite.
  /// Throws ConfigError naming `origin`, the offending key and the limit.
  void validate(const std::string& origin) const;

  /// Weights of the embeddings, the linear layers (biases aside), the norms and an untied lm_head, computed in
  /// checked arithmetic: -1 when the count does not fit an int64.
  int64_t parameter_count() const;
};

/// The `architectures` list of a config.json (empty when absent or null). Throws ConfigError naming the file when
/// it is not a list of strings.
std::vector<std::string> architecture_names(const JsonObject& json);

/// Reads the fields every Llama-family config.json shares (sizes, norms, rotary, tying, token ids).
/// Family specs call this and then add their quirks. Throws ConfigError naming the file and key.
DecoderConfig parse_llama_family_config(const JsonObject& json);

}  // namespace swiftcpp
