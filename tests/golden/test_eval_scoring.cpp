// Log-likelihood scoring: the batched, context-sharing scorer against a plain forward and against Hugging Face's
// per-record NLL; lm-eval's pair tokenisation; rolling perplexity windows.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <random>

#include "eval/evaluator.h"
#include "eval/scorer.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::stories_dir;

// log P(continuation | context) from one unpadded forward of context + continuation, in float64.
double plain_loglikelihood(CausalLM& model, const std::vector<int64_t>& context, const std::vector<int64_t>& cont) {
  c10::InferenceMode guard;
  std::vector<int64_t> all = context;
  all.insert(all.end(), cont.begin(), cont.end());
  const at::Tensor ids = at::tensor(all, at::kLong).view({1, -1}).to(model->device());
  const at::Tensor logp = model->forward(ids).squeeze(0).to(at::kCPU, at::kDouble).log_softmax(-1);  // [T, V]
  double sum = 0;
  for (size_t j = 0; j < cont.size(); ++j) sum += logp[context.size() - 1 + j][cont[j]].item<double>();
  return sum;
}

std::vector<eval::LoglikelihoodRequest> random_requests(uint64_t seed, int count, int64_t vocab) {
  std::mt19937_64 rng(seed);
  auto ids = [&](int n) {
    std::vector<int64_t> v(n);
    for (auto& x : v) x = std::uniform_int_distribution<int64_t>(3, vocab - 1)(rng);
    return v;
  };
  std::vector<eval::LoglikelihoodRequest> out;
  for (int i = 0; i < count; ++i) {
    eval::LoglikelihoodRequest r;
    r.context = ids(std::uniform_int_distribution<int>(1, 40)(rng));
    r.context.insert(r.context.begin(), 1);  // BOS
    const int choices = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int j = 0; j < choices; ++j) r.continuations.push_back(ids(std::uniform_int_distribution<int>(1, 7)(rng)));
    out.push_back(std::move(r));
  }
  return out;
}

// The loglikelihood of a continuation equals the sum of the model's per-token log-probs from a plain forward,
// whatever the batch (left-padded contexts, right-padded continuations over a shared cache).
TEST(EvalScorer, LoglikelihoodEqualsPlainForwardSum) {
  CausalLM model = load_causal_lm(stories_dir());
  model->eval();
  const auto requests = random_requests(7, 9, model->config().vocab_size);
  for (int64_t batch : {1, 4, 16}) {
    eval::Scorer scorer(model, {batch, 512});
    const auto scores = scorer.score(requests);
    ASSERT_EQ(scores.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(scores[i].size(), requests[i].continuations.size());
      for (size_t j = 0; j < requests[i].continuations.size(); ++j) {
        const double plain = plain_loglikelihood(model, requests[i].context, requests[i].continuations[j]);
        // float32 model: summation order differs between padded and unpadded runs (|log p| sums up to ~60).
        EXPECT_NEAR(scores[i][j].loglikelihood, plain, 2e-4) << "batch " << batch << " request " << i << " choice " << j;
      }
    }
  }
}

// In float64 the two paths agree to rounding, so the cache sharing and masking are exact, not just close.
TEST(EvalScorer, Float64AgreesToRounding) {
  LoadOptions load;
  load.dtype = at::kDouble;
  CausalLM model = load_causal_lm(stories_dir(), load);
  model->eval();
  const auto requests = random_requests(11, 6, model->config().vocab_size);
  eval::Scorer scorer(model, {3, 512});
  const auto scores = scorer.score(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    for (size_t j = 0; j < requests[i].continuations.size(); ++j) {
      const double plain = plain_loglikelihood(model, requests[i].context, requests[i].continuations[j]);
      EXPECT_NEAR(scores[i][j].loglikelihood, plain, 1e-9);
    }
  }
}

