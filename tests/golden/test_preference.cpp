// Preference objectives against TRL v0.9.6's own numbers (../shared/assets/reference/rlhf/dpo_family.json; its
// README gives the batch layout and every formula): the adapter off switch that gives the reference model, the
// per-sequence log-probabilities, each DPO-family loss with its rewards, metrics and LoRA gradient norms, KTO with
// its mismatched KL batch, and one DPO step of the trainer (pair_objective inside Trainer's step parts). The policy is stories260K + lora_init, the reference the same
// model with its adapters switched off. Also the options' checks and the reward model's loss by hand.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "data/collate.h"
#include "data/preference_data.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "tests/adapter_util.h"
#include "tests/parity_util.h"
#include "tests/tensor_util.h"
#include "train/optim.h"
#include "train/preference.h"
#include "train/rlhf.h"
#include "train/trainer.h"

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

// Tolerances as |ours - TRL| <= atol + rtol |TRL|, from the reference README: float32 values computed in a
// different order (our decoder and kernels against transformers'). Log-prob sums of up to 64 tokens (down to
// -316) carry ~5e-5 of that noise, so values that are beta times a difference of sums (rewards, kl) need an
// absolute floor; losses near 0 too.
constexpr Tol kLogpsTol{1e-5, 0};
constexpr Tol kLossTol{1e-5, 2e-5};
constexpr Tol kRewardTol{1e-5, 5e-5};
constexpr Tol kLogitsTol{1e-5, 1e-6};  // logits/*, log_odds_*
constexpr Tol kGradTol{1e-5, 0};
// After an optimizer step (README: Adam's first step is ~lr sign(g), sensitive only where |g| ~ eps).
constexpr Tol kAfterStepTol{1e-4, 5e-5};
// Adapter tensors after the step: norm-wise relative error per tensor, as the text trainer's LoRA parity test.
constexpr double kAdapterRelTol = 1e-5;

fs::path rlhf_dir() { return assets() / "reference" / "rlhf"; }
fs::path lora_init_dir() { return assets() / "reference" / "stories260K" / "lora_init"; }

const Json& reference() {
  static const Json json = load_json_file(rlhf_dir() / "dpo_family.json");
  return json;
}

// Every element of a tensor against a JSON list.
void expect_close(const at::Tensor& actual, const Json& expected, Tol tol, const std::string& what, Worst& worst) {
  const at::Tensor a = actual.detach().to(at::kDouble).reshape({-1});
  ASSERT_EQ(a.numel(), static_cast<int64_t>(expected.size())) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    expect_close(a[i].item<double>(), expected[i].get<double>(), tol, what + "[" + std::to_string(i) + "]", worst);
  }
}

at::Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows, int64_t length, int64_t pad) {
  at::Tensor out = at::full({static_cast<int64_t>(rows.size()), length}, pad, at::kLong);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t t = 0; t < rows[r].size(); ++t) out[r][t] = rows[r][t];
  }
  return out;
}

std::vector<int64_t> ids_of(const Json& j) { return j.get<std::vector<int64_t>>(); }

// TRL's padded layout of prompt + answer rows: input ids right-padded with 0, attention mask, and Hugging Face
// labels (unshifted: -100 on the prompt and padding), all [rows, longest].
struct PaddedRows {
  at::Tensor input_ids, attention_mask, hf_labels;

  // Our convention: labels[t] is the token position t predicts (hf_labels[t + 1]), kIgnoreIndex at the end.
  at::Tensor shifted_labels() const {
    at::Tensor out = at::full_like(hf_labels, kIgnoreIndex);
    const int64_t T = hf_labels.size(1);
    out.narrow(1, 0, T - 1).copy_(hf_labels.narrow(1, 1, T - 1));
    return out;
  }
  // ORPO's NLL targets in TRL v0.9.6: every non-padding token (prompt included), shifted.
  at::Tensor shifted_all_token_labels() const {
    const at::Tensor all = input_ids.masked_fill(attention_mask.eq(0), kIgnoreIndex);
    at::Tensor out = at::full_like(all, kIgnoreIndex);
    const int64_t T = all.size(1);
    out.narrow(1, 0, T - 1).copy_(all.narrow(1, 1, T - 1));
    return out;
  }
  at::Tensor key_valid() const { return attention_mask.to(at::kBool); }
};

PaddedRows pad_rows(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& answers) {
  std::vector<std::vector<int64_t>> ids, labels, mask;
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> row = prompts[i], label(prompts[i].size(), kIgnoreIndex);
    row.insert(row.end(), answers[i].begin(), answers[i].end());
    label.insert(label.end(), answers[i].begin(), answers[i].end());
    longest = std::max<int64_t>(longest, static_cast<int64_t>(row.size()));
    mask.emplace_back(row.size(), 1);
    ids.push_back(std::move(row));
    labels.push_back(std::move(label));
  }
  return {ids_tensor(ids, longest, 0), ids_tensor(mask, longest, 0), ids_tensor(labels, longest, kIgnoreIndex)};
}

void expect_equal_ids(const at::Tensor& ours, const Json& theirs, const std::string& what) {
  EXPECT_TRUE(at::equal(ours, json_to_tensor(theirs).to(at::kLong))) << what << " differs from the reference layout";
}

struct Policy {
  CausalLM model{nullptr};
  LoraConfig lora;
};

Policy load_policy() {
  Policy p;
  p.model = load_causal_lm(stories_dir());
  p.lora = load_adapter(p.model, lora_init_dir());
  p.model->eval();
  return p;
}

at::Tensor forward(CausalLM& model, const PaddedRows& rows) {
  ForwardOptions options;
  options.key_valid = rows.key_valid();
  return model->forward(rows.input_ids, options);  // [B, T, V]
}

// The reference model's log-probs: the same model with its adapters switched off, without autograd.
SequenceLogps reference_logps(CausalLM& model, const PaddedRows& rows) {
  at::NoGradGuard no_grad;
  AdaptersDisabled off(model);
  return sequence_logps(forward(model, rows), rows.shifted_labels());
}

