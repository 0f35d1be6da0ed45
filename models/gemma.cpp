// Gemma and Gemma 2: (1 + w) RMSNorm, embeddings scaled by sqrt(hidden_size), GeGLU, tied head; Gemma 2 adds
// sandwich norms, query_pre_attn_scalar, attention and final-logit soft-capping and alternating sliding layers.
#include <cmath>

#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
// What both generations share. transformers reads `hidden_activation` and falls back to the tanh GELU when it is
// null (the older `hidden_act` key is then ignored).
DecoderConfig parse_gemma_common(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.hidden_act = json.get_or<std::string>("hidden_activation", "gelu_pytorch_tanh");
  c.activation = nn::parse_activation(c.hidden_act, json.origin() + " (hidden_activation)");
  c.norm = nn::NormKind::kRMSNormOffset;
  c.embedding_multiplier = std::sqrt(static_cast<double>(c.hidden_size));
  c.tie_word_embeddings = json.get_or<bool>("tie_word_embeddings", true);
  return c;
}

DecoderConfig parse_gemma(const JsonObject& json) { return parse_gemma_common(json); }

DecoderConfig parse_gemma2(const JsonObject& json) {
  DecoderConfig c = parse_gemma_common(json);
  c.block = BlockLayout::kSandwich;
  const double scalar = json.get_or<double>("query_pre_attn_scalar", 224.0);
  if (!(scalar > 0)) fail<ConfigError>("{}: query_pre_attn_scalar must be > 0, got {}", json.origin(), scalar);
  c.attention_scale = 1.0 / std::sqrt(scalar);
  c.attn_logit_softcapping = json.get_or<double>("attn_logit_softcapping", 0.0);
  c.final_logit_softcapping = json.get_or<double>("final_logit_softcapping", 0.0);
  // Even layers attend within the window (sliding_window keys, the query's own included), odd layers globally.
  const int64_t window = json.get_or<int64_t>("sliding_window", 4096);
  if (window <= 0) fail<ConfigError>("{}: sliding_window must be > 0, got {}", json.origin(), window);
  for (int64_t i = 0; i < c.num_hidden_layers && i < kMaxLayers; ++i) c.layer_windows.push_back(i % 2 == 0 ? window : 0);
  return c;
}
}  // namespace

ArchitectureSpec gemma_spec() {
  return {"gemma", {"GemmaForCausalLM"}, "Gemma ((1 + w) RMSNorm, scaled embeddings, GeGLU)", &parse_gemma};
}

ArchitectureSpec gemma2_spec() {
  return {"gemma2", {"Gemma2ForCausalLM"}, "Gemma 2 (sandwich norms, soft-capping, alternating sliding window)",
          &parse_gemma2};
}

}  // namespace swiftcpp
