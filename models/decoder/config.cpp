#include "models/decoder/config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/json.h"

namespace swiftcpp {

namespace {
nn::RopeScaling parse_rope_scaling(const JsonObject& json) {
  nn::RopeScaling scaling;
  if (!json.has("rope_scaling")) return scaling;
  const JsonObject rs(json.raw().at("rope_scaling"), json.origin() + " (rope_scaling)");
  scaling.type = rs.find<std::string>("rope_type").value_or(rs.get_or<std::string>("type", "default"));
  if (scaling.type == "default") return scaling;
  if (scaling.type == "linear") {
    scaling.factor = rs.get<double>("factor");
  } else if (scaling.type == "llama3") {
    scaling.factor = rs.get<double>("factor");
    scaling.low_freq_factor = rs.get<double>("low_freq_factor");
    scaling.high_freq_factor = rs.get<double>("high_freq_factor");
    scaling.original_max_position_embeddings = rs.get<int64_t>("original_max_position_embeddings");
  } else if (scaling.type == "longrope" || scaling.type == "su") {
    // Phi-3: per-frequency factors, short and long, switched at original_max_position_embeddings; cos and sin
    // scaled by attention_factor (default sqrt(1 + ln(s) / ln(original)), s = max / original positions).
    scaling.type = "longrope";
    const auto factors = [&](const char* key) {
      std::vector<double> out;
      const Json& v = rs.raw().contains(key) ? rs.raw().at(key) : Json();
      if (!v.is_array()) fail<ConfigError>("{}: rope_scaling.{} must be a list of numbers", json.origin(), key);
      for (const Json& e : v) {
        if (!e.is_number()) fail<ConfigError>("{}: rope_scaling.{} must hold numbers, got {}", json.origin(), key, describe_json(e));
        out.push_back(e.get<double>());
      }
      return out;
    };
    scaling.short_factor = factors("short_factor");
    scaling.long_factor = factors("long_factor");
    scaling.original_max_position_embeddings = rs.find<int64_t>("original_max_position_embeddings")
                                                   .value_or(json.get<int64_t>("original_max_position_embeddings"));
    const int64_t positions = json.get_or<int64_t>("max_position_embeddings", 2048);
    if (scaling.original_max_position_embeddings <= 1 || positions <= 0) {
      fail<ConfigError>("{}: longrope needs original_max_position_embeddings > 1 and max_position_embeddings > 0",
                        json.origin());
    }
    const double s = static_cast<double>(positions) / static_cast<double>(scaling.original_max_position_embeddings);
    scaling.attention_factor = rs.find<double>("attention_factor").value_or(
        s <= 1.0 ? 1.0
                 : std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(scaling.original_max_position_embeddings))));
    return scaling;
  } else {
    fail<ConfigError>("{}: rope_scaling type '{}' is not supported (supported: default, linear, llama3, longrope)",
                      json.origin(), scaling.type);
  }
  if (scaling.factor <= 0) fail<ConfigError>("{}: rope_scaling.factor must be > 0", json.origin());
  return scaling;
}

std::vector<int64_t> parse_token_list(const JsonObject& json, const std::string& key) {
  if (!json.has(key)) return {};
  const Json& v = json.raw().at(key);
  if (v.is_array()) {
    std::vector<int64_t> ids;
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail<ConfigError>("{}: '{}' must hold integers, got {}", json.origin(), key, describe_json(e));
      ids.push_back(e.get<int64_t>());
    }
    return ids;
  }
  return {json.get<int64_t>(key)};
}
}  // namespace

std::vector<std::string> architecture_names(const JsonObject& json) {
  std::vector<std::string> out;
  if (!json.has("architectures")) return out;
  const Json& names = json.raw().at("architectures");
  if (!names.is_array()) {
    fail<ConfigError>("{}: key 'architectures' must be a list of strings, got {}", json.origin(), describe_json(names));
  }
  for (const Json& name : names) {
    if (!name.is_string()) {
      fail<ConfigError>("{}: key 'architectures' must hold strings, got {}", json.origin(), describe_json(name));
    }
    out.push_back(name.get<std::string>());
  }
  return out;
}

void refuse_key(const JsonObject& json, const std::string& key, const std::string& what) {
  const std::string value = json.raw().contains(key) ? describe_json(json.raw().at(key)) : std::string("(absent)");
  fail<ConfigError>("{}: key '{}' is {}: {} is not supported", json.origin(), key, value, what);
}

