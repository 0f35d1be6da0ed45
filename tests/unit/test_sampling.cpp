// Sampling filters on hand-computed cases.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "core/error.h"
#include "infer/sampling.h"

namespace swiftcpp {
namespace {

at::Tensor row(std::vector<float> v) { return at::tensor(v, at::kFloat).view({1, -1}); }

std::vector<bool> kept(const at::Tensor& x) {
  std::vector<bool> out;
  for (int64_t i = 0; i < x.size(1); ++i) out.push_back(std::isfinite(x[0][i].item<float>()));
  return out;
}

TEST(Sampling, GreedyIsArgmaxWithRepetitionPenalty) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0;
  Sampler s(p);
  at::Tensor seen = at::zeros({1, 3}, at::kBool);
  seen[0][0] = true;
  // 4.0 seen -> 2.0 < 3.0
  EXPECT_EQ(s.sample(row({4.0f, 3.0f, -1.0f}), seen).item<int64_t>(), 1);
  const at::Tensor processed = s.process(row({4.0f, 3.0f, -1.0f}), at::tensor({0, 0, 1}).to(at::kBool).view({1, 3}));
  EXPECT_FLOAT_EQ(processed[0][2].item<float>(), -2.0f);  // negative logits are multiplied
}

TEST(Sampling, TopKTopPMinP) {
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(kept(Sampler(p).process(row({1, 3, 2, 0}), {})), (std::vector<bool>{false, true, true, false}));
  p = SamplingParams{};
  p.top_p = 0.7;  // probabilities 0.5, 0.3, 0.2: {0.5} < 0.7, {0.5, 0.3} reaches it
  const at::Tensor logits = row({std::log(0.2f), std::log(0.5f), std::log(0.3f)});
  EXPECT_EQ(kept(Sampler(p).process(logits, {})), (std::vector<bool>{false, true, true}));
  p.top_p = 0.4;  // the most likely token alone
  EXPECT_EQ(kept(Sampler(p).process(logits, {})), (std::vector<bool>{false, true, false}));
  p = SamplingParams{};
  p.min_p = 0.5;  // keep p >= 0.25
  EXPECT_EQ(kept(Sampler(p).process(logits, {})), (std::vector<bool>{false, true, true}));
}

TEST(Sampling, TemperatureSharpensAndFrequenciesFollowProbabilities) {
  SamplingParams p;
  p.temperature = 0.5;
  const at::Tensor x = Sampler(p).process(row({1.0f, 2.0f}), {});
  EXPECT_FLOAT_EQ(x[0][1].item<float>(), 4.0f);
  p = SamplingParams{};
  p.seed = 3;
  Sampler s(p);
  const at::Tensor logits = row({std::log(0.25f), std::log(0.75f)});
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += s.sample(logits, {}).item<int64_t>() == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(Sampling, RejectsOutOfRangeSettings) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(p.validate(), ConfigError);
  p = SamplingParams{};
  p.temperature = -1;
  EXPECT_THROW(p.validate(), ConfigError);
  p = SamplingParams{};
  p.min_p = 1.0;
  EXPECT_THROW(p.validate(), ConfigError);
}

}  // namespace
}  // namespace swiftcpp
