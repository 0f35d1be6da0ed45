// GRPO against TRL's own numbers (../shared/assets/reference/rlhf/grpo.json; its README gives the batch and every
// formula): per-token log-probs at the sampling temperature, group advantages, the loss of every loss type with and
// without the KL term and its metrics and LoRA gradient norms, and the two-iteration case where one AdamW step
// makes the ratio clip. The policy is stories260K + lora_init, the reference the same model with its adapters off.
// Also the reward functions (GSM8K accuracy on the real test rows, the format pattern, the length and repetition
// shapes, external commands and their failures) and the prompt rows.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "tests/parity_util.h"
#include "tests/tensor_util.h"
#include "train/grpo.h"
#include "train/optim.h"
#include "train/rewards.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::expect_close;
using test::print_parity;
using test::Tol;
using test::Worst;
using test::expect_error;
using test::json_to_tensor;
using test::stories_dir;

// |ours - TRL| <= atol + rtol |TRL|, from the reference README's measured float32 noise (OpenBLAS against netlib).
constexpr Tol kTokenTol{1e-5, 2e-5};       // per-token log-probs, k3, entropy
constexpr Tol kLossTol{1e-5, 1e-6};        // losses (the grpo loss with beta 0 is ~1e-8: absolute floor)
constexpr Tol kMetricTol{1e-5, 1e-6};
constexpr Tol kGradTol{1e-5, 0};
// Iteration 2, after one AdamW step at lr 1e-2: AdamW's m / sqrt(v) turns float32 rounding in a small gradient element
// into up to lr of weight change, so the BLAS kernel shows here: grad norms land up to 1.0e-4 (relative) from TRL's with
// OpenBLAS's sgemm and up to 1.45e-4 with oneDNN's (whose products are as close to float64 as OpenBLAS's).
constexpr Tol kAfterStepTol{2.5e-4, 1e-6};
constexpr Tol kAfterStepLogpsTol{1e-3, 2e-4};

fs::path rlhf_dir() { return assets() / "reference" / "rlhf"; }
fs::path lora_init_dir() { return assets() / "reference" / "stories260K" / "lora_init"; }

const Json& reference() {
  static const Json json = load_json_file(rlhf_dir() / "grpo.json");
  return json;
}

#define SWIFTCPP_REQUIRE_GRPO()                            \
  SWIFTCPP_REQUIRE_SHARED(rlhf_dir() / "grpo.json");        \
  SWIFTCPP_REQUIRE_SHARED(lora_init_dir() / "adapter_config.json")

struct Policy {
  CausalLM model{nullptr};
  LoraConfig lora;
};

Policy load_policy() {
  Policy p;
  p.model = load_causal_lm(stories_dir());
  p.lora = load_adapter(p.model, lora_init_dir());
  p.model->eval();  // as the reference ran it: nothing dropped
  return p;
}

// The reference batch through our collation: prompt ids, completion ids and the counted tokens of each row.
struct ReferenceBatch {
  std::vector<std::vector<int64_t>> prompts, completions;
  std::vector<int64_t> counted;
  CompletionBatch batch;
  at::Tensor mask;  // [4, 24] the reference's completion mask
};

ReferenceBatch reference_batch() {
  ReferenceBatch r;
  const Json& b = reference()["batch"];
  r.mask = json_to_tensor(b["completion_mask"]).to(at::kFloat);
  for (size_t i = 0; i < b["prompt_ids"].size(); ++i) {
    r.prompts.push_back(b["prompt_ids"][i].get<std::vector<int64_t>>());
    r.completions.push_back(b["completion_ids"][i].get<std::vector<int64_t>>());
    r.counted.push_back(static_cast<int64_t>(r.mask[static_cast<int64_t>(i)].sum().item<double>()));
  }
  std::vector<const std::vector<int64_t>*> p, c;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    p.push_back(&r.prompts[i]);
    c.push_back(&r.completions[i]);
  }
  r.batch = collate_completions(p, c, r.counted, reference()["settings"]["pad_id"].get<int64_t>());
  return r;
}