// Logits [B, T, V] of a right-padded batch as Hugging Face's eager Llama computes them from attention_mask: a
// padding query attends to the real tokens before it and not to itself (our decoder's mask lets it see its own
// key, which keeps the row finite). Real positions are the same either way; TRL v0.9.6's logits/* metrics average
// over the padding positions too, so they are compared on these logits.
at::Tensor hf_padded_logits(CausalLM& model, const PaddedRows& rows) {
  at::NoGradGuard no_grad;
  const DecoderConfig& c = model->config();
  const int64_t B = rows.input_ids.size(0), T = rows.input_ids.size(1);
  nn::RotaryEmbedding rotary(c.head_dim, c.rope_theta, c.rope_scaling, T);
  const at::Tensor positions = at::arange(T, at::kLong).unsqueeze(0).expand({B, T});
  const auto [cos, sin] = rotary.cos_sin(positions, T, at::kFloat);
  const at::Tensor causal = at::ones({T, T}, at::kBool).tril().view({1, 1, T, T});
  const at::Tensor mask = causal.logical_and(rows.key_valid().view({B, 1, 1, T}));  // [B, 1, T, T]
  at::Tensor h = model->embed(rows.input_ids);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    h = model->model->layers[i]->as<DecoderLayer>()->forward(h, cos, sin, mask, nullptr, nullptr, i);
  }
  return model->logits(model->model->norm(h));
}

// The 6-row concatenated batch of the reference: rows 0..2 prompt + chosen, rows 3..5 prompt + rejected.
PaddedRows concatenated_batch() {
  const Json& pairs = reference()["batch"]["pairs"];
  std::vector<std::vector<int64_t>> prompts, answers;
  for (const char* side : {"chosen_ids", "rejected_ids"}) {
    for (const auto& pair : pairs) {
      prompts.push_back(ids_of(pair["prompt_ids"]));
      answers.push_back(ids_of(pair[side]));
    }
  }
  PaddedRows rows = pad_rows(prompts, answers);
  const Json& concatenated = reference()["batch"]["concatenated"];
  expect_equal_ids(rows.input_ids, concatenated["input_ids"], "input_ids");
  expect_equal_ids(rows.attention_mask, concatenated["attention_mask"], "attention_mask");
  expect_equal_ids(rows.hf_labels, concatenated["labels"], "labels");
  return rows;
}

PreferenceOptions options_from(const Json& method) {
  const Json& s = method["settings"];
  const std::string trainer = method["trainer"].get<std::string>();
  PreferenceOptions o;
  o.rlhf_type = trainer.rfind("DPO", 0) == 0 ? RlhfType::kDpo
                : trainer.rfind("KTO", 0) == 0 ? RlhfType::kKto
                : trainer.rfind("ORPO", 0) == 0 ? RlhfType::kOrpo
                                                : RlhfType::kCpo;
  if (s.contains("loss_type")) {
    o.loss_type = parse_preference_loss_type(s["loss_type"].get<std::string>());
    // ms-swift's rlhf_type simpo is CPO with loss_type simpo.
    if (*o.loss_type == PreferenceLossType::kSimpo) o.rlhf_type = RlhfType::kSimpo;
  }
  if (s.contains("beta")) o.beta = s["beta"].get<double>();
  if (s.contains("label_smoothing")) o.label_smoothing = s["label_smoothing"].get<double>();
  if (s.contains("rpo_alpha")) o.rpo_alpha = s["rpo_alpha"].get<double>();
  if (s.contains("reference_free")) o.reference_free = s["reference_free"].get<bool>();
  if (s.contains("cpo_alpha")) o.cpo_alpha = s["cpo_alpha"].get<double>();
  if (s.contains("simpo_gamma")) o.simpo_gamma = s["simpo_gamma"].get<double>();
  if (s.contains("desirable_weight")) o.desirable_weight = s["desirable_weight"].get<double>();
  if (s.contains("undesirable_weight")) o.undesirable_weight = s["undesirable_weight"].get<double>();
  o.validate();
  return o;
}

Tol metric_tol(const std::string& key) {
  if (key == "loss" || key == "nll_loss") return kLossTol;
  if (key.rfind("rewards/", 0) == 0 || key == "kl") return kRewardTol;
  if (key.rfind("logps/", 0) == 0) return kLogpsTol;
  return kLogitsTol;  // logits/*, log_odds_*
}

// Every metric TRL logged, and no other.
void expect_metrics(const std::map<std::string, double>& ours, const Json& theirs, Tol (*tol)(const std::string&),
                    const std::string& what, Worst& worst) {
  for (const auto& [key, value] : theirs.items()) {
    const auto it = ours.find(key);
    if (it == ours.end()) {
      ADD_FAILURE() << what << ": metric " << key << " is missing";
      continue;
    }
    expect_close(it->second, value.get<double>(), tol(key), what + " " + key, worst);
  }
  for (const auto& [key, value] : ours) EXPECT_TRUE(theirs.contains(key)) << what << ": extra metric " << key;
}

// Gradient norms of `loss` over the adapter tensors against the reference's total (float64 sum of squares of the
// float32 gradients), selected and per-tensor norms.
void expect_grad_norms(const std::vector<at::Tensor>& grads, const std::vector<TrainableTensor>& tensors,
                       const Json& total, const Json& per_tensor, const std::string& what, Worst& worst) {
  ASSERT_EQ(grads.size(), tensors.size());
  ASSERT_EQ(per_tensor.size(), tensors.size()) << what;
  double sum_sq = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << tensors[i].name;
    sum_sq += grads[i].to(at::kDouble).pow(2).sum().item<double>();
    ASSERT_TRUE(per_tensor.contains(tensors[i].name)) << what << ": no reference norm for " << tensors[i].name;
    expect_close(grads[i].norm().item<double>(), per_tensor[tensors[i].name].get<double>(), kGradTol,
                 what + " |grad " + tensors[i].name + "|", worst);
  }
  expect_close(std::sqrt(sum_sq), total.get<double>(), kGradTol, what + " |grad| total", worst);
}

std::vector<at::Tensor> gradients(const at::Tensor& loss, const std::vector<TrainableTensor>& tensors) {
  std::vector<at::Tensor> inputs;
  for (const auto& t : tensors) inputs.push_back(t.tensor);
  return torch::autograd::grad({loss}, inputs, {}, /*retain_graph=*/true);
}

