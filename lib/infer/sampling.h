// Next-token selection: greedy or sampled with temperature, top-k, top-p, min-p, and repetition, presence and
// frequency penalties.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace swiftcpp {

/// Decoding settings, as Hugging Face generate() names them.
struct SamplingParams {
  double temperature = 1.0;         // 0: greedy (argmax)
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double min_p = 0.0;               // 0: off; keep tokens with p >= min_p * p_max
  double repetition_penalty = 1.0;  // 1: off; CTRL-style, over prompt and generated tokens
  double presence_penalty = 0.0;    // 0: off; OpenAI's: subtracted once from each generated token's logit
  double frequency_penalty = 0.0;   // 0: off; OpenAI's: subtracted per occurrence among the generated tokens
  uint64_t seed = 0;

  /// Throws ConfigError naming the field when a value is out of range, NaN or infinite.
  void validate() const;
  bool greedy() const { return temperature <= 0.0; }
  /// True when the logits are used as the model gives them (greedy without penalties: argmax alone).
  bool plain_greedy() const {
    return greedy() && repetition_penalty == 1.0 && presence_penalty == 0.0 && frequency_penalty == 0.0;
  }
};

/// Picks next tokens. Logits are processed in float32 on the CPU with a seeded generator, so a seed gives the
/// same text on every device.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  /// logits: [B, V] (any device/dtype); seen: [B, V] bool of tokens already in each sequence, prompt included
  /// (needed only with a repetition penalty, may be undefined otherwise); counts: [B, V] float32 occurrences of
  /// each token among the generated ones (needed only with a presence or frequency penalty) -> next ids [B] int64
  /// on the CPU.
  at::Tensor sample(const at::Tensor& logits, const at::Tensor& seen, const at::Tensor& counts = {});

  /// Applies the repetition, presence and frequency penalties, temperature, top-k, top-p and min-p to float32
  /// logits [B, V] and returns them; filtered entries become -inf. Exposed for tests.
  at::Tensor process(at::Tensor logits, const at::Tensor& seen, const at::Tensor& counts = {}) const;

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  at::Generator generator_;
};

}  // namespace swiftcpp