// A [4, C] tensor of ours against the reference's [4][24], at masked positions only.
void expect_tokens(const at::Tensor& ours, const Json& theirs, const at::Tensor& mask, Tol tol, const std::string& what,
                   Worst& worst) {
  const at::Tensor expected = json_to_tensor(theirs);
  const at::Tensor a = ours.detach().to(at::kDouble);
  for (int64_t r = 0; r < mask.size(0); ++r) {
    for (int64_t t = 0; t < mask.size(1); ++t) {
      if (mask[r][t].item<float>() == 0) continue;
      expect_close(a[r][t].item<double>(), expected[r][t].item<double>(), tol,
                   what + "[" + std::to_string(r) + "][" + std::to_string(t) + "]", worst);
    }
  }
}

GrpoOptions options_of(const Json& c) {
  GrpoOptions o;
  const Json& s = reference()["settings"];
  o.loss_type = parse_grpo_loss_type(c["loss_type"].get<std::string>());
  o.scale_rewards = parse_scale_rewards(c["scale_rewards"].get<std::string>());
  o.beta = c["beta"].get<double>();
  o.epsilon = s["epsilon_low"].get<double>();
  o.epsilon_high = s["epsilon_high"].get<double>();
  o.temperature = s["temperature"].get<double>();
  o.max_completion_length = s["max_completion_length"].get<int64_t>();
  o.num_generations = s["num_generations"].get<int64_t>();
  return o;
}

at::Tensor advantages_of(const GrpoOptions& o) {
  const at::Tensor rewards = json_to_tensor(reference()["rewards"]).to(at::kFloat);
  return group_advantages(rewards, o.num_generations, o.scale_rewards).advantages;
}

// The loss of a case on the policy as it stands: per-token log-probs with autograd, the reference's (adapters off)
// and, when given, the old ones.
GrpoLossResult case_loss(const GrpoOptions& o, Policy& policy, const ReferenceBatch& rb, const at::Tensor& ref,
                         const at::Tensor& old) {
  const CompletionLogps lp = completion_logps(policy.model, rb.batch, o.temperature, true);
  GrpoLossInputs in;
  in.logps = lp.logps;
  in.entropy = lp.entropy;
  in.mask = rb.batch.mask;
  in.advantages = advantages_of(o);
  if (o.beta != 0) in.ref_logps = ref;
  in.old_logps = old;
  in.dapo_tokens = rb.batch.mask.sum().item<double>();  // one process, one batch: the batch's completion tokens
  return grpo_loss(o, in);
}

at::Tensor reference_logps(Policy& policy, const ReferenceBatch& rb, double temperature) {
  at::NoGradGuard no_grad;
  AdaptersDisabled off(policy.model);
  return completion_logps(policy.model, rb.batch, temperature, false).logps;
}

void expect_metrics(const std::map<std::string, double>& ours, const Json& theirs, Tol tol, const std::string& what,
                    Worst& worst) {
  for (const auto& [key, value] : theirs.items()) {
    // low_min / high_max are the min / max over processes of the same mean: one process here.
    std::string name = key;
    if (key == "clip_ratio/low_min") name = "clip_ratio/low_mean";
    if (key == "clip_ratio/high_max") name = "clip_ratio/high_mean";
    const auto it = ours.find(name);
    if (it == ours.end()) {
      ADD_FAILURE() << what << ": metric " << key << " is missing";
      continue;
    }
    expect_close(it->second, value.get<double>(), tol, what + " " + key, worst);
  }
}

void expect_grads(const at::Tensor& loss, const std::vector<TrainableTensor>& tensors, const Json& norms, Tol tol,
                  const std::string& what, Worst& worst) {
  std::vector<at::Tensor> inputs;
  for (const auto& t : tensors) inputs.push_back(t.tensor);
  const auto grads = torch::autograd::grad({loss}, inputs, {}, /*retain_graph=*/true);
  double sum_sq = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    sum_sq += grads[i].to(at::kDouble).pow(2).sum().item<double>();
    const std::string name = tensors[i].name;
    if (norms["selected"].contains(name)) {
      expect_close(grads[i].norm().item<double>(), norms["selected"][name].get<double>(), tol, what + " |grad " + name + "|",
                   worst);
    }
  }
  expect_close(std::sqrt(sum_sq), norms["total"].get<double>(), tol, what + " |grad| total", worst);
}

