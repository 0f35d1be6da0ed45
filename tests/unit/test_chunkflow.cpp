// ChunkFlow: chunk planning (every token once), the block attention it runs on, and the state-aware schedule's
// gradients against unchunked training (float64 ~1e-10, float32 ~1e-5) for every K, with the forward count
// N + max(0, N - K) and a demonstration that ascending recomputation is wrong.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <random>

#include "core/error.h"
#include "core/memory.h"
#include "data/collate.h"
#include "models/decoder/decoder.h"
#include "tests/test_util.h"
#include "tests/tiny_model.h"
#include "train/chunkflow.h"
#include "train/config.h"
#include "train/trainer.h"

namespace swiftcpp {
namespace {

TEST(ChunkFlowPlan, EveryTokenIsPlacedExactlyOnceOnRandomMixes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t C = 1 + static_cast<int64_t>(rng() % 64);
    std::vector<int64_t> lengths(1 + rng() % 40);
    for (auto& l : lengths) l = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % (6 * C)) : 1 + static_cast<int64_t>(rng() % C);
    std::vector<std::vector<int>> seen(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) seen[i].assign(static_cast<size_t>(lengths[i]), 0);
    for (const auto& group : plan_chunks(lengths, C)) {
      if (group.dependent) {
        ASSERT_GE(group.chunks.size(), 2u);
        const size_t sample = group.chunks[0].at(0).sample;
        EXPECT_GT(lengths[sample], C);
        EXPECT_EQ(static_cast<int64_t>(group.chunks.size()), (lengths[sample] + C - 1) / C);
        int64_t expect_begin = 0;
        for (const auto& chunk : group.chunks) {
          ASSERT_EQ(chunk.size(), 1u);
          EXPECT_EQ(chunk[0].sample, sample);
          EXPECT_EQ(chunk[0].begin, expect_begin);  // consecutive, in order
          EXPECT_LE(chunk[0].end - chunk[0].begin, C);
          expect_begin = chunk[0].end;
        }
        EXPECT_EQ(expect_begin, lengths[sample]);
      } else {
        ASSERT_EQ(group.chunks.size(), 1u);
        int64_t tokens = 0;
        for (const auto& span : group.chunks[0]) {
          EXPECT_EQ(span.begin, 0);  // short samples stay whole
          EXPECT_EQ(span.end, lengths[span.sample]);
          EXPECT_LE(lengths[span.sample], C);
          tokens += span.end - span.begin;
        }
        EXPECT_LE(tokens, C);
      }
      for (const auto& chunk : group.chunks) {
        for (const auto& span : chunk) {
          for (int64_t t = span.begin; t < span.end; ++t) ++seen[span.sample][static_cast<size_t>(t)];
        }
      }
    }
    for (const auto& s : seen) {
      for (int count : s) ASSERT_EQ(count, 1);
    }
  }
  EXPECT_THROW(plan_chunks({3}, 0), ConfigError);
}

std::vector<Sample> random_samples(const std::vector<int>& lengths, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<Sample> samples(lengths.size());
  for (size_t k = 0; k < lengths.size(); ++k) {
    Sample& s = samples[k];
    for (int i = 0; i < lengths[k]; ++i) s.input_ids.push_back(static_cast<int32_t>(rng() % vocab));
    for (int i = 0; i < lengths[k]; ++i) {
      const bool trained = i + 1 < lengths[k] && rng() % 4 != 0;
      s.labels.push_back(trained ? s.input_ids[i + 1] : kIgnoreIndex);
    }
  }
  return samples;
}