// is_greedy: a continuation made of the model's own argmax tokens is greedy, one token off is not.
TEST(EvalScorer, GreedyFlag) {
  CausalLM model = load_causal_lm(stories_dir());
  model->eval();
  std::vector<int64_t> context = {1, 403, 407};
  std::vector<int64_t> greedy_cont;
  {
    c10::InferenceMode guard;
    std::vector<int64_t> seq = context;
    for (int i = 0; i < 4; ++i) {
      const at::Tensor logits = model->forward(at::tensor(seq, at::kLong).view({1, -1}));
      seq.push_back(logits[0][-1].argmax().item<int64_t>());
      greedy_cont.push_back(seq.back());
    }
  }
  std::vector<int64_t> off = greedy_cont;
  off[2] = off[2] == 5 ? 6 : 5;
  eval::Scorer scorer(model, {2, 512});
  const auto scores = scorer.score({{context, {greedy_cont, off}}});
  EXPECT_TRUE(scores[0][0].greedy);
  EXPECT_FALSE(scores[0][1].greedy);
  EXPECT_GT(scores[0][0].loglikelihood, scores[0][1].loglikelihood);
}

// A context longer than max_length loses its oldest tokens, as lm-eval's (context + continuation)[-(L+1):][:-1].
TEST(EvalScorer, LongContextsAreCutFromTheLeft) {
  CausalLM model = load_causal_lm(stories_dir());
  model->eval();
  std::vector<int64_t> context = {1};
  for (int i = 0; i < 30; ++i) context.push_back(10 + i);
  const std::vector<int64_t> cont = {300, 301, 302};
  eval::Scorer scorer(model, {1, 16});
  const auto scores = scorer.score({{context, {cont}}});
  const std::vector<int64_t> kept(context.end() - 14, context.end());  // 16 + 1 - 3
  EXPECT_NEAR(scores[0][0].loglikelihood, plain_loglikelihood(model, kept, cont), 2e-4);
  EXPECT_THROW(scorer.score({{context, {std::vector<int64_t>(17, 5)}}}), ConfigError);
  EXPECT_THROW(scorer.score({{{}, {cont}}}), ConfigError);
  EXPECT_THROW(scorer.score({{context, {{5, 100000}}}}), ConfigError);
}

// Hugging Face's per-record NLL of 20 alpaca rows (up to 256 tokens each), reproduced through the scorer.
TEST(EvalScorer, AlpacaNllMatchesTransformers) {
  const auto ref_path = assets() / "reference/stories260K/hf_logits.json";
  SWIFTCPP_REQUIRE_SHARED(ref_path);
  const Json ref = load_json_file(ref_path);
  CausalLM model = load_causal_lm(stories_dir());
  model->eval();
  std::vector<eval::LoglikelihoodRequest> requests;
  for (const auto& record : ref["alpaca_nll"]["records"]) {
    const auto ids = record["ids"].get<std::vector<int64_t>>();
    requests.push_back({{ids.front()}, {std::vector<int64_t>(ids.begin() + 1, ids.end())}});
  }
  eval::Scorer scorer(model, {8, 512});
  const auto scores = scorer.score(requests);
  double total = 0;
  int64_t count = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& record = ref["alpaca_nll"]["records"][i];
    const auto n = static_cast<int64_t>(requests[i].continuations[0].size());
    EXPECT_NEAR(-scores[i][0].loglikelihood / n, record["mean_nll"].get<double>(), 2e-5) << "record " << i;
    total -= scores[i][0].loglikelihood;
    count += n;
  }
  EXPECT_EQ(count, ref["alpaca_nll"]["total_predicted_tokens"].get<int64_t>());
  EXPECT_NEAR(total / count, ref["alpaca_nll"]["token_weighted_mean_nll"].get<double>(), 1e-5);
}

