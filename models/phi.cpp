// Phi-2 (`phi`): parallel attention and MLP over one LayerNorm, partial rotary, biases everywhere (the LM head
// too), a plain GELU MLP (fc1, fc2); Phi-3 (`phi3`): Llama layout with fused qkv_proj and gate_up_proj and the
// longrope rotary scaling.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_phi(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  if (json.get_or<bool>("qk_layernorm", false)) refuse_key(json, "qk_layernorm", "a LayerNorm on q and k");
  c.hidden_act = json.get_or<std::string>("hidden_act", "gelu_new");
  c.activation = nn::parse_activation(c.hidden_act, json.origin());
  c.norm = nn::NormKind::kLayerNorm;
  c.rms_norm_eps = json.get_or<double>("layer_norm_eps", 1e-5);
  c.block = BlockLayout::kParallel;
  c.mlp = MlpKind::kPlain;
  c.names.o_proj = "dense";
  c.names.up_proj = "fc1";
  c.names.down_proj = "fc2";
  c.names.final_norm = "final_layernorm";
  c.qkv_bias = c.o_bias = c.mlp_bias = c.lm_head_bias = true;
  const double factor = json.get_or<double>("partial_rotary_factor", 0.5);
  if (!(factor > 0 && factor <= 1)) {
    fail<ConfigError>("{}: partial_rotary_factor must be in (0, 1], got {}", json.origin(), factor);
  }
  c.rotary_dim = static_cast<int64_t>(factor * static_cast<double>(c.head_dim));  // int() as transformers does
  return c;
}

DecoderConfig parse_phi3(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  if (json.has("partial_rotary_factor") && json.get<double>("partial_rotary_factor") != 1.0) {
    refuse_key(json, "partial_rotary_factor", "partial rotary in a Phi-3 checkpoint");
  }
  c.fused_qkv = true;
  c.fused_gate_up = true;
  // transformers' eager attention ignores sliding_window for Phi-3 (only its flash-attention path reads it); the
  // reference logits are eager, so the window is not applied here either.
  return c;
}
}  // namespace

ArchitectureSpec phi_spec() {
  return {"phi", {"PhiForCausalLM"}, "Phi-2 (parallel block, partial rotary, LayerNorm, biases)", &parse_phi};
}

ArchitectureSpec phi3_spec() {
  return {"phi3", {"Phi3ForCausalLM"}, "Phi-3 (fused qkv and gate_up, longrope)", &parse_phi3};
}

}  // namespace swiftcpp
