// Padding and packing collators: every sample placed once, and a packed row computes exactly what the same
// samples compute one by one (loss and gradients, float64).
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <random>

#include "core/error.h"
#include "data/collate.h"
#include "models/decoder/decoder.h"
#include "tests/tiny_model.h"

namespace swiftcpp {
namespace {

TEST(Packing, BestFitDecreasingPlacesEverySampleOnceWithinCapacity) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 60);
    for (auto& l : lengths) l = 1 + rng() % 32;
    const auto rows = pack_best_fit_decreasing(lengths, 32);
    std::vector<int> seen(lengths.size(), 0);
    for (const auto& row : rows) {
      int64_t used = 0;
      for (size_t i : row) {
        ++seen[i];
        used += lengths[i];
      }
      EXPECT_LE(used, 32);
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
  // Best fit: 7 goes into the row with 3 free (after 29), not the one with 10 free (after 22).
  const auto rows = pack_best_fit_decreasing({29, 22, 3, 7}, 32);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], (std::vector<size_t>{0, 2}));
  EXPECT_EQ(rows[1], (std::vector<size_t>{1, 3}));
  EXPECT_THROW(pack_best_fit_decreasing({33}, 32), ConfigError);
}

CausalLM tiny_model() { return test::tiny_llama(40, 2); }

std::vector<Sample> random_samples(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Sample> samples(n);
  for (auto& s : samples) {
    const int len = 2 + rng() % 11;
    for (int i = 0; i < len; ++i) s.input_ids.push_back(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const bool trained = i + 1 < len && rng() % 3 != 0;
      s.labels.push_back(trained ? s.input_ids[i + 1] : kIgnoreIndex);
    }
  }
  return samples;
}

std::vector<at::Tensor> grads_of(CausalLM& model) {
  std::vector<at::Tensor> g;
  for (auto& p : model->parameters()) g.push_back(p.grad().clone());
  return g;
}

void zero_grads(CausalLM& model) {
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

at::Tensor batch_loss(CausalLM& model, const Batch& batch) {
  ForwardOptions options;
  options.position_ids = batch.position_ids;
  options.segment_ids = batch.segment_ids;
  options.key_valid = batch.key_valid;
  return cross_entropy_sum(model->forward(batch.input_ids, options), batch.labels);
}

TEST(Packing, PackedAndPaddedRowsEqualSeparateSamplesInFloat64) {
  CausalLM model = tiny_model();
  const auto samples = random_samples(9, 11);
  // Reference: each sample alone.
  double reference_loss = 0;
  for (const auto& s : samples) {
    const at::Tensor loss = batch_loss(model, collate_padded({&s}, 0));
    loss.backward();
    reference_loss += loss.item<double>();
  }
  const auto reference = grads_of(model);

  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
  std::vector<std::vector<const Sample*>> rows;
  for (const auto& row : pack_best_fit_decreasing(lengths, 20)) {
    rows.emplace_back();
    for (size_t i : row) rows.back().push_back(&samples[i]);
  }
  ASSERT_LT(rows.size(), samples.size());  // something really was packed together
  zero_grads(model);
  const Batch packed = collate_packed(rows, 0);
  const at::Tensor packed_loss = batch_loss(model, packed);
  packed_loss.backward();
  EXPECT_NEAR(packed_loss.item<double>(), reference_loss, 1e-10 * std::abs(reference_loss));
  auto grads = grads_of(model);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_LE((grads[i] - reference[i]).abs().max().item<double>(), 1e-10) << "parameter " << i;
  }

  zero_grads(model);
  std::vector<const Sample*> all;
  for (const auto& s : samples) all.push_back(&s);
  const Batch padded = collate_padded(all, 0);
  EXPECT_TRUE(padded.key_valid.defined());
  const at::Tensor padded_loss = batch_loss(model, padded);
  padded_loss.backward();
  EXPECT_NEAR(padded_loss.item<double>(), reference_loss, 1e-10 * std::abs(reference_loss));
  grads = grads_of(model);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_LE((grads[i] - reference[i]).abs().max().item<double>(), 1e-10) << "parameter " << i;
  }
  int64_t label_tokens = 0;
  for (const auto& s : samples) label_tokens += s.label_tokens();
  EXPECT_EQ(packed.label_tokens, label_tokens);
  EXPECT_EQ(padded.label_tokens, label_tokens);
}

// Without segment ids the samples of a packed row would see each other: the test above can fail.
TEST(Packing, WithoutSegmentIdsPackedSamplesLeak) {
  CausalLM model = tiny_model();
  const auto samples = random_samples(2, 4);
  at::NoGradGuard no_grad;
  Batch packed = collate_packed({{&samples[0], &samples[1]}}, 0);
  const double with = batch_loss(model, packed).item<double>();
  packed.segment_ids = at::Tensor();
  const double without = batch_loss(model, packed).item<double>();
  EXPECT_GT(std::abs(with - without), 1e-6);
}

}  // namespace
}  // namespace swiftcpp