#define SWIFTCPP_REQUIRE_RLHF()                                  \
  SWIFTCPP_REQUIRE_SHARED(rlhf_dir() / "dpo_family.json");       \
  SWIFTCPP_REQUIRE_SHARED(lora_init_dir() / "adapter_config.json")

// ---------------------------------------------------------------------------------------------------------------
// The adapter off switch.

TEST(PreferenceAdapters, DisabledScopeComputesTheBaseModelExactlyAndRestores) {
  SWIFTCPP_REQUIRE_SHARED(lora_init_dir() / "adapter_config.json");
  CausalLM base = load_causal_lm(stories_dir());
  base->eval();
  Policy policy = load_policy();
  const at::Tensor ids = at::randint(3, 512, {2, 24}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor base_logits = base->forward(ids);
  const at::Tensor adapted = policy.model->forward(ids);
  ASSERT_FALSE(at::allclose(adapted, base_logits, 0, 1e-3)) << "lora_init must change the logits";
  {
    AdaptersDisabled off(policy.model);
    EXPECT_TRUE(at::equal(policy.model->forward(ids), base_logits));
    EXPECT_TRUE(adapter_tensors(policy.model, policy.lora).empty());
  }
  EXPECT_TRUE(at::equal(policy.model->forward(ids), adapted));
  EXPECT_EQ(adapter_tensors(policy.model, policy.lora).size(), 70u);
  // An exception unwinding the scope restores the adapters too.
  try {
    AdaptersDisabled off(policy.model);
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(at::equal(policy.model->forward(ids), adapted));
}

TEST(PreferenceAdapters, RefusesModelsWithoutAdaptersAndTrainedBaseModules) {
  CausalLM base = load_causal_lm(stories_dir());
  expect_error<ConfigError>([&] { AdaptersDisabled off(base); }, {"no LoRA adapter", "separate model"});
  // Nested scopes: the inner one finds nothing to switch off.
  SWIFTCPP_REQUIRE_SHARED(lora_init_dir() / "adapter_config.json");
  Policy policy = load_policy();
  {
    AdaptersDisabled off(policy.model);
    expect_error<ConfigError>([&] { AdaptersDisabled again(policy.model); }, {"no LoRA adapter"});
  }
  // modules_to_save copies run with their original values inside the scope (peft's original_module), their trained
  // values come back after it.
  CausalLM loaded = load_causal_lm(stories_dir());
  CausalLM saved = load_causal_lm(stories_dir());
  LoraConfig config;
  config.target_modules = {"q_proj"};
  config.modules_to_save = {"norm"};
  inject_lora(saved, config, 1);
  const at::Tensor ids = at::randint(3, 512, {1, 8}, at::kLong);
  at::NoGradGuard no_grad;
  at::Tensor norm = saved->named_parameters()["model.norm.weight"];
  norm.add_(0.5);  // trained away from its loaded value
  const at::Tensor before = saved->forward(ids);
  ASSERT_FALSE(at::allclose(before, loaded->forward(ids), 0, 1e-3));
  {
    AdaptersDisabled off(saved);
    EXPECT_TRUE(at::equal(saved->forward(ids), loaded->forward(ids)));
  }
  EXPECT_TRUE(at::equal(saved->forward(ids), before));
  EXPECT_TRUE(norm.requires_grad());
  // A trainable base parameter whose original was not kept is refused, and the refused scope changes nothing.
  saved->named_parameters()["model.layers.0.input_layernorm.weight"].requires_grad_(true);
  expect_error<ConfigError>([&] { AdaptersDisabled off(saved); }, {"model.layers.0", "separate reference model"});
  EXPECT_TRUE(at::equal(saved->forward(ids), before)) << "a refused scope changes nothing";
}

// ---------------------------------------------------------------------------------------------------------------
// Pieces by hand.

TEST(PreferenceLogps, SumsCountsAndTokenValuesByHand) {
  const at::Tensor logits = at::randn({2, 4, 5}, at::kDouble);
  at::Tensor labels = at::full({2, 4}, kIgnoreIndex, at::kLong);
  labels[0][1] = 3;
  labels[0][2] = 0;
  labels[0][3] = 4;  // row 1 has no label
  const SequenceLogps lp = sequence_logps(logits, labels);
  ASSERT_EQ(lp.sum.scalar_type(), at::kFloat);
  double want = 0;
  for (const auto& [t, v] : std::vector<std::pair<int, int>>{{1, 3}, {2, 0}, {3, 4}}) {
    double z = 0;
    for (int k = 0; k < 5; ++k) z += std::exp(logits[0][t][k].item<double>());
    const double token = logits[0][t][v].item<double>() - std::log(z);
    EXPECT_NEAR(lp.token_logps[0][t].item<double>(), token, 1e-6);
    want += token;
  }
  EXPECT_EQ(lp.token_logps[0][0].item<double>(), 0.0);
  EXPECT_NEAR(lp.sum[0].item<double>(), want, 1e-5);
  EXPECT_EQ(lp.count[0].item<int64_t>(), 3);
  EXPECT_EQ(lp.sum[1].item<double>(), 0.0);
  EXPECT_EQ(lp.count[1].item<int64_t>(), 0);
  EXPECT_NEAR(lp.average()[0].item<double>(), want / 3, 1e-5);
  EXPECT_NEAR(token_mean_nll(lp).item<double>(), -want / 3, 1e-5);
  EXPECT_EQ(lp.rows(1, 1).count[0].item<int64_t>(), 0);

  // Gradient: d sum / d logits = onehot(label) - softmax at labelled positions, 0 elsewhere.
  const at::Tensor x = logits.to(at::kFloat).requires_grad_(true);
  sequence_logps(x, labels).sum.sum().backward();
  const at::Tensor expected_grad = at::zeros({2, 4, 5}, at::kFloat);
  const at::Tensor probs = at::softmax(x.detach(), -1);
  for (const auto& [t, v] : std::vector<std::pair<int, int>>{{1, 3}, {2, 0}, {3, 4}}) {
    expected_grad[0][t] = -probs[0][t];
    expected_grad[0][t][v] += 1;
  }
  EXPECT_TRUE(at::allclose(x.grad(), expected_grad, 1e-5, 1e-6));

  at::Tensor bad = labels.clone();
  bad[1][0] = 5;
  EXPECT_THROW(sequence_logps(logits, bad), c10::Error);
  EXPECT_THROW(sequence_logps(logits, labels.narrow(1, 0, 3)), c10::Error);
}

TEST(PreferenceLogps, LogitsMeanOverAllOrChosenPositions) {
  const at::Tensor logits = at::arange(12, at::kFloat).view({1, 3, 4});  // rows of 0..3, 4..7, 8..11
  EXPECT_DOUBLE_EQ(logits_mean(logits), 5.5);
  const at::Tensor positions = at::tensor({1, 0, 1}, at::kLong).to(at::kBool).view({1, 3});
  EXPECT_DOUBLE_EQ(logits_mean(logits, positions), (1.5 + 9.5) / 2);
}

TEST(PreferenceRewardModel, BradleyTerryLossWithMarginAndCenteringByHand) {
  // No TRL reference data covers the reward model: this checks the formula on hand-computed values.
  const std::vector<double> c = {1.0, -0.5, 2.0}, r = {0.5, 0.5, 2.5}, m = {0.1, 0.0, 0.2};
  const at::Tensor chosen = at::tensor(c, at::kFloat).requires_grad_(true);
  const at::Tensor rejected = at::tensor(r, at::kFloat).requires_grad_(true);
  PreferenceOptions o;
  o.rlhf_type = RlhfType::kRm;
  o.validate();
  const auto softplus = [](double x) { return std::log1p(std::exp(x)); };  // -log s(-x)

  const PreferenceResult plain = reward_model_loss(o, chosen, rejected);
  double want = 0;
  for (int i = 0; i < 3; ++i) want += softplus(-(c[i] - r[i])) / 3;
  EXPECT_NEAR(plain.loss.item<double>(), want, 1e-6);
  EXPECT_NEAR(plain.metrics.at("rewards/accuracies"), 1.0 / 3, 1e-7);
  EXPECT_NEAR(plain.metrics.at("rewards/margins"), (c[0] + c[1] + c[2] - r[0] - r[1] - r[2]) / 3, 1e-6);
  EXPECT_NEAR(plain.metrics.at("rewards/chosen"), (c[0] + c[1] + c[2]) / 3, 1e-6);

  o.center_rewards_coefficient = 0.01;
  o.validate();
  const PreferenceResult margined = reward_model_loss(o, chosen, rejected, at::tensor(m, at::kFloat));
  want = 0;
  double center = 0;
  for (int i = 0; i < 3; ++i) {
    const double d = c[i] - r[i] - m[i];
    want += softplus(-d) / 3;
    EXPECT_NEAR(margined.losses[i].item<double>(), softplus(-d), 1e-6);
    center += (c[i] + r[i]) * (c[i] + r[i]) / 3;
  }
  EXPECT_NEAR(margined.loss.item<double>(), want + 0.01 * center, 1e-6);
  margined.loss.backward();
  for (int i = 0; i < 3; ++i) {
    const double d = c[i] - r[i] - m[i];
    const double dsig = -1.0 / (1.0 + std::exp(d)) / 3;  // d/dd of softplus(-d) / 3
    EXPECT_NEAR(chosen.grad()[i].item<double>(), dsig + 0.01 * 2 * (c[i] + r[i]) / 3, 1e-6);
    EXPECT_NEAR(rejected.grad()[i].item<double>(), -dsig + 0.01 * 2 * (c[i] + r[i]) / 3, 1e-6);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Options.

TEST(PreferenceOptions, DefaultsFollowMsSwiftPerMethod) {
  for (const char* name : {"dpo", "kto", "orpo", "cpo", "simpo", "rm"}) {
    PreferenceOptions o;
    o.rlhf_type = parse_rlhf_type(name);
    EXPECT_EQ(to_string(o.rlhf_type), name);
    EXPECT_NO_THROW(o.validate()) << name;
  }
  PreferenceOptions o;
  EXPECT_EQ(o.effective_beta(), 0.1);
  EXPECT_EQ(o.effective_loss_type(), PreferenceLossType::kSigmoid);
  o.rlhf_type = RlhfType::kSimpo;
  EXPECT_EQ(o.effective_beta(), 2.0);
  EXPECT_EQ(o.effective_loss_type(), PreferenceLossType::kSimpo);
  EXPECT_TRUE(preference_needs(o).average_logps);
  EXPECT_EQ(preference_needs(o).nll, NllTokens::kResponse);
  o.cpo_alpha = 0;
  EXPECT_EQ(preference_needs(o).nll, NllTokens::kNone);
  o.rlhf_type = RlhfType::kKto;
  EXPECT_EQ(o.effective_loss_type(), PreferenceLossType::kKto);
  o.cpo_alpha = 1;
  EXPECT_TRUE(preference_needs(o).kl_batch && preference_needs(o).reference);
  o.rlhf_type = RlhfType::kOrpo;
  EXPECT_EQ(preference_needs(o).nll, NllTokens::kPromptAndResponse);
  EXPECT_FALSE(preference_needs(o).reference);
  o.rlhf_type = RlhfType::kDpo;
  o.reference_free = true;
  EXPECT_TRUE(preference_needs(o).reference) << "TRL's rewards use the reference also when reference_free";
  EXPECT_EQ(preference_needs(o).nll, NllTokens::kNone);
  o.loss_type = PreferenceLossType::kIpo;
  EXPECT_TRUE(preference_needs(o).average_logps);
}

TEST(PreferenceOptions, KeysThatDoNotFitTheMethodAreRefusedByName) {
  const auto refused = [](const std::function<void(PreferenceOptions&)>& set, const std::vector<std::string>& needles) {
    PreferenceOptions o;
    set(o);
    expect_error<ConfigError>([&] { o.validate(); }, needles);
  };
  refused([](auto& o) { o.simpo_gamma = 0.5; }, {"'simpo_gamma'", "rlhf_type dpo"});
  refused([](auto& o) { o.loss_type = PreferenceLossType::kIpo; o.label_smoothing = 0.1; },
          {"'label_smoothing'", "loss_type ipo"});
  refused([](auto& o) { o.loss_type = PreferenceLossType::kHinge; o.label_smoothing = 0.1; }, {"'label_smoothing'"});
  refused([](auto& o) { o.loss_type = PreferenceLossType::kRobust; o.label_smoothing = 0.5; },
          {"'label_smoothing'", "[0, 0.5)"});
  refused([](auto& o) { o.label_smoothing = 0.6; }, {"'label_smoothing'", "[0, 0.5]"});
  refused([](auto& o) { o.loss_type = PreferenceLossType::kSimpo; }, {"'loss_type' simpo", "rlhf_type dpo"});
  refused([](auto& o) { o.beta = 0.0; }, {"'beta'", "greater than 0"});
  refused([](auto& o) { o.desirable_weight = 2; }, {"'desirable_weight'", "kto"});
  refused([](auto& o) { o.cpo_alpha = 0; }, {"'cpo_alpha'", "cpo and simpo"});
  refused([](auto& o) { o.center_rewards_coefficient = 0.1; }, {"'center_rewards_coefficient'", "rm"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kCpo; o.rpo_alpha = 1.0; }, {"'rpo_alpha'", "rlhf_type cpo"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kOrpo; o.reference_free = true; }, {"'reference_free'"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kOrpo; o.loss_type = PreferenceLossType::kSigmoid; },
          {"'loss_type'", "rlhf_type orpo"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kKto; o.loss_type = PreferenceLossType::kSigmoid; },
          {"'loss_type' sigmoid", "expected kto"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kRm; o.beta = 0.1; }, {"'beta'", "rlhf_type rm"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kKto; o.undesirable_weight = -1; }, {"'undesirable_weight'"});
  refused([](auto& o) { o.rlhf_type = RlhfType::kCpo; o.loss_type = PreferenceLossType::kSigmoid; o.simpo_gamma = 2; },
          {"'simpo_gamma'", "loss_type sigmoid"});
  expect_error<ConfigError>([] { parse_rlhf_type("ppo"); }, {"'rlhf_type' ppo", "dpo, kto"});
  expect_error<ConfigError>([] { parse_preference_loss_type("bco_pair"); }, {"'loss_type' bco_pair"});

  PreferenceOptions kto;
  kto.rlhf_type = RlhfType::kKto;
  expect_error<ConfigError>([&] { kto.validate_batch_size(1); }, {"'per_device_train_batch_size'", "kto"});
  EXPECT_NO_THROW(kto.validate_batch_size(2));
  EXPECT_NO_THROW(PreferenceOptions().validate_batch_size(1));
  // Keys that fit: accepted.
  PreferenceOptions cpo;
  cpo.rlhf_type = RlhfType::kCpo;
  cpo.loss_type = PreferenceLossType::kSimpo;
  cpo.simpo_gamma = 0.5;
  cpo.label_smoothing = 0.1;
  cpo.cpo_alpha = 0;
  EXPECT_NO_THROW(cpo.validate());
}

// ---------------------------------------------------------------------------------------------------------------
// Parity with TRL v0.9.6.

TEST(PreferenceParity, SequenceLogpsOfPolicyAndReference) {
  SWIFTCPP_REQUIRE_RLHF();
  Policy policy = load_policy();
  const PaddedRows rows = concatenated_batch();
  at::NoGradGuard no_grad;
  const SequenceLogps pol = sequence_logps(forward(policy.model, rows), rows.shifted_labels());
  const SequenceLogps ref = reference_logps(policy.model, rows);
  std::map<std::string, Worst> worst;
  for (const auto& [name, lp] : {std::pair<const char*, const SequenceLogps*>{"policy", &pol}, {"reference", &ref}}) {
    const Json& want = reference()["logps"][name];
    for (const auto& [side, first] : {std::pair<std::string, int64_t>{"chosen", 0}, {"rejected", 3}}) {
      const SequenceLogps half = lp->rows(first, 3);
      const std::string what = std::string(name) + " " + side;
      expect_close(half.sum, want[side + "_sum"], kLogpsTol, what + "_sum", worst["sums"]);
      expect_close(half.average(), want[side + "_avg"], kLogpsTol, what + "_avg", worst["averages"]);
      EXPECT_TRUE(at::equal(half.count, json_to_tensor(want[side + "_len"]).to(at::kLong))) << what;
    }
  }
  print_parity("sequence log-probs", worst);
}

TEST(PreferenceParity, EveryPairwiseMethodMatchesTrl) {
  SWIFTCPP_REQUIRE_RLHF();
  Policy policy = load_policy();
  const std::vector<TrainableTensor> tensors = adapter_tensors(policy.model, policy.lora);
  ASSERT_EQ(tensors.size(), reference()["lora_tensor_names"].size());
  const PaddedRows rows = concatenated_batch();
  const SequenceLogps ref = reference_logps(policy.model, rows);
  const at::Tensor logits = forward(policy.model, rows);  // [6, T, V], with autograd
  const SequenceLogps pol = sequence_logps(logits, rows.shifted_labels());
  const at::Tensor nll_response = token_mean_nll(pol.rows(0, 3));
  const at::Tensor nll_all = token_mean_nll(sequence_logps(logits.narrow(0, 0, 3),
                                                           rows.shifted_all_token_labels().narrow(0, 0, 3)));
  const at::Tensor padded_logits = hf_padded_logits(policy.model, rows);
  const double chosen_logits = logits_mean(padded_logits.narrow(0, 0, 3));
  const double rejected_logits = logits_mean(padded_logits.narrow(0, 3, 3));
  // The same means over real tokens only, on our decoder's logits (not a TRL value; the reference gives it).
  const Json& diagnostic = reference()["methods"]["dpo_sigmoid"]["diagnostic_logits_mean_over_real_tokens"];
  Worst diagnostic_worst;
  expect_close(logits_mean(logits.narrow(0, 0, 3), rows.key_valid().narrow(0, 0, 3)),
               diagnostic["chosen"].get<double>(), kLogitsTol, "real-token logits mean chosen", diagnostic_worst);
  expect_close(logits_mean(logits.narrow(0, 3, 3), rows.key_valid().narrow(0, 3, 3)),
               diagnostic["rejected"].get<double>(), kLogitsTol, "real-token logits mean rejected", diagnostic_worst);
  std::cout << "[parity] logits mean over real tokens: abs " << diagnostic_worst.abs << "; over all positions with "
            << "our decoder's padding mask: chosen " << logits_mean(logits.narrow(0, 0, 3)) << " (TRL "
            << reference()["methods"]["dpo_sigmoid"]["metrics"]["logits/chosen"].get<double>() << ")" << std::endl;

  int methods = 0;
  for (const auto& [key, method] : reference()["methods"].items()) {
    if (key == "kto") continue;
    ++methods;
    const PreferenceOptions options = options_from(method);
    const PreferenceNeeds needs = preference_needs(options);
    PreferenceInputs in;
    const auto pick = [&](const SequenceLogps& lp) { return needs.average_logps ? lp.average() : lp.sum; };
    in.policy_chosen_logps = pick(pol.rows(0, 3));
    in.policy_rejected_logps = pick(pol.rows(3, 3));
    if (needs.reference) {
      in.reference_chosen_logps = pick(ref.rows(0, 3));
      in.reference_rejected_logps = pick(ref.rows(3, 3));
    }
    if (needs.nll == NllTokens::kResponse) in.nll_loss = nll_response;
    if (needs.nll == NllTokens::kPromptAndResponse) in.nll_loss = nll_all;
    in.chosen_logits_mean = chosen_logits;
    in.rejected_logits_mean = rejected_logits;
    const PreferenceResult r = preference_loss(options, in);

    std::map<std::string, Worst> worst;
    EXPECT_EQ(needs.average_logps, method["logps_kind"].get<std::string>() == "length-averaged") << key;
    expect_close(in.policy_chosen_logps, method["policy_chosen_logps"], kLogpsTol, key + " policy_chosen_logps",
                 worst["logps"]);
    expect_close(in.policy_rejected_logps, method["policy_rejected_logps"], kLogpsTol,
                 key + " policy_rejected_logps", worst["logps"]);
    if (method.contains("reference_chosen_logps")) {
      expect_close(in.reference_chosen_logps, method["reference_chosen_logps"], kLogpsTol,
                   key + " reference_chosen_logps", worst["logps"]);
      expect_close(in.reference_rejected_logps, method["reference_rejected_logps"], kLogpsTol,
                   key + " reference_rejected_logps", worst["logps"]);
    }
    expect_close(r.losses, method.contains("or_terms") ? method["or_terms"] : method["losses"], kLossTol,
                 key + " losses", worst["losses"]);
    expect_close(r.loss.item<double>(), method["loss"].get<double>(), kLossTol, key + " loss", worst["losses"]);
    if (method.contains("nll_loss_chosen")) {
      const double nll = in.nll_loss.defined() ? in.nll_loss.item<double>() : 0.0;
      expect_close(nll, method["nll_loss_chosen"].get<double>(), kLossTol, key + " nll", worst["losses"]);
    }
    if (method.contains("losses_before_rpo")) {
      PreferenceOptions plain = options;
      plain.rpo_alpha.reset();
      expect_close(preference_loss(plain, in).losses, method["losses_before_rpo"], kLossTol,
                   key + " losses_before_rpo", worst["losses"]);
    }
    expect_close(r.chosen_rewards, method["chosen_rewards"], kRewardTol, key + " chosen_rewards", worst["rewards"]);
    expect_close(r.rejected_rewards, method["rejected_rewards"], kRewardTol, key + " rejected_rewards",
                 worst["rewards"]);
    expect_metrics(r.metrics, method["metrics"], metric_tol, key, worst["metrics"]);
    for (const char* name : {"log_odds_ratio", "log_odds_chosen"}) {
      if (method.contains(name)) {
        expect_close(r.metrics.at(name), method[name].get<double>(), kLogitsTol, key + " " + name, worst["metrics"]);
      }
    }
    expect_grad_norms(gradients(r.loss, tensors), tensors, method["grad_norms"]["total"],
                      method["grad_norms"]["per_tensor"], key, worst["grad norms"]);
    print_parity(key, worst);
  }
  EXPECT_EQ(methods, 10);
}

// The pairs of the reference batch as our data layer holds them: prompt + answer, labels on the answer.
std::vector<PreferenceSample> reference_pairs() {
  std::vector<PreferenceSample> out;
  for (const auto& pair : reference()["batch"]["pairs"]) {
    const auto to32 = [](const std::vector<int64_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); };
    const std::vector<int32_t> prompt = to32(ids_of(pair["prompt_ids"]));
    PreferenceSample s;
    for (const auto& [side, sample] : {std::pair<const char*, Sample*>{"chosen_ids", &s.chosen}, {"rejected_ids", &s.rejected}}) {
      AnswerTokens answer;
      answer.ids = to32(ids_of(pair[side]));
      answer.trained.assign(answer.ids.size(), 1);
      *sample = join_prompt_answer(prompt, answer);
    }
    s.prompt_length = static_cast<int64_t>(prompt.size());
    out.push_back(std::move(s));
  }
  return out;
}

// The same methods through pair_objective, the code `swiftcpp rlhf` runs: the collated batch, one concatenated
// forward with the head only where an answer token (or ORPO's prompt token) is predicted, the reference from the
// policy with its adapters off.
TEST(PreferenceParity, PairObjectiveOfEveryMethodMatchesTrl) {
  SWIFTCPP_REQUIRE_RLHF();
  Policy policy = load_policy();
  const std::vector<TrainableTensor> tensors = adapter_tensors(policy.model, policy.lora);
  const std::vector<PreferenceSample> pairs = reference_pairs();
  std::vector<const PreferenceSample*> group;
  for (const auto& p : pairs) group.push_back(&p);
  const PreferenceBatch batch = collate_preference(group, /*pad_id=*/0);
  int methods = 0;
  for (const auto& [key, method] : reference()["methods"].items()) {
    if (key == "kto") continue;
    ++methods;
    const PreferenceOptions options = options_from(method);
    const PreferenceResult r = pair_objective(options, policy.model, batch, {}, CausalLM(nullptr), false);
    std::map<std::string, Worst> worst;
    expect_close(r.losses, method.contains("or_terms") ? method["or_terms"] : method["losses"], kLossTol,
                 key + " losses", worst["losses"]);
    expect_close(r.loss.item<double>(), method["loss"].get<double>(), kLossTol, key + " loss", worst["losses"]);
    expect_close(r.chosen_rewards, method["chosen_rewards"], kRewardTol, key + " chosen_rewards", worst["rewards"]);
    expect_close(r.rejected_rewards, method["rejected_rewards"], kRewardTol, key + " rejected_rewards",
                 worst["rewards"]);
    for (const auto& [name, value] : method["metrics"].items()) {
      if (name.rfind("logits/", 0) == 0) continue;  // ours average the answers' positions, TRL's the padded batch
      ASSERT_TRUE(r.metrics.count(name)) << key << " " << name;
      expect_close(r.metrics.at(name), value.get<double>(), metric_tol(name), key + " " + name, worst["metrics"]);
    }
    expect_grad_norms(gradients(r.loss, tensors), tensors, method["grad_norms"]["total"],
                      method["grad_norms"]["per_tensor"], key, worst["grad norms"]);
    print_parity(key + " (pair_objective)", worst);
  }
  EXPECT_EQ(methods, 10);
}

TEST(PreferenceParity, KtoWithItsMismatchedKlBatchMatchesTrl) {
  SWIFTCPP_REQUIRE_RLHF();
  const Json& method = reference()["methods"]["kto"];
  const Json& examples = method["examples"];
  ASSERT_EQ(examples.size(), 4u);
  // TRL's _get_kl_dataset: the completions reversed, the prompts in place: KL row i = prompt i + completion 3 - i.
  std::vector<std::vector<int64_t>> prompts, completions, kl_completions;
  std::vector<bool> desirable;
  for (size_t i = 0; i < examples.size(); ++i) {
    prompts.push_back(ids_of(examples[i]["prompt_ids"]));
    completions.push_back(ids_of(examples[i]["completion_ids"]));
    kl_completions.push_back(ids_of(examples[examples.size() - 1 - i]["completion_ids"]));
    desirable.push_back(examples[i]["label"].get<bool>());
    EXPECT_EQ(ids_of(method["kl_batch"][i]["completion_ids"]), kl_completions.back());
    EXPECT_EQ(ids_of(method["kl_batch"][i]["prompt_ids"]), prompts.back());
  }
  const PaddedRows batch = pad_rows(prompts, completions);
  const PaddedRows kl_batch = pad_rows(prompts, kl_completions);
  const Json& padded = method["padded"];
  expect_equal_ids(batch.input_ids, padded["completion_input_ids"], "completion_input_ids");
  expect_equal_ids(batch.attention_mask, padded["completion_attention_mask"], "completion_attention_mask");
  expect_equal_ids(batch.hf_labels, padded["completion_labels"], "completion_labels");
  expect_equal_ids(kl_batch.input_ids, padded["KL_completion_input_ids"], "KL_completion_input_ids");
  expect_equal_ids(kl_batch.attention_mask, padded["KL_completion_attention_mask"], "KL_completion_attention_mask");
  expect_equal_ids(kl_batch.hf_labels, padded["KL_completion_labels"], "KL_completion_labels");

  Policy policy = load_policy();
  const std::vector<TrainableTensor> tensors = adapter_tensors(policy.model, policy.lora);
  const PreferenceOptions options = options_from(method);
  options.validate_batch_size(static_cast<int64_t>(examples.size()));
  const PreferenceNeeds needs = preference_needs(options);
  ASSERT_TRUE(needs.kl_batch && needs.reference && !needs.average_logps);

  const SequenceLogps ref = reference_logps(policy.model, batch);
  const SequenceLogps ref_kl = reference_logps(policy.model, kl_batch);
  SequenceLogps pol_kl;
  {
    at::NoGradGuard no_grad;
    pol_kl = sequence_logps(forward(policy.model, kl_batch), kl_batch.shifted_labels());
  }
  const SequenceLogps pol = sequence_logps(forward(policy.model, batch), batch.shifted_labels());
  std::vector<int64_t> chosen_rows, rejected_rows;
  for (size_t i = 0; i < desirable.size(); ++i) (desirable[i] ? chosen_rows : rejected_rows).push_back(i);
  const at::Tensor chosen_index = at::tensor(chosen_rows, at::kLong);
  const at::Tensor rejected_index = at::tensor(rejected_rows, at::kLong);
  PreferenceInputs in;
  in.policy_chosen_logps = pol.sum.index_select(0, chosen_index);
  in.policy_rejected_logps = pol.sum.index_select(0, rejected_index);
  in.reference_chosen_logps = ref.sum.index_select(0, chosen_index);
  in.reference_rejected_logps = ref.sum.index_select(0, rejected_index);
  in.policy_kl_logps = pol_kl.sum;
  in.reference_kl_logps = ref_kl.sum;
  const PreferenceResult r = preference_loss(options, in);

  std::map<std::string, Worst> worst;
  expect_close(in.policy_chosen_logps, method["policy_chosen_logps"], kLogpsTol, "policy_chosen_logps", worst["logps"]);
  expect_close(in.policy_rejected_logps, method["policy_rejected_logps"], kLogpsTol, "policy_rejected_logps",
               worst["logps"]);
  expect_close(in.reference_chosen_logps, method["reference_chosen_logps"], kLogpsTol, "reference_chosen_logps",
               worst["logps"]);
  expect_close(in.reference_rejected_logps, method["reference_rejected_logps"], kLogpsTol,
               "reference_rejected_logps", worst["logps"]);
  expect_close(in.policy_kl_logps, method["policy_KL_logps"], kLogpsTol, "policy_KL_logps", worst["logps"]);
  expect_close(in.reference_kl_logps, method["reference_KL_logps"], kLogpsTol, "reference_KL_logps", worst["logps"]);
  expect_close((in.policy_kl_logps - in.reference_kl_logps).mean().item<double>(),
               method["kl_before_clamp"].get<double>(), kRewardTol, "kl_before_clamp", worst["kl"]);
  expect_close(r.metrics.at("kl"), method["kl"].get<double>(), kRewardTol, "kl", worst["kl"]);
  expect_close(r.losses, method["losses"], kLossTol, "losses", worst["losses"]);
  expect_close(r.loss.item<double>(), method["loss"].get<double>(), kLossTol, "loss", worst["losses"]);
  expect_close(r.chosen_rewards, method["chosen_rewards"], kRewardTol, "chosen_rewards", worst["rewards"]);
  expect_close(r.rejected_rewards, method["rejected_rewards"], kRewardTol, "rejected_rewards", worst["rewards"]);
  expect_metrics(r.metrics, method["metrics"], metric_tol, "kto", worst["metrics"]);
  expect_grad_norms(gradients(r.loss, tensors), tensors, method["grad_norms"]["total"],
                    method["grad_norms"]["per_tensor"], "kto", worst["grad norms"]);
  print_parity("kto", worst);
}

// ---------------------------------------------------------------------------------------------------------------
// One DPO step.

using test::adapter_rel_error;

// One optimizer step as `swiftcpp rlhf` runs it: the Trainer's step parts around pair_objective (one concatenated
// forward of the collated pairs, the reference from the same model with its adapters off), AdamW without
// clipping at a constant rate, as the reference step was taken.
TEST(PreferenceTrainStep, OneDpoStepOfTheTrainerMatchesTrl) {
  SWIFTCPP_REQUIRE_RLHF();
  SWIFTCPP_REQUIRE_SHARED(rlhf_dir() / "dpo_after1" / "adapter_model.safetensors");
  const Json& train = reference()["train"];
  const Json& opt = train["optimizer"];
  ASSERT_TRUE(opt["max_grad_norm"].is_null());
  TrainConfig config;
  config.model = stories_dir().string();
  config.train_type = "lora";
  config.adapters = lora_init_dir().string();
  config.rlhf_type = "dpo";
  config.loss_scale = "last_round";
  config.loss_type = train["settings"]["loss_type"].get<std::string>();
  config.beta = train["settings"]["beta"].get<double>();
  config.label_smoothing = train["settings"]["label_smoothing"].get<double>();
  config.learning_rate = opt["lr"].get<double>();
  config.adam_beta1 = opt["betas"][0].get<double>();
  config.adam_beta2 = opt["betas"][1].get<double>();
  config.adam_epsilon = opt["eps"].get<double>();
  config.weight_decay = opt["weight_decay"].get<double>();
  config.max_grad_norm = 0;  // TRL's max_grad_norm None
  config.lr_scheduler_type = "constant";
  config.per_device_train_batch_size = 3;
  const PreferenceOptions options = preference_options(config);
  Trainer trainer(config, load_causal_lm(stories_dir()));
  const std::vector<PreferenceSample> pairs = reference_pairs();
  std::vector<const PreferenceSample*> group;
  for (const auto& p : pairs) group.push_back(&p);
  const PreferenceBatch batch = collate_preference(group, /*pad_id=*/0);
  // Our collation is TRL's concatenated batch (right padding to the longest of the 6 rows).
  const PaddedRows rows = concatenated_batch();
  ASSERT_TRUE(at::equal(batch.batch.input_ids.to(at::kLong), rows.input_ids));
  ASSERT_TRUE(at::equal(batch.batch.labels.to(at::kLong), rows.shifted_labels()));

  std::map<std::string, Worst> worst;
  const Json& before = train["steps"][0];
  StepResult r;
  trainer.begin_step(1);
  const PreferenceResult res = pair_objective(options, trainer.model(), batch, {}, CausalLM(nullptr), false);
  trainer.backward(res.loss);
  trainer.finish_step(r, {res.loss}, [&](const std::vector<double>& sums) { r.loss = sums[0]; }, 0, 1);
  ASSERT_FALSE(r.skipped);
  expect_close(r.loss, before["loss"].get<double>(), kLossTol, "loss before", worst["before"]);
  for (const auto& [key, value] : before["metrics"].items()) {
    if (key.rfind("logits/", 0) == 0) continue;  // ours average the answers' positions, TRL's the padded batch
    expect_close(res.metrics.at(key), value.get<double>(), metric_tol(key), "before " + key, worst["before"]);
  }
  expect_close(r.grad_norm, before["grad_norm_total"].get<double>(), kGradTol, "|grad| total", worst["grad norms"]);
  const std::vector<TrainableTensor>& tensors = trainer.trainables();
  for (const auto& item : before["grad_norms_selected"].items()) {
    const std::string name = item.key();
    const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.name == name; });
    ASSERT_NE(it, tensors.end()) << name;
    expect_close(it->tensor.grad().norm().item<double>(), item.value().get<double>(), kGradTol, "|grad " + name + "|",
                 worst["grad norms"]);
  }

  const double adapter_error = adapter_rel_error(tensors, rlhf_dir() / "dpo_after1");
  EXPECT_LE(adapter_error, kAdapterRelTol);
  at::NoGradGuard no_grad;
  trainer.model()->eval();
  const PreferenceResult after = pair_objective(options, trainer.model(), batch, {}, CausalLM(nullptr), false);
  expect_close(after.loss.item<double>(), train["loss_after"].get<double>(), kAfterStepTol, "loss_after",
               worst["after"]);
  expect_close(after.losses, train["losses_after"], kAfterStepTol, "losses_after", worst["after"]);
  expect_close(after.chosen_rewards, train["chosen_rewards_after"], kAfterStepTol, "chosen_rewards_after",
               worst["after"]);
  expect_close(after.rejected_rewards, train["rejected_rewards_after"], kAfterStepTol, "rejected_rewards_after",
               worst["after"]);
  for (const auto& [key, value] : train["metrics_after"].items()) {
    if (key.rfind("logits/", 0) == 0) continue;
    expect_close(after.metrics.at(key), value.get<double>(), kAfterStepTol, "after " + key, worst["after"]);
  }
  std::cout << "[parity] dpo step (trainer): adapters worst norm-wise relative error " << adapter_error << std::endl;
  print_parity("dpo step", worst);
}

}  // namespace
}  // namespace swiftcpp
