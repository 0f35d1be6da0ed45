#include "infer/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace swiftcpp {

void SamplingParams::validate() const {
  // Written so that NaN fails every range (each comparison with NaN is false); Inf is refused explicitly.
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    fail<ConfigError>("temperature must be a finite number >= 0 (0 = greedy), got {}", temperature);
  }
  if (top_k < 0) fail<ConfigError>("top_k must be >= 0 (0 = off), got {}", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail<ConfigError>("top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0 && min_p < 1)) fail<ConfigError>("min_p must be in [0, 1), got {}", min_p);
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    fail<ConfigError>("repetition_penalty must be a finite number > 0, got {}", repetition_penalty);
  }
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    fail<ConfigError>("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    fail<ConfigError>("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  }
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), generator_(at::make_generator<at::CPUGeneratorImpl>(params.seed)) {
  params_.validate();
}

at::Tensor Sampler::process(at::Tensor logits, const at::Tensor& seen, const at::Tensor& counts) const {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (params_.repetition_penalty != 1.0 && seen.defined()) {
    // CTRL / Hugging Face: a seen token's logit is divided by the penalty when positive, multiplied when not.
    const at::Tensor penalised = at::where(logits > 0, logits / params_.repetition_penalty,
                                           logits * params_.repetition_penalty);
    logits = at::where(seen, penalised, logits);
  }
  if ((params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) && counts.defined()) {
    // OpenAI / vLLM: logit -= frequency * count + presence * (count > 0), over the generated tokens.
    logits = logits - counts * params_.frequency_penalty - counts.gt(0).to(logits.scalar_type()) * params_.presence_penalty;
  }
  if (params_.greedy()) return logits;
  if (params_.temperature != 1.0) logits = logits / params_.temperature;
  const int64_t V = logits.size(-1);
  if (params_.top_k > 0 && params_.top_k < V) {
    const at::Tensor kth = std::get<0>(logits.topk(params_.top_k, -1)).narrow(-1, params_.top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (params_.top_p < 1.0) {
    // Keep the smallest set of most likely tokens whose probability reaches top_p (at least one).
    auto [sorted, order] = logits.sort(-1, /*descending=*/true);
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    at::Tensor drop_sorted = (cumulative - sorted.softmax(-1)) >= params_.top_p;
    const at::Tensor drop = at::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    logits = logits.masked_fill(drop, neg_inf);
  }
  if (params_.min_p > 0.0) {
    const at::Tensor probs = logits.softmax(-1);
    const at::Tensor threshold = std::get<0>(probs.max(-1, /*keepdim=*/true)) * params_.min_p;
    logits = logits.masked_fill(probs < threshold, neg_inf);
  }
  return logits;
}

at::Tensor Sampler::sample(const at::Tensor& logits, const at::Tensor& seen, const at::Tensor& counts) {
  // logits: [B, V] -> float32 CPU
  at::Tensor x = logits.to(at::kCPU, at::kFloat);
  x = process(x, seen.defined() ? seen.to(at::kCPU) : seen, counts.defined() ? counts.to(at::kCPU, at::kFloat) : counts);
  if (params_.greedy()) return x.argmax(-1);
  const at::Tensor probs = x.softmax(-1);
  return at::multinomial(probs, 1, /*replacement=*/false, generator_).squeeze(-1);
}

}  // namespace swiftcpp
