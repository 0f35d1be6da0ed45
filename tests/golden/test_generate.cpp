// Generation: llama2.c's and Hugging Face's greedy texts, KV-cache consistency, batching, stops, seeds.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "infer/generate.h"
#include "io/safetensors.h"
#include "tests/tensor_util.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::source_dir;
using test::stories_dir;

Generator stories_generator() {
  return Generator(load_causal_lm(stories_dir(), {test::test_device(), at::kFloat}), load_tokenizer(stories_dir()));
}

GenerationConfig greedy(int64_t n) {
  GenerationConfig c;
  c.max_new_tokens = n;
  c.sampling.temperature = 0;
  return c;
}

std::vector<int64_t> ids_of(const Json& j) { return j.get<std::vector<int64_t>>(); }

// llama2.c's own expected output: temperature 0, 200 steps from BOS (tests/data, MIT, see NOTICE).
TEST(Generate, GreedyFromBosReproducesLlama2c) {
  Generator gen = stories_generator();
  const std::string expected = read_text_file(source_dir() / "tests/data/stories260K_expected_greedy_t0_n200.txt");
  const auto results = gen.generate({gen.encode_prompt("")}, greedy(200));
  EXPECT_EQ(results[0].new_ids.size(), 200u);
  EXPECT_EQ(results[0].text, expected);
}

TEST(Generate, GreedyMatchesTransformersGenerate) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  Generator gen = stories_generator();
  for (const char* name : {"from_bos", "from_once_upon_a_time"}) {
    const Json& g = ref["greedy_generate"][name];
    const auto results = gen.generate({ids_of(g["prompt_ids"])}, greedy(g["n_new"].get<int64_t>()));
    EXPECT_EQ(results[0].new_ids, ids_of(g["new_ids"])) << name;
    EXPECT_EQ(results[0].text, g["new_text"].get<std::string>()) << name;
  }
  EXPECT_EQ(gen.encode_prompt("Once upon a time"), (std::vector<int64_t>{1, 403, 407, 261, 378}));
}

// Logits of incremental decoding through the KV cache equal one full forward over the same tokens.
TEST(Generate, KvCacheStepsEqualFullForward) {
  CausalLM model = load_causal_lm(stories_dir(), {test::test_device(), at::kFloat});
  c10::InferenceMode guard;
  const std::vector<int64_t> ids = {1, 403, 407, 261, 291, 13, 100, 511, 300, 2, 259, 450};
  const at::Tensor all = at::tensor(ids, at::kLong).view({1, -1}).to(test::test_device());
  const at::Tensor full = model->forward(all);  // [1, 12, V]
  nn::KVCache cache = model->make_cache(1, 16);
  ForwardOptions o;
  o.cache = &cache;
  at::Tensor first = model->forward(all.narrow(1, 0, 5), o);  // prefill 5
  std::vector<at::Tensor> parts = {first};
  for (int64_t t = 5; t < 12; ++t) parts.push_back(model->forward(all.narrow(1, t, 1), o));
  EXPECT_EQ(cache.length, 12);
  // float32: the step-wise products have other shapes than the full one and sum in another order.
  EXPECT_LE((at::cat(parts, 1) - full).abs().max().item<double>(), 5e-5);
  EXPECT_EQ(cache.keys[0].device(), test::test_device());
}

// Left-padded batches give each prompt the text it gets alone.
TEST(Generate, BatchedLeftPaddingEqualsSinglePrompts) {
  Generator gen = stories_generator();
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Lily and Tom went to the big park"};
  std::vector<std::vector<int64_t>> ids;
  for (const auto& p : prompts) ids.push_back(gen.encode_prompt(p));
  const auto batch = gen.generate(ids, greedy(40));
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto single = gen.generate({ids[i]}, greedy(40));
    EXPECT_EQ(batch[i].new_ids, single[0].new_ids) << prompts[i];
    EXPECT_EQ(batch[i].text, single[0].text) << prompts[i];
  }
}

TEST(Generate, StopStringsCutTheTextAndStreamingAgrees) {
  Generator gen = stories_generator();
  GenerationConfig c = greedy(200);
  c.stop_strings = {"Lily."};
  std::string streamed;
  const auto r = gen.generate({gen.encode_prompt("")}, c, [&](size_t, const std::string& s) { streamed += s; });
  EXPECT_EQ(r[0].finish_reason, "stop");
  EXPECT_EQ(r[0].text, "Once upon a time, there was a little girl named ");
  EXPECT_EQ(streamed, r[0].text);
}

TEST(Generate, EosEndsGenerationAndLengthIsReported) {
  Generator gen = stories_generator();
  GenerationConfig c = greedy(5);
  auto r = gen.generate({gen.encode_prompt("")}, c);
  EXPECT_EQ(r[0].finish_reason, "length");
  EXPECT_EQ(r[0].new_ids.size(), 5u);
  // Make the first greedy token (403) an EOS id: generation ends at once with empty text.
  c.eos_ids = {403};
  r = gen.generate({gen.encode_prompt("")}, c);
  EXPECT_EQ(r[0].finish_reason, "eos");
  EXPECT_EQ(r[0].new_ids, std::vector<int64_t>{403});
  EXPECT_EQ(r[0].text, "");
}

TEST(Generate, SeedMakesSamplingReproducible) {
  Generator gen = stories_generator();
  GenerationConfig c;
  c.max_new_tokens = 30;
  c.sampling.temperature = 1.0;
  c.sampling.top_p = 0.9;
  c.sampling.seed = 11;
  const auto a = gen.generate({gen.encode_prompt("")}, c);
  const auto b = gen.generate({gen.encode_prompt("")}, c);
  c.sampling.seed = 12;
  const auto d = gen.generate({gen.encode_prompt("")}, c);
  EXPECT_EQ(a[0].new_ids, b[0].new_ids);
  EXPECT_NE(a[0].new_ids, d[0].new_ids);
}

}  // namespace
}  // namespace swiftcpp