TEST(GrpoParity, BatchLayoutAndPerTokenLogpsMatchTrl) {
  SWIFTCPP_REQUIRE_GRPO();
  Policy policy = load_policy();
  const ReferenceBatch rb = reference_batch();
  EXPECT_EQ(rb.counted, (std::vector<int64_t>{24, 16, 11, 24}));
  ASSERT_EQ(rb.batch.mask.size(1), 24);
  EXPECT_TRUE(at::equal(rb.batch.mask, rb.mask));
  const Json& per_token = reference()["per_token"];
  const double temperature = reference()["settings"]["temperature"].get<double>();
  std::map<std::string, Worst> worst;
  at::NoGradGuard no_grad;
  const CompletionLogps pol = completion_logps(policy.model, rb.batch, temperature, true);
  const at::Tensor ref = reference_logps(policy, rb, temperature);
  expect_tokens(pol.logps, per_token["policy_logps"], rb.mask, kTokenTol, "policy log-prob", worst["policy"]);
  expect_tokens(ref, per_token["reference_logps"], rb.mask, kTokenTol, "reference log-prob", worst["reference"]);
  expect_tokens(pol.entropy, per_token["policy_entropy"], rb.mask, kTokenTol, "entropy", worst["entropy"]);
  const at::Tensor diff = ref - pol.logps;
  expect_tokens(at::exp(diff) - diff - 1, per_token["k3_kl"], rb.mask, kTokenTol, "k3", worst["k3"]);
  print_parity("GRPO per-token values", worst);
}

TEST(GrpoParity, GroupAdvantagesMatchTrl) {
  SWIFTCPP_REQUIRE_GRPO();
  const at::Tensor rewards = json_to_tensor(reference()["rewards"]).to(at::kFloat);
  Worst worst;
  for (const char* scale : {"group", "none"}) {
    const at::Tensor a = group_advantages(rewards, 4, parse_scale_rewards(scale)).advantages;
    const Json& expected = reference()["advantages"][scale]["values"];
    for (int64_t i = 0; i < 4; ++i) {
      expect_close(a[i].item<double>(), expected[static_cast<size_t>(i)].get<double>(), {1e-6, 1e-7},
                   std::string("advantage ") + scale, worst);
    }
  }
  // batch: the whole batch's std (one group here: the group's).
  const at::Tensor batch = group_advantages(rewards, 4, ScaleRewards::kBatch).advantages;
  const at::Tensor group = group_advantages(rewards, 4, ScaleRewards::kGroup).advantages;
  EXPECT_TRUE(at::allclose(batch, group, 1e-6, 1e-7));
  // Two groups, one constant: its advantages are 0 and its std is 0.
  const GroupAdvantages two = group_advantages(at::tensor({1.0F, 1.0F, 0.0F, 2.0F}), 2, ScaleRewards::kGroup);
  EXPECT_EQ(two.advantages[0].item<float>(), 0.0F);
  EXPECT_EQ(two.group_std[0].item<float>(), 0.0F);
  EXPECT_NEAR(two.advantages[2].item<float>(), -1.0 / (std::sqrt(2.0) + 1e-4), 1e-6);
}

TEST(GrpoParity, EveryLossTypeAndBetaMatchesTrl) {
  SWIFTCPP_REQUIRE_GRPO();
  Policy policy = load_policy();
  const ReferenceBatch rb = reference_batch();
  const std::vector<TrainableTensor> tensors = adapter_tensors(policy.model, policy.lora);
  ASSERT_EQ(tensors.size(), reference()["lora_tensor_names"].size());
  const at::Tensor ref = reference_logps(policy, rb, reference()["settings"]["temperature"].get<double>());
  std::map<std::string, Worst> worst;
  int cases = 0;
  for (const Json& c : reference()["cases"]) {
    const GrpoOptions o = options_of(c);
    const std::string what = fmt::format("{} beta {} scale {}", c["loss_type"].get<std::string>(),
                                         c["beta"].get<double>(), c["scale_rewards"].get<std::string>());
    const GrpoLossResult res = case_loss(o, policy, rb, ref, {});
    expect_close(res.loss.item<double>(), c["loss"].get<double>(), kLossTol, what + " loss", worst["loss"]);
    expect_metrics(res.metrics, c["metrics"], kMetricTol, what, worst["metrics"]);
    if (o.beta == 0) {
      EXPECT_EQ(res.metrics.count("kl"), 0u) << what;
    }
    expect_grads(res.loss, tensors, c["grad_norms"], kGradTol, what, worst["grad"]);
    ++cases;
  }
  EXPECT_EQ(cases, 16);
  print_parity("GRPO losses (num_iterations 1)", worst);
}