DecoderConfig parse_llama_family_config(const JsonObject& json) {
  DecoderConfig c;
  c.model_type = json.get<std::string>("model_type");
  if (const std::vector<std::string> names = architecture_names(json); !names.empty()) c.architecture = names.front();
  c.vocab_size = json.get<int64_t>("vocab_size");
  c.hidden_size = json.get<int64_t>("hidden_size");
  c.intermediate_size = json.get<int64_t>("intermediate_size");
  c.num_hidden_layers = json.get<int64_t>("num_hidden_layers");
  c.num_attention_heads = json.get<int64_t>("num_attention_heads");
  c.num_key_value_heads = json.get_or<int64_t>("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads <= 0) fail<ConfigError>("{}: num_attention_heads must be > 0", json.origin());
  c.head_dim = json.get_or<int64_t>("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = json.get_or<int64_t>("max_position_embeddings", 2048);
  c.rms_norm_eps = json.get_or<double>("rms_norm_eps", 1e-6);
  c.rope_theta = json.get_or<double>("rope_theta", 10000.0);
  c.rope_scaling = parse_rope_scaling(json);
  c.tie_word_embeddings = json.get_or<bool>("tie_word_embeddings", false);
  // Llama's and Qwen3's attention_bias puts biases on q, k, v and o; families may override (Qwen2).
  c.qkv_bias = json.get_or<bool>("attention_bias", false);
  c.o_bias = c.qkv_bias;
  c.hidden_act = json.get_or<std::string>("hidden_act", "silu");
  c.activation = nn::parse_activation(c.hidden_act, json.origin());
  c.bos_token_id = json.find<int64_t>("bos_token_id");
  c.eos_token_ids = parse_token_list(json, "eos_token_id");
  return c;
}

void DecoderConfig::validate(const std::string& origin) const {
  // Every size first, against a bound far above any published checkpoint: nothing below is computed (and nothing
  // is allocated) from a size that is not in its range.
  auto bounded = [&](int64_t v, const char* key, int64_t limit) {
    if (v <= 0) fail<ConfigError>("{}: '{}' must be > 0, got {}", origin, key, v);
    if (v > limit) fail<ConfigError>("{}: '{}' is {}; at most {} is supported", origin, key, v, limit);
  };
  bounded(vocab_size, "vocab_size", kMaxVocabSize);
  bounded(hidden_size, "hidden_size", kMaxHiddenSize);
  bounded(intermediate_size, "intermediate_size", kMaxIntermediateSize);
  bounded(num_hidden_layers, "num_hidden_layers", kMaxLayers);
  bounded(num_attention_heads, "num_attention_heads", kMaxHeads);
  bounded(num_key_value_heads, "num_key_value_heads", kMaxHeads);
  bounded(head_dim, "head_dim", kMaxHeadDim);
  bounded(max_position_embeddings, "max_position_embeddings", kMaxPositions);
  if (sliding_window < 0 || sliding_window > kMaxPositions) {
    fail<ConfigError>("{}: 'sliding_window' must be in [0, {}], got {}", origin, kMaxPositions, sliding_window);
  }
  if (!layer_windows.empty()) {
    if (static_cast<int64_t>(layer_windows.size()) != num_hidden_layers) {
      fail<ConfigError>("{}: {} per-layer sliding windows for {} layers", origin, layer_windows.size(), num_hidden_layers);
    }
    for (int64_t w : layer_windows) {
      if (w < 0 || w > kMaxPositions) {
        fail<ConfigError>("{}: 'sliding_window' must be in [0, {}], got {}", origin, kMaxPositions, w);
      }
    }
  }
  if (moe.num_experts > 0) {
    bounded(moe.num_experts, "num_experts", kMaxExperts);
    bounded(moe.top_k, "num_experts_per_tok", moe.num_experts);
    bounded(moe.intermediate_size, "moe_intermediate_size", kMaxIntermediateSize);
    if (moe.shared_intermediate_size < 0 || moe.shared_intermediate_size > kMaxIntermediateSize) {
      fail<ConfigError>("{}: 'shared_expert_intermediate_size' must be in [0, {}], got {}", origin,
                        kMaxIntermediateSize, moe.shared_intermediate_size);
    }
    if (static_cast<int64_t>(moe.sparse_layers.size()) != num_hidden_layers) {
      fail<ConfigError>("{}: {} sparse-layer flags for {} layers", origin, moe.sparse_layers.size(), num_hidden_layers);
    }
    if (!(moe.router_aux_loss_coef >= 0) || !std::isfinite(moe.router_aux_loss_coef)) {
      fail<ConfigError>("{}: 'router_aux_loss_coef' must be a finite number >= 0, got {}", origin,
                        moe.router_aux_loss_coef);
    }
  }
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0) {
    fail<ConfigError>("{}: the rotary width (partial_rotary_factor x head_dim) must be even and at most head_dim {}, "
                      "got {}", origin, head_dim, rotary_dim);
  }
  for (const auto& [key, v] : {std::pair<const char*, double>{"attention scale (query_pre_attn_scalar)", attention_scale},
                               {"attn_logit_softcapping", attn_logit_softcapping},
                               {"final_logit_softcapping", final_logit_softcapping},
                               {"embedding multiplier", embedding_multiplier}}) {
    if (!(v >= 0) || !std::isfinite(v)) fail<ConfigError>("{}: {} must be a finite number >= 0, got {}", origin, key, v);
  }
  if (rope_scaling.type == "llama3" && (rope_scaling.original_max_position_embeddings <= 0 ||
                                        rope_scaling.original_max_position_embeddings > kMaxPositions)) {
    fail<ConfigError>("{}: 'rope_scaling.original_max_position_embeddings' must be in [1, {}], got {}", origin,
                      kMaxPositions, rope_scaling.original_max_position_embeddings);
  }
  const int64_t count = parameter_count();
  if (count < 0 || count > kMaxParameters) {
    fail<ConfigError>("{}: the sizes describe a model of {} parameters; at most {} are supported (vocab_size {}, "
                      "hidden_size {}, intermediate_size {}, num_hidden_layers {}, num_attention_heads {}, head_dim {})",
                      origin, count < 0 ? std::string("more than 2^63") : std::to_string(count), kMaxParameters,
                      vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, head_dim);
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    fail<ConfigError>("{}: num_key_value_heads ({}) must divide num_attention_heads ({})", origin,
                      num_key_value_heads, num_attention_heads);
  }
  if (head_dim % 2 != 0) fail<ConfigError>("{}: head_dim must be even for rotary embeddings, got {}", origin, head_dim);
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    fail<ConfigError>("{}: 'rms_norm_eps' must be a finite number > 0, got {}", origin, rms_norm_eps);
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    fail<ConfigError>("{}: 'rope_theta' must be a finite number > 0, got {}", origin, rope_theta);
  }
  if (rope_scaling.type != "default") {
    for (const auto& [key, v] : {std::pair<const char*, double>{"factor", rope_scaling.factor},
                                 {"low_freq_factor", rope_scaling.low_freq_factor},
                                 {"high_freq_factor", rope_scaling.high_freq_factor}}) {
      if (!std::isfinite(v)) fail<ConfigError>("{}: 'rope_scaling.{}' must be a finite number, got {}", origin, key, v);
    }
    if (!(rope_scaling.factor > 0)) {
      fail<ConfigError>("{}: 'rope_scaling.factor' must be > 0, got {}", origin, rope_scaling.factor);
    }
  }
}

