#include "models/decoder/config.h"

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
  } else {
    fail<ConfigError>("{}: rope_scaling type '{}' is not supported (supported: default, linear, llama3)",
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
      if (!e.is_number_integer()) fail<ConfigError>("{}: '{}' must hold integers, got {}", json.origin(), key, v.dump());
      ids.push_back(e.get<int64_t>());
    }
    return ids;
  }
  return {json.get<int64_t>(key)};
}
}  // namespace

DecoderConfig parse_llama_family_config(const JsonObject& json) {
  DecoderConfig c;
  c.model_type = json.get<std::string>("model_type");
  if (json.has("architectures") && json.raw().at("architectures").is_array() &&
      !json.raw().at("architectures").empty()) {
    c.architecture = json.raw().at("architectures").at(0).get<std::string>();
  }
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
  c.bos_token_id = json.find<int64_t>("bos_token_id");
  c.eos_token_ids = parse_token_list(json, "eos_token_id");
  return c;
}

void DecoderConfig::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* key) {
    if (v <= 0) fail<ConfigError>("{}: '{}' must be > 0, got {}", origin, key, v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  if (num_attention_heads % num_key_value_heads != 0) {
    fail<ConfigError>("{}: num_key_value_heads ({}) must divide num_attention_heads ({})", origin,
                      num_key_value_heads, num_attention_heads);
  }
  if (head_dim % 2 != 0) fail<ConfigError>("{}: head_dim must be even for rotary embeddings, got {}", origin, head_dim);
  if (rms_norm_eps <= 0) fail<ConfigError>("{}: rms_norm_eps must be > 0", origin);
  if (rope_theta <= 0) fail<ConfigError>("{}: rope_theta must be > 0", origin);
  if (hidden_act != "silu" && hidden_act != "swish") {
    fail<ConfigError>("{}: hidden_act '{}' is not supported (supported: silu)", origin, hidden_act);
  }
}

}  // namespace swiftcpp