TEST(ChunkFlowPlan, LabelsAreShiftedBeforeTheSplit) {
  const auto samples = random_samples({23, 5, 4}, 3, 50);
  const ChunkedBatch batch = build_chunked_batch({&samples[0], &samples[1], &samples[2]}, 8, 0);
  ASSERT_EQ(batch.sequences.size(), 1u);
  ASSERT_EQ(batch.sequences[0].size(), 3u);  // 8 + 8 + 7
  ASSERT_EQ(batch.standalone.size(), 2u);    // 5 and 4 do not share a chunk of 8
  const Sample& s = samples[0];
  int64_t label_tokens = 0;
  for (size_t i = 0; i < 3; ++i) {
    const Batch& c = batch.sequences[0][i];
    EXPECT_EQ(c.input_ids.size(0), 1);
    for (int64_t t = 0; t < c.input_ids.size(1); ++t) {
      const size_t at = i * 8 + static_cast<size_t>(t);
      EXPECT_EQ(c.input_ids[0][t].item<int64_t>(), s.input_ids[at]);
      EXPECT_EQ(c.labels[0][t].item<int64_t>(), s.labels[at]);  // the last of a chunk names the next chunk's first
      EXPECT_EQ(c.position_ids[0][t].item<int64_t>(), static_cast<int64_t>(at));
    }
    label_tokens += c.label_tokens;
  }
  EXPECT_EQ(label_tokens, s.label_tokens());
  EXPECT_EQ(batch.label_tokens, s.label_tokens() + samples[1].label_tokens() + samples[2].label_tokens());
  EXPECT_EQ(batch.real_tokens, 32);
  EXPECT_EQ(batch.chunks(), 5);
}

TEST(ChunkFlowAttention, BlocksEqualTheMathKernelInValueAndGradient) {
  at::manual_seed(1);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, H = 4, Hkv = 2, T = 37, Dh = 8;
  const at::Tensor q = at::randn({B, H, T, Dh}, opts).requires_grad_(true);
  std::vector<at::Tensor> keys, values;
  for (int64_t n : {int64_t{11}, int64_t{5}, T}) {  // two stored blocks, then the chunk's own keys
    keys.push_back(at::randn({B, Hkv, n, Dh}, opts).requires_grad_(true));
    values.push_back(at::randn({B, Hkv, n, Dh}, opts).requires_grad_(true));
  }
  const int64_t S = 11 + 5 + T;
  const at::Tensor key_valid = at::rand({B, S}) > 0.2;
  const at::Tensor mask = nn::build_attention_mask(B, S - T, T, key_valid, 0, at::kCPU);
  const at::Tensor grad_out = at::randn({B, H, T, Dh}, opts);
  // Reference: one concatenated K/V through the math kernel, which keeps its probabilities.
  nn::set_recompute_attention(false);
  const at::Tensor ref = nn::attention(q, at::cat(keys, 2), at::cat(values, 2), mask);
  nn::set_recompute_attention(true);
  std::vector<at::Tensor> inputs{q};
  inputs.insert(inputs.end(), keys.begin(), keys.end());
  inputs.insert(inputs.end(), values.begin(), values.end());
  const auto ref_grads = torch::autograd::grad({ref}, inputs, {grad_out});
  for (int64_t workspace : {int64_t{1} << 23, int64_t{16 * B * H * S}}) {  // one row block; row blocks of 16
    const at::Tensor out = nn::attention_blocks(q, keys, values, mask, workspace);
    EXPECT_LE((out - ref).abs().max().item<double>(), 1e-13);
    const auto grads = torch::autograd::grad({out}, inputs, {grad_out});
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_LE((grads[i] - ref_grads[i]).abs().max().item<double>(), 1e-12) << "input " << i;
    }
  }
}

CausalLM tiny_model(at::ScalarType dtype) { return test::tiny_llama(50, 3, dtype); }