int64_t DecoderConfig::parameter_count() const {
  // Checked arithmetic throughout: -1 on overflow, so absurd sizes cannot wrap into a small count.
  CheckedCount n;
  const auto mul = [&](int64_t a, int64_t b) { return n.mul(a, b); };
  const auto add = [&](int64_t a, int64_t b) { return n.add(a, b); };
  const int64_t q = mul(mul(num_attention_heads, head_dim), hidden_size);
  const int64_t kv = mul(mul(num_key_value_heads, head_dim), hidden_size);
  int64_t layer = add(add(q, q), add(kv, kv));                 // q, o; k, v
  const int64_t norms = block == BlockLayout::kParallel ? 1 : block == BlockLayout::kSandwich ? 4 : 2;
  layer = add(layer, mul(norms, hidden_size));
  const int64_t dense = mul(mlp == MlpKind::kGated ? 3 : 2, mul(hidden_size, intermediate_size));  // gate, up, down
  int64_t sparse = 0;  // router, experts, shared expert and its gate
  if (moe.num_experts > 0) {
    sparse = add(mul(moe.num_experts, hidden_size), mul(moe.num_experts, mul(3, mul(hidden_size, moe.intermediate_size))));
    if (moe.shared_intermediate_size > 0) {  // the shared expert and its one-row gate
      sparse = add(sparse, add(mul(3, mul(hidden_size, moe.shared_intermediate_size)), hidden_size));
    }
  }
  // Counted, not looped over: num_hidden_layers may be any value before validate() bounds it.
  int64_t sparse_layers = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(moe.sparse_layers.size()); ++i) sparse_layers += moe.sparse(i) ? 1 : 0;
  sparse_layers = std::min(sparse_layers, std::max<int64_t>(num_hidden_layers, 0));
  int64_t total = mul(layer, num_hidden_layers);
  total = add(total, add(mul(dense, num_hidden_layers - sparse_layers), mul(sparse, sparse_layers)));
  const int64_t embedding = mul(vocab_size, hidden_size);
  total = add(total, tie_word_embeddings ? embedding : add(embedding, embedding));
  total = add(total, hidden_size);  // final norm
  if (multimodal) total = add(total, multimodal->parameter_count);  // bounded by the family's own checks
  return n.overflow ? -1 : total;
}

}  // namespace swiftcpp
