// The typed configuration of the shared Llama-family decoder, decoded from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace swiftcpp {

class JsonObject;

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

  /// Checks the invariants between fields (GQA divisibility, positive sizes, even head_dim).
  /// Throws ConfigError naming `origin` and the offending key.
  void validate(const std::string& origin) const;
};

/// Reads the fields every Llama-family config.json shares (sizes, norms, rotary, tying, token ids).
/// Family specs call this and then add their quirks. Throws ConfigError naming the file and key.
DecoderConfig parse_llama_family_config(const JsonObject& json);

}  // namespace swiftcpp