std::vector<at::Tensor> take_grads(CausalLM& model) {
  std::vector<at::Tensor> g;
  for (auto& p : model->parameters()) {
    g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  return g;
}

at::Tensor chunk_loss(CausalLM& model, const Batch& b, nn::ChunkKV* state, bool need_loss) {
  ForwardOptions o;
  o.chunk = state;
  o.position_ids = b.position_ids;
  o.segment_ids = b.segment_ids;
  o.key_valid = b.key_valid;
  if (!need_loss) {
    model->hidden_states(b.input_ids, o);
    return {};
  }
  return cross_entropy_sum(model->forward(b.input_ids, o), b.labels);
}

// Largest |a - b| over the largest |b|, over all parameters.
double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

struct Comparison {
  double error = 0;
  double loss = 0, reference_loss = 0;
  ChunkFlowCounters counters;
  int64_t expected_forwards = 0;
};

Comparison compare_with_unchunked(at::ScalarType dtype, const std::vector<int>& lengths, int64_t C,
                                  const ChunkFlowOptions& options) {
  CausalLM model = tiny_model(dtype);
  const auto samples = random_samples(lengths, 11, 50);
  std::vector<const Sample*> all;
  int64_t label_tokens = 0;
  for (const auto& s : samples) {
    all.push_back(&s);
    label_tokens += s.label_tokens();
  }
  const double scale = 1.0 / static_cast<double>(label_tokens);
  Comparison out;
  for (const auto& s : samples) {  // unchunked: every sample whole
    const at::Tensor loss = chunk_loss(model, collate_padded({&s}, 0), nullptr, true);
    (loss * scale).backward();
    out.reference_loss += loss.item<double>();
  }
  const auto reference = take_grads(model);
  const ChunkedBatch batch = build_chunked_batch(all, C, 0);
  const ChunkLossFn fn = [&](const Batch& b, nn::ChunkKV* state, bool need) { return chunk_loss(model, b, state, need); };
  out.loss = chunkflow_backward(batch, fn, scale, options, at::kCPU, &out.counters).item<double>();
  out.error = relative_error(take_grads(model), reference);
  out.expected_forwards = static_cast<int64_t>(batch.standalone.size());
  for (const auto& seq : batch.sequences) {
    out.expected_forwards += chunkflow_forward_count(static_cast<int64_t>(seq.size()), options.keep);
  }
  return out;
}

// Short and long samples: at C = 8 the 61-token one is 8 chunks, the 30-token one 4, the 17-token one 3.
const std::vector<int> kMix = {61, 5, 30, 3, 8, 17, 2, 7, 1};

TEST(ChunkFlowSchedule, GradientsEqualUnchunkedInFloat64ForEveryKeep) {
  for (int64_t keep : {1, 2, 3, 8}) {
    ChunkFlowOptions options;
    options.keep = keep;
    const Comparison c = compare_with_unchunked(at::kDouble, kMix, 8, options);
    EXPECT_LE(c.error, 1e-10) << "K=" << keep;
    EXPECT_NEAR(c.loss, c.reference_loss, 1e-10 * c.reference_loss) << "K=" << keep;
    EXPECT_EQ(c.counters.forwards, c.expected_forwards) << "K=" << keep;
    EXPECT_EQ(c.counters.chunks, 8 + 4 + 3 + 4);  // standalone: {8}, {7,1}, {5,3}, {2}
  }
  // N + max(0, N - K) for the 8-chunk sample at K = 1: 15 forwards; 4 chunks: 7; 3 chunks: 5; plus 4 standalone.
  ChunkFlowOptions one;
  one.keep = 1;
  EXPECT_EQ(compare_with_unchunked(at::kDouble, kMix, 8, one).counters.forwards, 15 + 7 + 5 + 4);
  EXPECT_EQ(chunkflow_forward_count(8, 1), 15);
  EXPECT_EQ(chunkflow_forward_count(8, 8), 8);
  EXPECT_EQ(chunkflow_forward_count(3, 5), 3);
}

TEST(ChunkFlowSchedule, RandomMixesInFloat64AndFloat32) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int> lengths(3 + rng() % 5);
    for (auto& l : lengths) l = rng() % 3 == 0 ? 9 + static_cast<int>(rng() % 40) : 1 + static_cast<int>(rng() % 8);
    const int64_t C = 4 + static_cast<int64_t>(rng() % 6);
    for (int64_t keep : {int64_t{1}, int64_t{2}, int64_t{100}}) {
      ChunkFlowOptions options;
      options.keep = keep;
      EXPECT_LE(compare_with_unchunked(at::kDouble, lengths, C, options).error, 1e-10) << trial << " K=" << keep;
      EXPECT_LE(compare_with_unchunked(at::kFloat, lengths, C, options).error, 1e-5) << trial << " K=" << keep;
    }
  }
}

