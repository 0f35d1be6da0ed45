// Mixtures of experts on the shared decoder: Mixtral (every block sparse, renormalised top-k, experts w1/w3/w2
// under block_sparse_moe) and Qwen2-MoE (raw top-k probabilities, a sigmoid-gated shared expert, sparse layers by
// decoder_sparse_step and mlp_only_layers, q/k/v biases).
#include <algorithm>

#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
// The router settings both families share.
void parse_router(const JsonObject& json, DecoderConfig& c) {
  c.moe.top_k = json.get_or<int64_t>("num_experts_per_tok", 2);
  c.moe.router_aux_loss_coef = json.get_or<double>("router_aux_loss_coef", 0.001);
  c.moe.output_router_logits = json.get_or<bool>("output_router_logits", false);
  if (json.get_or<double>("router_jitter_noise", 0.0) != 0.0) {
    refuse_key(json, "router_jitter_noise", "multiplicative noise on the router's input in training");
  }
}

DecoderConfig parse_mixtral(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.sliding_window = json.get_or<int64_t>("sliding_window", 0);
  if (c.sliding_window < 0) fail<ConfigError>("{}: sliding_window must be >= 0 or null", json.origin());
  parse_router(json, c);
  c.moe.num_experts = json.get_or<int64_t>("num_local_experts", 8);
  c.moe.norm_topk_prob = true;
  c.moe.intermediate_size = c.intermediate_size;
  c.moe.sparse_layers.assign(static_cast<size_t>(std::clamp<int64_t>(c.num_hidden_layers, 0, kMaxLayers)), true);
  c.moe.block = "block_sparse_moe";
  c.moe.gate_proj = "w1";
  c.moe.up_proj = "w3";
  c.moe.down_proj = "w2";
  return c;
}

DecoderConfig parse_qwen2_moe(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.qkv_bias = true;
  c.o_bias = false;
  if (json.get_or<bool>("use_sliding_window", false)) {
    refuse_key(json, "use_sliding_window", "a sliding window in Qwen2-MoE (layers past max_window_layers)");
  }
  parse_router(json, c);
  c.moe.num_experts = json.get_or<int64_t>("num_experts", 60);
  c.moe.norm_topk_prob = json.get_or<bool>("norm_topk_prob", false);
  c.moe.intermediate_size = json.get_or<int64_t>("moe_intermediate_size", 1408);
  c.moe.shared_intermediate_size = json.get_or<int64_t>("shared_expert_intermediate_size", 5632);
  const int64_t step = json.get_or<int64_t>("decoder_sparse_step", 1);
  if (step <= 0) fail<ConfigError>("{}: decoder_sparse_step must be > 0, got {}", json.origin(), step);
  const auto dense_only = json.get_or<std::vector<int64_t>>("mlp_only_layers", {});
  const int64_t layers = std::clamp<int64_t>(c.num_hidden_layers, 0, kMaxLayers);
  for (int64_t i = 0; i < layers; ++i) {
    const bool listed = std::find(dense_only.begin(), dense_only.end(), i) != dense_only.end();
    c.moe.sparse_layers.push_back(!listed && c.moe.num_experts > 0 && (i + 1) % step == 0);
  }
  return c;
}
}  // namespace

ArchitectureSpec mixtral_spec() {
  return {"mixtral", {"MixtralForCausalLM"}, "Mixtral (sparse mixture of experts)", &parse_mixtral};
}

ArchitectureSpec qwen2_moe_spec() {
  return {"qwen2_moe", {"Qwen2MoeForCausalLM"}, "Qwen1.5-MoE / Qwen2-MoE (experts + gated shared expert)",
          &parse_qwen2_moe};
}

}  // namespace swiftcpp
