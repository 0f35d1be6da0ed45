// StarCoder2: LayerNorm with bias, biases everywhere (use_bias), a plain GELU MLP (c_fc, c_proj), sliding window.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_starcoder2(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.hidden_act = json.get_or<std::string>("hidden_act", "gelu_pytorch_tanh");
  c.activation = nn::parse_activation(c.hidden_act, json.origin());
  c.norm = nn::NormKind::kLayerNorm;
  c.rms_norm_eps = json.get_or<double>("norm_epsilon", 1e-5);
  c.mlp = MlpKind::kPlain;
  c.names.up_proj = "c_fc";
  c.names.down_proj = "c_proj";
  const bool bias = json.get_or<bool>("use_bias", true);
  c.qkv_bias = c.o_bias = c.mlp_bias = bias;
  c.tie_word_embeddings = json.get_or<bool>("tie_word_embeddings", true);
  // transformers 4.40's eager mask lets a query see sliding_window keys behind it plus itself.
  const int64_t window = json.get_or<int64_t>("sliding_window", 0);
  if (window < 0) fail<ConfigError>("{}: sliding_window must be >= 0 or null", json.origin());
  c.sliding_window = window > 0 ? window + 1 : 0;
  return c;
}
}  // namespace

ArchitectureSpec starcoder2_spec() {
  return {"starcoder2", {"Starcoder2ForCausalLM"}, "StarCoder2 (LayerNorm, biases, GELU MLP, sliding window)",
          &parse_starcoder2};
}

}  // namespace swiftcpp