// Recomputing in ascending order back-propagates a chunk before every later chunk has left its K/V gradients:
// with N - K >= 2 the gradients are wrong.
TEST(ChunkFlowSchedule, AscendingRecomputeOrderGivesWrongGradients) {
  ChunkFlowOptions options;
  options.keep = 1;
  options.ascending_recompute = true;
  EXPECT_GT(compare_with_unchunked(at::kDouble, {40}, 8, options).error, 1e-3);
  options.ascending_recompute = false;
  EXPECT_LE(compare_with_unchunked(at::kDouble, {40}, 8, options).error, 1e-10);
  // With N - K = 1 there is nothing to order: both agree.
  options.keep = 4;
  options.ascending_recompute = true;
  EXPECT_LE(compare_with_unchunked(at::kDouble, {40}, 8, options).error, 1e-10);
}

// The trainer's ChunkFlow step on the real stories260K with LoRA equals its padded step on the same global batch.
TEST(ChunkFlowSchedule, TrainerStepEqualsPaddedStepOnStories260K) {
  const auto samples = random_samples({70, 9, 33, 12, 4}, 9, 500);
  std::vector<const Sample*> all;
  for (const auto& s : samples) all.push_back(&s);
  TrainConfig c;
  c.model = test::stories_dir().string();
  c.dataset = {"unused"};
  c.lora_dropout = 0.0;
  c.lr_scheduler_type = "constant";
  c.batching = "chunkflow";
  c.chunk_size = 16;
  c.chunk_keep = 2;
  Trainer padded(c, load_causal_lm(test::stories_dir()));
  Trainer chunked(c, load_causal_lm(test::stories_dir()));
  const StepResult a = padded.step({collate_padded({all[0], all[1]}, 0), collate_padded({all[2], all[3], all[4]}, 0)}, 0, 2);
  const StepResult b = chunked.step(build_chunked_batch(all, c.chunk_size, 0), 0, 2);
  EXPECT_EQ(a.label_tokens, b.label_tokens);
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss);
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm);
  EXPECT_NEAR(a.token_acc, b.token_acc, 1e-12);
  EXPECT_EQ(b.forwards, chunkflow_forward_count(5, 2) + chunkflow_forward_count(3, 2) + 2);  // 70, 33 split; 9+4, 12
  std::vector<at::Tensor> ga, gb;  // the step's gradients stay on the tensors until the next step
  for (const auto& t : padded.trainables()) ga.push_back(t.tensor.grad());
  for (const auto& t : chunked.trainables()) gb.push_back(t.tensor.grad());
  EXPECT_LE(relative_error(gb, ga), 1e-5);
}

TEST(ChunkFlowConfig, ContradictionsAreRefused) {
  TrainConfig c;
  c.dataset = {"d.jsonl"};
  c.batching = "chunkflow";
  c.packing = true;
  test::expect_error<ConfigError>([&] { validate_train_config(c); }, {"packing", "chunkflow"});
  c.packing = false;
  c.gradient_checkpointing = true;
  test::expect_error<ConfigError>([&] { validate_train_config(c); }, {"gradient_checkpointing", "chunk_size"});
  c.gradient_checkpointing = false;
  validate_train_config(c);
  EXPECT_EQ(effective_batching(c), "chunkflow");
  c.batching = "padding";
  c.packing = true;
  EXPECT_EQ(effective_batching(c), "packing");
}

TEST(MemoryTracking, CountsCpuTensorsAndTheirPeak) {
  install_memory_tracking();
  const at::Device cpu(at::kCPU);
  reset_peak_memory(cpu);
  const int64_t before = current_memory_bytes(cpu);
  {
    const at::Tensor big = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    EXPECT_GE(current_memory_bytes(cpu) - before, int64_t{4} << 20);
  }
  EXPECT_LT(current_memory_bytes(cpu) - before, int64_t{1} << 20);
  EXPECT_GE(peak_memory_bytes(cpu) - before, int64_t{4} << 20);
  reset_peak_memory(cpu);
  EXPECT_LT(peak_memory_bytes(cpu) - before, int64_t{1} << 20);
}

}  // namespace
}  // namespace swiftcpp
