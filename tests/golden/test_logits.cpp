// Golden tests: our decoder's logits against the Hugging Face transformers reference data.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/version.h>

#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "tests/tensor_util.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::json_to_tensor;
using test::stories_dir;

// float32: the reference was computed in float32 by HF on PyTorch; only summation order differs.
constexpr double kF32Tol = 1e-4;


at::Tensor ids_tensor(const Json& ids) {
  std::vector<int64_t> flat;
  std::vector<int64_t> shape;
  if (ids[0].is_array()) {
    shape = {static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())};
    for (const auto& row : ids) for (const auto& v : row) flat.push_back(v.get<int64_t>());
  } else {
    shape = {1, static_cast<int64_t>(ids.size())};
    for (const auto& v : ids) flat.push_back(v.get<int64_t>());
  }
  return at::tensor(flat, at::kLong).view(shape);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(GoldenLogits, Stories260KMatchesTransformers) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  CausalLM model = load_causal_lm(stories_dir(), {test::test_device(), at::kFloat});
  c10::InferenceMode guard;
  for (const char* name : {"once_upon_a_time", "arbitrary12"}) {
    const Json& seq = ref["sequences"][name];
    const at::Tensor logits = model->forward(ids_tensor(seq["ids"]).to(test::test_device())).cpu();  // [1, T, V]
    const at::Tensor expected = json_to_tensor(seq["logits"]).unsqueeze(0);
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const double diff = max_abs_diff(logits, expected);
    std::cout << "[stories260K " << name << "] max |logit - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
  }
}

TEST(GoldenLogits, TinyLlamaAndQwen2MatchTransformers) {
  const auto ref_path = assets() / "reference/tiny/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  const at::Tensor ids = ids_tensor(ref["ids"]);  // [2, 6]
  c10::InferenceMode guard;
  for (const char* name : {"tiny-llama", "tiny-qwen2"}) {
    CausalLM model = load_causal_lm(assets() / "reference/tiny" / name, {test::test_device(), at::kFloat});
    const at::Tensor logits = model->forward(ids.to(test::test_device())).cpu();
    const at::Tensor expected = json_to_tensor(ref["models"][name]["logits"]);
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const double diff = max_abs_diff(logits, expected);
    std::cout << "[" << name << "] max |logit - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
  }
}

// Right-padded batch with a key-padding mask: valid positions equal the unpadded runs (HF saw 9.5e-6).
TEST(GoldenLogits, PaddedBatchMatchesUnpaddedReference) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  CausalLM model = load_causal_lm(stories_dir());
  c10::InferenceMode guard;
  const at::Tensor ids = ids_tensor(ref["padded_batch_check"]["rows"]);
  const at::Tensor valid = ids_tensor(ref["padded_batch_check"]["attention_mask"]).to(at::kBool);
  ForwardOptions options;
  options.key_valid = valid;
  const at::Tensor logits = model->forward(ids, options);
  const at::Tensor short_ref = json_to_tensor(ref["sequences"]["once_upon_a_time"]["logits"]);
  const at::Tensor long_ref = json_to_tensor(ref["sequences"]["arbitrary12"]["logits"]);
  EXPECT_LE(max_abs_diff(logits[0].narrow(0, 0, 5), short_ref), kF32Tol);
  EXPECT_LE(max_abs_diff(logits[1], long_ref), kF32Tol);
}

// The token-weighted NLL of 20 real alpaca records (up to 256 tokens each) equals HF's.
TEST(GoldenLogits, AlpacaNllMatchesTransformers) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  CausalLM model = load_causal_lm(stories_dir());
  c10::InferenceMode guard;
  double total = 0;
  int64_t count = 0;
  for (const auto& record : ref["alpaca_nll"]["records"]) {
    const at::Tensor ids = ids_tensor(record["ids"]);  // [1, T]
    const at::Tensor logits = model->forward(ids).squeeze(0).to(at::kDouble);  // [T, V]
    const int64_t T = ids.size(1);
    const at::Tensor logp = logits.narrow(0, 0, T - 1).log_softmax(-1);
    const at::Tensor targets = ids[0].narrow(0, 1, T - 1);
    const double nll = -logp.gather(1, targets.unsqueeze(1)).sum().item<double>();
    EXPECT_NEAR(nll / (T - 1), record["mean_nll"].get<double>(), 2e-5) << "record " << record["index"];
    total += nll;
    count += T - 1;
  }
  EXPECT_EQ(count, ref["alpaca_nll"]["total_predicted_tokens"].get<int64_t>());
  EXPECT_NEAR(total / count, ref["alpaca_nll"]["token_weighted_mean_nll"].get<double>(), 1e-5);
}

// bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.0039). Logits of stories260K reach |15|, so the
// final rounding of a logit alone is up to ~0.06, and five layers of bf16 matmuls, norms and residual adds
// (each rounding the residual stream) compound it several times over. We require max |bf16 - HF fp32| <= 0.5
// and the same argmax at >= 95% of positions; the measured values are printed (0.23 and 100% when written).
TEST(GoldenLogits, Stories260KBfloat16WithinStatedTolerance) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  LoadOptions options;
  options.dtype = at::kBFloat16;
  CausalLM model = load_causal_lm(stories_dir(), options);
  c10::InferenceMode guard;
  const Json& seq = ref["sequences"]["arbitrary12"];
  const at::Tensor logits = model->forward(ids_tensor(seq["ids"])).squeeze(0).to(at::kFloat);
  const at::Tensor expected = json_to_tensor(seq["logits"]).to(at::kFloat);
  const double diff = max_abs_diff(logits, expected);
  const double agree = logits.argmax(-1).eq(expected.argmax(-1)).to(at::kFloat).mean().item<double>();
  std::cout << "[stories260K bf16] max |logit - HF fp32| = " << diff << ", argmax agreement " << agree << std::endl;
  EXPECT_LE(diff, 0.5);
  EXPECT_GE(agree, 0.95);
}

// The explicit matmul/softmax attention and SDPA give the same result (where SDPA exists).
TEST(GoldenLogits, MathAndSdpaAttentionAgree) {
  if (!nn::sdpa_available()) GTEST_SKIP() << "skipped: LibTorch " << TORCH_VERSION << " has no scaled_dot_product_attention";
  at::manual_seed(0);
  const auto dev = test::test_device();
  const at::Tensor q = at::randn({2, 8, 5, 16}).to(dev), k = at::randn({2, 4, 9, 16}).to(dev),
                   v = at::randn({2, 4, 9, 16}).to(dev);
  at::Tensor valid = at::ones({2, 9}, at::kBool);
  valid[1].narrow(0, 0, 3).fill_(false);  // left padding in row 1
  const at::Tensor mask = nn::build_attention_mask(2, 4, 5, valid.to(dev), 0, dev);
  nn::set_attention_backend(nn::AttentionBackend::kMath);
  const at::Tensor a = nn::attention(q, k, v, mask);
  nn::set_attention_backend(nn::AttentionBackend::kSdpa);
  const at::Tensor b = nn::attention(q, k, v, mask);
  nn::set_attention_backend(nn::AttentionBackend::kAuto);
  EXPECT_LE(max_abs_diff(a.cpu(), b.cpu()), 1e-5);
}

// GQA attention equals the textbook form with K/V repeated per group and a causal mask offset by the cache.
TEST(Attention, GroupedQueryMatchesRepeatedHeads) {
  at::manual_seed(1);
  const at::Tensor q = at::randn({1, 6, 3, 4}, at::kDouble), k = at::randn({1, 2, 7, 4}, at::kDouble),
                   v = at::randn({1, 2, 7, 4}, at::kDouble);
  const at::Tensor mask = nn::build_attention_mask(1, 4, 3, at::Tensor(), 0, at::Device(at::kCPU));
  const at::Tensor out = nn::attention(q, k, v, mask);
  const at::Tensor kr = k.repeat_interleave(3, 1), vr = v.repeat_interleave(3, 1);
  at::Tensor scores = at::matmul(q, kr.transpose(-1, -2)) / 2.0;
  // query i (cache position 4 + i) sees keys 0..4+i
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 7; ++j) {
      if (j > 4 + i) scores.select(2, i).select(2, j).fill_(-INFINITY);
    }
  }
  const at::Tensor expected = at::matmul(scores.softmax(-1), vr);
  EXPECT_LE(max_abs_diff(out, expected), 1e-12);
}

TEST(Attention, SlidingWindowHidesOldKeys) {
  const at::Tensor mask = nn::build_attention_mask(1, 0, 6, at::Tensor(), 3, at::Device(at::kCPU));
  ASSERT_TRUE(mask.defined());
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      EXPECT_EQ(mask[0][0][i][j].item<bool>(), j <= i && i - j < 3) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace swiftcpp
