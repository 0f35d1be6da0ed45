// The values a decoder's layers are configured with (norm kind, rotary scaling, activation), apart from the layers
// themselves (nn/layers.h), so that configuration code reads them without LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace swiftcpp::nn {

/// The kinds of norm decoder blocks use.
enum class NormKind {
  kRMSNorm,        // weight * x / rms(x) (Llama)
  kRMSNormOffset,  // (1 + weight) * x / rms(x), scaled in float32 (Gemma, Gemma 2)
  kLayerNorm,      // LayerNorm with weight and bias (StarCoder2, Phi)
};

/// How rotary frequencies are scaled for long contexts (config.json `rope_scaling`).
struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | longrope
  double factor = 1.0;
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, longrope
  // longrope (Phi-3): per-frequency divisors [rotary_dim / 2]; the long ones apply to every position of a forward
  // whose keys reach past original_max_position_embeddings, the short ones otherwise. cos and sin are scaled by
  // attention_factor with both.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  /// M-RoPE (Qwen2-VL): frequencies [0, s0) rotate by the temporal position, [s0, s0 + s1) by the height and the
  /// rest by the width position (2 (s0 + s1 + s2) = rotary_dim); empty: one position per token.
  std::vector<int64_t> mrope_section;
};

/// Activation functions of decoder MLPs, by their Hugging Face names.
enum class Activation {
  kSilu,      // silu, swish
  kGeluTanh,  // gelu_pytorch_tanh, gelu_new, gelu_fast: the tanh approximation
  kGelu,      // gelu: the exact erf form
};
/// Parses a hidden_act / hidden_activation value. Throws ConfigError naming `origin` and the supported names.
Activation parse_activation(const std::string& name, const std::string& origin);

}  // namespace swiftcpp::nn