TEST(GrpoParity, TwoIterationsWithAnAdamWStepClipAsTrl) {
  SWIFTCPP_REQUIRE_GRPO();
  SWIFTCPP_REQUIRE_SHARED(rlhf_dir() / "grpo_iter2_step_grpo_beta0.04" / "adapter_model.safetensors");
  const Json& opt = reference()["num_iterations_2_procedure"]["optimizer"];
  std::map<std::string, Worst> worst;
  int cases = 0;
  for (const Json& c : reference()["num_iterations_2"]) {
    Policy policy = load_policy();  // each case starts from lora_init
    const ReferenceBatch rb = reference_batch();
    const GrpoOptions o = options_of(c);
    const std::string what = fmt::format("{} beta {} scale {}", c["loss_type"].get<std::string>(),
                                         c["beta"].get<double>(), c["scale_rewards"].get<std::string>());
    const std::vector<TrainableTensor> tensors = adapter_tensors(policy.model, policy.lora);
    const at::Tensor ref = reference_logps(policy, rb, o.temperature);
    at::Tensor old;
    {
      at::NoGradGuard no_grad;
      old = completion_logps(policy.model, rb.batch, o.temperature, false).logps;
    }
    // Iteration 1: ratio 1, the same values as num_iterations 1.
    const GrpoLossResult first = case_loss(o, policy, rb, ref, old);
    const Json& it1 = c["iteration1"];
    expect_close(first.loss.item<double>(), it1["loss"].get<double>(), kLossTol, what + " iteration 1 loss", worst["it1"]);
    expect_metrics(first.metrics, it1["metrics"], kMetricTol, what + " iteration 1", worst["it1"]);
    expect_grads(first.loss, tensors, it1["grad_norms"], kGradTol, what + " iteration 1", worst["it1 grad"]);
    AdamWOptions ao;
    ao.lr = opt["lr"].get<double>();
    ao.beta1 = opt["betas"][0].get<double>();
    ao.beta2 = opt["betas"][1].get<double>();
    ao.eps = opt["eps"].get<double>();
    ao.weight_decay = opt["weight_decay"].get<double>();
    AdamW adam(tensors, ao);
    first.loss.backward();
    adam.step(ao.lr);
    adam.zero_grad();
    // Iteration 2: the stepped policy against the same old and reference log-probs and advantages.
    const GrpoLossResult second = case_loss(o, policy, rb, ref, old);
    const Json& it2 = c["iteration2"];
    expect_close(second.loss.item<double>(), it2["loss"].get<double>(), kAfterStepTol, what + " iteration 2 loss",
                 worst["it2"]);
    expect_metrics(second.metrics, it2["metrics"], kAfterStepTol, what + " iteration 2", worst["it2"]);
    expect_grads(second.loss, tensors, it2["grad_norms"], kAfterStepTol, what + " iteration 2", worst["it2 grad"]);
    {
      at::NoGradGuard no_grad;
      const at::Tensor after = completion_logps(policy.model, rb.batch, o.temperature, false).logps;
      expect_tokens(after, it2["policy_logps_after_step"], rb.mask, kAfterStepLogpsTol, what + " logps after step",
                    worst["it2 logps"]);
      expect_tokens(at::exp(after - old), it2["ratio_after_step"], rb.mask, kAfterStepLogpsTol,
                    what + " ratio after step", worst["it2 ratio"]);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 16);
  print_parity("GRPO num_iterations 2", worst);
}

// A grpo loss with beta 0 is ~0 (the advantages of a group sum to 0 and the ratio is 1) while its gradient is not.
TEST(GrpoParity, GrpoLossNearZeroStillHasAGradient) {
  SWIFTCPP_REQUIRE_GRPO();
  Policy policy = load_policy();
  const ReferenceBatch rb = reference_batch();
  GrpoOptions o = options_of(reference()["cases"][0]);
  ASSERT_EQ(o.loss_type, GrpoLossType::kGrpo);
  ASSERT_EQ(o.beta, 0.0);
  const GrpoLossResult res = case_loss(o, policy, rb, {}, {});
  EXPECT_LT(std::abs(res.loss.item<double>()), 1e-6);
  res.loss.backward();
  double norm = 0;
  for (const auto& t : adapter_tensors(policy.model, policy.lora)) norm += t.tensor.grad().pow(2).sum().item<double>();
  EXPECT_GT(std::sqrt(norm), 1e-3);
}

// ---------------------------------------------------------------------------------------------------------------
// Rewards

RewardSample sample(const std::string& completion, const std::string& solution = "", int64_t tokens = 0) {
  RewardSample s;
  s.completion = completion;
  s.completion_tokens = tokens;
  s.where = "rows.jsonl:1";
  if (!solution.empty()) s.fields["solution"] = solution;
  return s;
}

// Every real GSM8K test row: its gold solution scores 1 as a completion, the same with the final answer changed
// scores 0, and a bare final number scores 1.
TEST(GrpoRewards, AccuracyOnTheRealGsm8kTestRows) {
  const fs::path file = assets() / "data" / "eval" / "gsm8k" / "test.jsonl";
  SWIFTCPP_REQUIRE_SHARED(file);
  std::ifstream in(file);
  int rows = 0;
  auto accuracy = make_reward_function("accuracy", RewardSettings{});
  std::vector<RewardSample> gold, perturbed, bare;
  for (std::string line; std::getline(in, line);) {
    const Json row = Json::parse(line);
    const std::string answer = row["answer"].get<std::string>();
    const size_t at = answer.rfind("#### ");
    ASSERT_NE(at, std::string::npos);
    std::string number = answer.substr(at + 5);
    number.erase(std::remove(number.begin(), number.end(), ','), number.end());
    const long long value = std::stoll(number);
    gold.push_back(sample(answer, answer));
    perturbed.push_back(sample(answer.substr(0, at) + "#### " + std::to_string(value + 1), answer));
    bare.push_back(sample("So the answer is " + std::to_string(value) + ".", answer));
    ++rows;
  }
  EXPECT_EQ(rows, 1319);
  for (double v : accuracy->score(gold)) EXPECT_EQ(v, 1.0);
  for (double v : accuracy->score(perturbed)) EXPECT_EQ(v, 0.0);
  for (double v : accuracy->score(bare)) EXPECT_EQ(v, 1.0);
  // "#### N" wins over a later number; a thousands separator does not matter; no number scores 0.
  EXPECT_EQ(gsm8k_accuracy("#### 1,000 and then 7", "#### 1000"), 1.0);
  EXPECT_EQ(gsm8k_accuracy("I do not know", "#### 5"), 0.0);
  expect_error<ConfigError>([&] { accuracy->score({sample("#### 1")}); }, {"rows.jsonl:1", "solution"});
}

TEST(GrpoRewards, FormatFollowsMsSwiftsPattern) {
  EXPECT_TRUE(think_answer_format("<think>a</think><answer>b</answer>"));
  EXPECT_TRUE(think_answer_format("<think>line\nline</think>\n \t<answer>x\ny</answer>"));
  EXPECT_TRUE(think_answer_format("<think></think><answer></answer>"));
  EXPECT_FALSE(think_answer_format(" <think>a</think><answer>b</answer>"));  // anchored at the start
  EXPECT_FALSE(think_answer_format("<think>a</think><answer>b</answer>\n"));  // nothing after the answer
  EXPECT_FALSE(think_answer_format("<think>a</think> text <answer>b</answer>"));
  EXPECT_FALSE(think_answer_format("<answer>b</answer>"));
  EXPECT_TRUE(think_answer_format("<think>a</think>x</think> <answer>b</answer>"));  // a later </think> may match
  auto format = make_reward_function("format", RewardSettings{});
  EXPECT_EQ(format->score({sample("<think>a</think><answer>b</answer>"), sample("b")}), (std::vector<double>{1, 0}));
}

TEST(GrpoRewards, LengthAndRepetitionShapes) {
  RewardSettings s;
  s.max_completion_length = 100;
  s.soft_cache_length = 20;
  auto overlong = make_reward_function("soft_overlong", s);
  // expected length 80: no penalty up to it, then linear to -1 at 100.
  EXPECT_EQ(overlong->score({sample("", "", 80), sample("", "", 90), sample("", "", 100), sample("", "", 10)}),
            (std::vector<double>{0.0, -0.5, -1.0, 0.0}));
  s.soft_cache_length = 0;
  expect_error<ConfigError>([&] { make_reward_function("soft_overlong", s); }, {"soft_cache_length"});

  auto repetition = make_reward_function("repetition", RewardSettings{});
  const std::vector<double> r = repetition->score(
      {sample("a b c d e"), sample("a b c a b c a b c"), sample("a b"), sample("A b c a B c")});
  EXPECT_EQ(r[0], 0.0);                                // every 3-gram distinct
  EXPECT_NEAR(r[1], -(1.0 - 3.0 / 7.0), 1e-12);        // 7 trigrams, 3 distinct
  EXPECT_EQ(r[2], 0.0);                                // fewer words than n
  EXPECT_NEAR(r[3], -(1.0 - 3.0 / 4.0), 1e-12);        // lower-cased: abc bca cab abc

  RewardSettings c;
  c.cosine_max_len = 100;
  auto cosine = make_reward_function("cosine", c);
  const std::vector<double> v = cosine->score({sample("#### 3", "#### 3", 0), sample("#### 3", "#### 3", 100),
                                               sample("#### 4", "#### 3", 0), sample("#### 4", "#### 3", 100),
                                               sample("#### 3", "#### 3", 50)});
  EXPECT_NEAR(v[0], 1.0, 1e-12);   // correct, short
  EXPECT_NEAR(v[1], 0.5, 1e-12);   // correct, long
  EXPECT_NEAR(v[2], -0.5, 1e-12);  // wrong, short
  EXPECT_NEAR(v[3], 0.0, 1e-12);   // wrong, long
  EXPECT_NEAR(v[4], 0.75, 1e-12);  // half way: the cosine's middle
  expect_error<ConfigError>([&] { make_reward_function("nope", RewardSettings{}); }, {"unknown reward", "external:"});
}

TEST(GrpoRewards, ExternalCommandGetsJsonLinesAndItsFailuresStopWithItsStderr) {
  const fs::path dir = test::temp_dir("grpo_external");
  std::vector<RewardSample> batch = {sample("hello", "#### 1"), sample("bye", "#### 2")};
  batch[0].prompt = "say hello";
  batch[0].fields["target"] = "hello";
  // The command sees one JSON object per completion and answers in order.
  const std::string echo = "external:cat > " + (dir / "in.jsonl").string() + "; printf '0.5\\n\\n-2\\n'";
  EXPECT_EQ(make_reward_function(echo, RewardSettings{})->score(batch), (std::vector<double>{0.5, -2.0}));
  std::ifstream in(dir / "in.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const Json first = Json::parse(line);
  EXPECT_EQ(first["prompt"], "say hello");
  EXPECT_EQ(first["completion"], "hello");
  EXPECT_EQ(first["target"], "hello");
  EXPECT_EQ(first["solution"], "#### 1");
  EXPECT_FALSE(first["truncated"].get<bool>());
  EXPECT_EQ(make_reward_function("external:printf 'nan\\n1\\n'", RewardSettings{})->name(), "external_printf");
  EXPECT_TRUE(std::isnan(make_reward_function("external:printf 'nan\\n1\\n'", RewardSettings{})->score(batch)[0]));

  expect_error<Error>([&] { make_reward_function("external:echo broken >&2; exit 3", RewardSettings{})->score(batch); },
                      {"exit status 3", "broken"});
  expect_error<Error>([&] { make_reward_function("external:echo 1", RewardSettings{})->score(batch); },
                      {"1 non-empty lines for 2 completions"});
  expect_error<Error>([&] { make_reward_function("external:printf '1\\nabc\\n'", RewardSettings{})->score(batch); },
                      {"line 2", "'abc'"});
  RewardSettings quick;
  quick.timeout_s = 0.3;
  expect_error<Error>([&] { make_reward_function("external:echo waiting >&2; sleep 5", quick)->score(batch); },
                      {"reward_timeout", "waiting"});
  // A command that prints without end is stopped at its output limit (1 MiB here), not read into memory.
  expect_error<Error>([&] { make_reward_function("external:yes 1", RewardSettings{})->score(batch); },
                      {"printed more than 1048576 bytes", "killed"});
  // A command that never reads its input does not take the process down with SIGPIPE.
  std::vector<RewardSample> big(2000, sample(std::string(1000, 'x')));
  const std::vector<double> ones = make_reward_function("external:yes 1 | head -n 2000", RewardSettings{})->score(big);
  EXPECT_EQ(ones.size(), 2000u);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------------------------
// Prompt rows

TEST(GrpoData, PromptRowsInEveryForm) {
  GrpoPrompt p = normalise_grpo_row(Json::parse(R"({"messages": [{"role": "system", "content": "s"},
      {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "solution": "42"})"), "f:1");
  ASSERT_EQ(p.messages.size(), 2u);  // the final assistant turn is dropped
  EXPECT_EQ(p.messages[1].content, "q");
  EXPECT_EQ(p.fields["solution"], "42");
  EXPECT_FALSE(p.fields.contains("messages"));

  p = normalise_grpo_row(Json::parse(R"({"question": "2+2?", "answer": "4\n#### 4"})"), "f:2");
  ASSERT_EQ(p.messages.size(), 1u);
  EXPECT_EQ(p.messages[0].role, "user");
  EXPECT_EQ(p.fields["solution"], "4\n#### 4");  // GSM8K: the answer is the solution
  EXPECT_EQ(p.fields["answer"], "4\n#### 4");

  p = normalise_grpo_row(Json::parse(R"({"query": "hi", "response": "dropped", "system": "be brief", "k": 1})"), "f:3");
  ASSERT_EQ(p.messages.size(), 2u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_FALSE(p.fields.contains("response"));
  EXPECT_EQ(p.fields["k"], 1);

  p = normalise_grpo_row(Json::parse(R"({"prompt": "Once upon a time"})"), "f:4");
  EXPECT_EQ(p.messages[0].content, "Once upon a time");

  expect_error<BadRowError>([] { normalise_grpo_row(Json::parse(R"({"text": "x"})"), "f:5"); }, {"f:5", "no prompt"});
  expect_error<BadRowError>([] {
    normalise_grpo_row(Json::parse(R"({"messages": [{"role": "assistant", "content": "a"}]})"), "f:6");
  }, {"f:6", "end with a user turn"});
  expect_error<BadRowError>([] {
    normalise_grpo_row(Json::parse(R"({"messages": [{"role": "user", "content": 3}]})"), "f:7");
  }, {"f:7", "bad message"});
  // Images as SFT rows give them: a column with placeholders, or content parts; the reward functions see the files.
  p = normalise_grpo_row(Json::parse(R"({"prompt": "<image>What colour?", "images": ["img/a.png"], "target": "red"})"),
                         "f:9", "/data");
  EXPECT_EQ(p.images, std::vector<fs::path>{"/data/img/a.png"});
  EXPECT_EQ(p.fields["images"], Json::array({"/data/img/a.png"}));
  EXPECT_EQ(p.fields["target"], "red");
  p = normalise_grpo_row(Json::parse(R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "/abs/b.jpg"},
      {"type": "text", "text": "Shape?"}]}]})"), "f:10", "/data");
  EXPECT_EQ(p.images, std::vector<fs::path>{"/abs/b.jpg"});
  EXPECT_EQ(p.messages[0].content, "<image>Shape?");
  expect_error<BadRowError>([] {
    normalise_grpo_row(Json::parse(R"({"prompt": "x", "images": ["a.png"]})"), "f:8");
  }, {"f:8", "image count mismatch"});
  expect_error<BadRowError>([] {
    normalise_grpo_row(Json::parse(R"({"prompt": "<image>x", "images": 5})"), "f:11");
  }, {"f:11", "bad images"});
}

}  // namespace
}  // namespace swiftcpp