// Rolling windows predict every token after the first exactly once, with at most max_length inputs each; with
// stride < max_length each window re-reads the previous tokens.
TEST(EvalScorer, RollingWindowsCoverEveryTokenOnce) {
  std::vector<int64_t> tokens(103);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i);
  for (int64_t L : {8, 16, 200}) {
    for (int64_t stride : {int64_t{1}, int64_t{5}, L}) {
      if (stride > L) continue;
      std::vector<int> seen(tokens.size(), 0);
      for (const auto& w : eval::rolling_windows(tokens, L, stride)) {
        ASSERT_EQ(w.continuations.size(), 1u);
        const auto& c = w.continuations[0];
        EXPECT_LE(static_cast<int64_t>(w.context.size() + c.size()) - 1, L);
        EXPECT_EQ(w.context.back() + 1, c.front());  // contiguous
        if (w.context.front() != 0) {  // not clipped at the start: a full window
          EXPECT_EQ(static_cast<int64_t>(w.context.size() + c.size()) - 1, L);
        }
        for (int64_t t : c) ++seen[t];
      }
      EXPECT_EQ(seen[0], 0);
      for (size_t t = 1; t < tokens.size(); ++t) EXPECT_EQ(seen[t], 1) << "token " << t << " L " << L << " stride " << stride;
    }
  }
  EXPECT_THROW(eval::rolling_windows(tokens, 8, 9), ConfigError);
  EXPECT_THROW(eval::rolling_windows(tokens, 8, 0), ConfigError);
}

// Perplexity through windows equals one long forward when a window holds the whole text.
TEST(EvalScorer, RollingPerplexityEqualsOneForwardWhenItFits) {
  CausalLM model = load_causal_lm(stories_dir());
  model->eval();
  std::vector<int64_t> tokens = {1};
  for (int i = 0; i < 60; ++i) tokens.push_back(20 + (i * 37) % 400);
  eval::Scorer scorer(model, {4, 512});
  auto sum = [&](int64_t L, int64_t stride) {
    double s = 0;
    const auto windows = eval::rolling_windows(tokens, L, stride);
    for (const auto& r : scorer.score(windows)) s += r[0].loglikelihood;
    return s;
  };
  const double whole = plain_loglikelihood(model, {1}, std::vector<int64_t>(tokens.begin() + 1, tokens.end()));
  EXPECT_NEAR(sum(512, 512), whole, 2e-4);
  // Short windows see less context: a different (worse here) but finite figure.
  const double short_windows = sum(8, 8);
  EXPECT_TRUE(std::isfinite(short_windows));
  EXPECT_GT(std::abs(short_windows - whole), 1e-3);
}

// lm-eval's pair tokenisation: the context's trailing space moves to the continuation, the continuation is the
// whole encoding minus the context's length, and an empty context scores from BOS.
TEST(EvalScorer, EncodeRequestSplitsPairsAsLmEval) {
  CausalLM model = load_causal_lm(stories_dir());
  auto tokenizer = load_tokenizer(stories_dir());
  eval::Evaluator evaluator(model, tokenizer, {});
  const auto r = evaluator.encode_request("Once upon a ", {"time", "day"});
  const auto ctx = evaluator.encode("Once upon a");
  EXPECT_EQ(r.context, ctx);
  EXPECT_EQ(ctx.front(), 1);  // BOS: the tokenizer adds one
  for (size_t j = 0; j < 2; ++j) {
    std::vector<int64_t> joined = r.context;
    joined.insert(joined.end(), r.continuations[j].begin(), r.continuations[j].end());
    EXPECT_EQ(joined, evaluator.encode(std::string("Once upon a ") + (j == 0 ? "time" : "day")));
  }
  const auto empty = evaluator.encode_request("", {"Once"});
  EXPECT_EQ(empty.context, std::vector<int64_t>{1});
  eval::EvalOptions no_bos;
  no_bos.add_bos = false;
  eval::Evaluator plain(model, tokenizer, no_bos);
  EXPECT_NE(plain.encode("Once").front(), 1);
  EXPECT_EQ(plain.encode_request("", {"Once"}).context, std::vector<int64_t>{1});  // lm-eval's prefix token
}

}  // namespace
}  // namespace swiftcpp
