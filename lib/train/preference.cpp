#include "train/preference.h"

#include <ATen/ATen.h>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/collate.h"

namespace swiftcpp {

namespace {

const std::vector<std::pair<const char*, RlhfType>> kRlhfTypes = {
    {"dpo", RlhfType::kDpo}, {"kto", RlhfType::kKto},     {"orpo", RlhfType::kOrpo},
    {"cpo", RlhfType::kCpo}, {"simpo", RlhfType::kSimpo}, {"rm", RlhfType::kRm}};

const std::vector<std::pair<const char*, PreferenceLossType>> kLossTypes = {
    {"sigmoid", PreferenceLossType::kSigmoid}, {"ipo", PreferenceLossType::kIpo},
    {"hinge", PreferenceLossType::kHinge},     {"robust", PreferenceLossType::kRobust},
    {"simpo", PreferenceLossType::kSimpo},     {"kto", PreferenceLossType::kKto}};

// The loss types each method accepts, the first being its default.
std::vector<PreferenceLossType> allowed_loss_types(RlhfType type) {
  using L = PreferenceLossType;
  switch (type) {
    case RlhfType::kDpo: return {L::kSigmoid, L::kIpo, L::kHinge, L::kRobust};
    case RlhfType::kCpo: return {L::kSigmoid, L::kHinge, L::kIpo, L::kSimpo};
    case RlhfType::kSimpo: return {L::kSimpo};
    case RlhfType::kKto: return {L::kKto};
    case RlhfType::kOrpo:
    case RlhfType::kRm: return {};
  }
  return {};
}

bool is_pairwise_policy_only(RlhfType type) { return type == RlhfType::kCpo || type == RlhfType::kSimpo; }

void require_finite(const char* key, double value) {
  if (!std::isfinite(value)) fail<ConfigError>("'{}' must be a finite number (got {})", key, value);
}

void require_non_negative(const char* key, double value) {
  require_finite(key, value);
  if (value < 0) fail<ConfigError>("'{}' must be at least 0 (got {})", key, value);
}

// A key given for a method that does not use it.
[[noreturn]] void refuse_key(const char* key, const std::string& value, const std::string& method,
                             const char* applies_to) {
  fail<ConfigError>("'{}' ({}) does not apply to {}: it is a key of {}", key, value, method, applies_to);
}

std::string method_name(const PreferenceOptions& o) {
  std::string name = "rlhf_type " + to_string(o.rlhf_type);
  if (!allowed_loss_types(o.rlhf_type).empty()) name += " with loss_type " + to_string(o.effective_loss_type());
  return name;
}

double item(const at::Tensor& t) { return t.detach().item<double>(); }

void check_vector(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.dim() == 1, "preference_loss: ", what, " must be a defined [N] tensor");
}

void check_same_size(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.defined() && b.defined(), "preference_loss: ", what, ": a tensor is missing");
  TORCH_CHECK(a.sizes() == b.sizes(), "preference_loss: ", what, " differ in size: ", a.sizes(), " vs ", b.sizes());
}

// The metrics the pairwise trainers (DPO, ORPO, CPO) store for one batch: means of float32 tensors.
void pairwise_metrics(PreferenceResult& r, const PreferenceInputs& in) {
  r.metrics["rewards/chosen"] = item(r.chosen_rewards.mean());
  r.metrics["rewards/rejected"] = item(r.rejected_rewards.mean());
  r.metrics["rewards/accuracies"] = item(r.chosen_rewards.gt(r.rejected_rewards).to(at::kFloat).mean());
  r.metrics["rewards/margins"] = item((r.chosen_rewards - r.rejected_rewards).mean());
  r.metrics["logps/rejected"] = item(in.policy_rejected_logps.detach().mean());
  r.metrics["logps/chosen"] = item(in.policy_chosen_logps.detach().mean());
  if (in.rejected_logits_mean) r.metrics["logits/rejected"] = *in.rejected_logits_mean;
  if (in.chosen_logits_mean) r.metrics["logits/chosen"] = *in.chosen_logits_mean;
}

// The sigmoid loss with label smoothing, as TRL writes it for DPO and CPO.
at::Tensor sigmoid_loss(const at::Tensor& h, double beta, double eps) {
  return -at::log_sigmoid(beta * h) * (1 - eps) - at::log_sigmoid(-beta * h) * eps;
}

// DPO's (and CPO's) loss of the log-ratio difference h: [N] -> [N].
at::Tensor pair_loss(PreferenceLossType type, const at::Tensor& h, double beta, double eps) {
  switch (type) {
    case PreferenceLossType::kSigmoid: return sigmoid_loss(h, beta, eps);
    case PreferenceLossType::kRobust:
      return (-at::log_sigmoid(beta * h) * (1 - eps) + at::log_sigmoid(-beta * h) * eps) / (1 - 2 * eps);
    case PreferenceLossType::kHinge: return at::relu(1 - beta * h);
    case PreferenceLossType::kIpo: return at::pow(h - 1 / (2 * beta), 2);
    default: break;
  }
  TORCH_CHECK(false, "pair_loss: loss_type ", to_string(type), " is not a pairwise loss");
  return {};
}

PreferenceResult dpo(const PreferenceOptions& o, const PreferenceInputs& in) {
  check_vector(in.policy_chosen_logps, "policy_chosen_logps");
  for (const auto* t : {&in.policy_rejected_logps, &in.reference_chosen_logps, &in.reference_rejected_logps}) {
    check_same_size(*t, in.policy_chosen_logps, "DPO log-probs");
  }
  const double beta = o.effective_beta();
  const at::Tensor pi_logratios = in.policy_chosen_logps - in.policy_rejected_logps;  // [B]
  const at::Tensor ref_logratios = o.reference_free ? at::zeros({1}, pi_logratios.options())
                                                    : in.reference_chosen_logps - in.reference_rejected_logps;
  const at::Tensor h = pi_logratios - ref_logratios;  // [B]
  PreferenceResult r;
  r.losses = pair_loss(o.effective_loss_type(), h, beta, o.label_smoothing);
  r.chosen_rewards = beta * (in.policy_chosen_logps - in.reference_chosen_logps).detach();
  r.rejected_rewards = beta * (in.policy_rejected_logps - in.reference_rejected_logps).detach();
  if (o.rpo_alpha) {
    TORCH_CHECK(in.nll_loss.defined(), "preference_loss: rpo_alpha needs nll_loss");
    r.losses = r.losses * *o.rpo_alpha + in.nll_loss;
  }
  r.loss = r.losses.mean();
  r.metrics["loss"] = item(r.loss);
  pairwise_metrics(r, in);
  if (o.rpo_alpha) r.metrics["nll_loss"] = item(in.nll_loss.mean());
  return r;
}

PreferenceResult cpo(const PreferenceOptions& o, const PreferenceInputs& in) {
  check_vector(in.policy_chosen_logps, "policy_chosen_logps");
  check_same_size(in.policy_rejected_logps, in.policy_chosen_logps, "CPO log-probs");
  const double beta = o.effective_beta();
  const PreferenceLossType type = o.effective_loss_type();
  at::Tensor h = in.policy_chosen_logps - in.policy_rejected_logps;  // [B]
  PreferenceResult r;
  if (type == PreferenceLossType::kSimpo) {
    h = h - o.simpo_gamma / beta;
    r.losses = sigmoid_loss(h, beta, o.label_smoothing);
  } else {
    r.losses = pair_loss(type, h, beta, o.label_smoothing);
  }
  r.chosen_rewards = beta * in.policy_chosen_logps.detach();
  r.rejected_rewards = beta * in.policy_rejected_logps.detach();
  // TRL computes no NLL when cpo_alpha is 0 and logs 0.
  at::Tensor nll = at::zeros({}, r.losses.options());
  if (o.cpo_alpha != 0) {
    TORCH_CHECK(in.nll_loss.defined(), "preference_loss: cpo_alpha needs nll_loss");
    nll = in.nll_loss;
  }
  r.loss = r.losses.mean() + o.cpo_alpha * nll;
  r.metrics["loss"] = item(r.loss);
  pairwise_metrics(r, in);
  r.metrics["nll_loss"] = item(nll.mean());
  return r;
}

PreferenceResult orpo(const PreferenceOptions& o, const PreferenceInputs& in) {
  check_vector(in.policy_chosen_logps, "policy_chosen_logps");
  check_same_size(in.policy_rejected_logps, in.policy_chosen_logps, "ORPO log-probs");
  TORCH_CHECK(in.nll_loss.defined(), "preference_loss: orpo needs nll_loss");
  const double beta = o.effective_beta();
  const at::Tensor& pc = in.policy_chosen_logps;
  const at::Tensor& pr = in.policy_rejected_logps;
  const at::Tensor log_odds = (pc - pr) - (at::log1p(-at::exp(pc)) - at::log1p(-at::exp(pr)));  // [B]
  const at::Tensor ratio = at::log(at::sigmoid(log_odds));                                     // [B]
  PreferenceResult r;
  r.losses = beta * ratio;
  r.chosen_rewards = beta * pc.detach();
  r.rejected_rewards = beta * pr.detach();
  r.loss = in.nll_loss - r.losses.mean();
  r.metrics["loss"] = item(r.loss);
  pairwise_metrics(r, in);
  r.metrics["nll_loss"] = item(in.nll_loss.mean());
  r.metrics["log_odds_ratio"] = item(ratio.mean());
  r.metrics["log_odds_chosen"] = item(log_odds.mean());
  return r;
}

PreferenceResult kto(const PreferenceOptions& o, const PreferenceInputs& in) {
  check_vector(in.policy_chosen_logps, "policy_chosen_logps");
  check_vector(in.policy_rejected_logps, "policy_rejected_logps");
  check_same_size(in.reference_chosen_logps, in.policy_chosen_logps, "KTO desirable log-probs");
  check_same_size(in.reference_rejected_logps, in.policy_rejected_logps, "KTO undesirable log-probs");
  check_vector(in.policy_kl_logps, "policy_kl_logps");
  check_same_size(in.reference_kl_logps, in.policy_kl_logps, "KTO KL-batch log-probs");
  TORCH_CHECK(in.policy_kl_logps.numel() > 0, "preference_loss: kto needs a non-empty KL batch");
  const double beta = o.effective_beta();
  const at::Tensor kl = (in.policy_kl_logps - in.reference_kl_logps).mean().detach().clamp_min(0);  // []
  PreferenceResult r;
  const at::Tensor chosen_logratios = in.policy_chosen_logps - in.reference_chosen_logps;        // [Nc]
  const at::Tensor rejected_logratios = in.policy_rejected_logps - in.reference_rejected_logps;  // [Nr]
  const at::Tensor chosen_losses = 1 - at::sigmoid(beta * (chosen_logratios - kl));
  const at::Tensor rejected_losses = 1 - at::sigmoid(beta * (kl - rejected_logratios));
  r.chosen_rewards = beta * chosen_logratios.detach();
  r.rejected_rewards = beta * rejected_logratios.detach();
  r.losses = at::cat({o.desirable_weight * chosen_losses, o.undesirable_weight * rejected_losses}, 0);
  r.loss = at::nanmean(r.losses);
  r.metrics["loss"] = item(r.loss);
  // KTOTrainer.log: summed rewards and log-probs (float32) divided by the example count.
  const int64_t n_chosen = r.chosen_rewards.numel(), n_rejected = r.rejected_rewards.numel();
  if (n_chosen > 0) {
    r.metrics["rewards/chosen"] = item(r.chosen_rewards.nansum()) / static_cast<double>(n_chosen);
    r.metrics["logps/chosen"] = item(in.policy_chosen_logps.detach().nansum()) / static_cast<double>(n_chosen);
  }
  if (n_rejected > 0) {
    r.metrics["rewards/rejected"] = item(r.rejected_rewards.nansum()) / static_cast<double>(n_rejected);
    r.metrics["logps/rejected"] = item(in.policy_rejected_logps.detach().nansum()) / static_cast<double>(n_rejected);
  }
  if (n_chosen > 0 && n_rejected > 0) {
    r.metrics["rewards/margins"] = r.metrics["rewards/chosen"] - r.metrics["rewards/rejected"];
  }
  r.metrics["kl"] = item(kl);
  return r;
}

}  // namespace

RlhfType parse_rlhf_type(const std::string& name) {
  for (const auto& [key, type] : kRlhfTypes) {
    if (name == key) return type;
  }
  fail<ConfigError>("'rlhf_type' {} is not supported (expected dpo, kto, orpo, cpo, simpo or rm)", name);
}

PreferenceLossType parse_preference_loss_type(const std::string& name) {
  for (const auto& [key, type] : kLossTypes) {
    if (name == key) return type;
  }
  fail<ConfigError>("'loss_type' {} is not supported (expected sigmoid, ipo, hinge or robust for dpo; sigmoid, "
                    "hinge, ipo or simpo for cpo; simpo for simpo; kto for kto)", name);
}

std::string to_string(RlhfType type) {
  for (const auto& [key, t] : kRlhfTypes) {
    if (t == type) return key;
  }
  return "?";
}

std::string to_string(PreferenceLossType type) {
  for (const auto& [key, t] : kLossTypes) {
    if (t == type) return key;
  }
  return "?";
}

double PreferenceOptions::effective_beta() const {
  if (beta) return *beta;
  return rlhf_type == RlhfType::kSimpo ? 2.0 : 0.1;
}

PreferenceLossType PreferenceOptions::effective_loss_type() const {
  if (loss_type) return *loss_type;
  const auto allowed = allowed_loss_types(rlhf_type);
  return allowed.empty() ? PreferenceLossType::kSigmoid : allowed.front();
}

void PreferenceOptions::validate() const {
  const std::string method = "rlhf_type " + to_string(rlhf_type);
  const auto allowed = allowed_loss_types(rlhf_type);
  if (loss_type) {
    if (allowed.empty()) refuse_key("loss_type", to_string(*loss_type), method, "dpo, cpo, simpo and kto");
    bool ok = false;
    std::vector<std::string> names;
    for (const auto t : allowed) {
      ok = ok || t == *loss_type;
      names.push_back(to_string(t));
    }
    if (!ok) {
      fail<ConfigError>("'loss_type' {} does not apply to {} (expected {})", to_string(*loss_type), method,
                        fmt::join(names, ", "));
    }
  }
  const PreferenceLossType loss = effective_loss_type();
  const std::string full = method_name(*this);
  const bool is_rm = rlhf_type == RlhfType::kRm;

  if (beta) {
    if (is_rm) refuse_key("beta", fmt::format("{}", *beta), method, "dpo, kto, orpo, cpo and simpo");
    require_finite("beta", *beta);
    if (*beta <= 0) fail<ConfigError>("'beta' must be greater than 0 (got {})", *beta);
  }
  if (label_smoothing != 0) {
    const bool dpo_ok = rlhf_type == RlhfType::kDpo &&
                        (loss == PreferenceLossType::kSigmoid || loss == PreferenceLossType::kRobust);
    const bool cpo_ok = is_pairwise_policy_only(rlhf_type) &&
                        (loss == PreferenceLossType::kSigmoid || loss == PreferenceLossType::kSimpo);
    if (!dpo_ok && !cpo_ok) {
      refuse_key("label_smoothing", fmt::format("{}", label_smoothing), full,
                 "dpo with loss_type sigmoid or robust, and cpo/simpo with loss_type sigmoid or simpo");
    }
    require_non_negative("label_smoothing", label_smoothing);
    if (loss == PreferenceLossType::kRobust ? label_smoothing >= 0.5 : label_smoothing > 0.5) {
      fail<ConfigError>("'label_smoothing' must be in [0, 0.5{} with {} (got {})",
                        loss == PreferenceLossType::kRobust ? ")" : "]", full, label_smoothing);
    }
  }
  if (rpo_alpha) {
    if (rlhf_type != RlhfType::kDpo) refuse_key("rpo_alpha", fmt::format("{}", *rpo_alpha), method, "dpo");
    require_non_negative("rpo_alpha", *rpo_alpha);
  }
  if (reference_free && rlhf_type != RlhfType::kDpo) refuse_key("reference_free", "true", method, "dpo");
  for (const auto& [key, value] : {std::pair<const char*, double>{"desirable_weight", desirable_weight},
                                   {"undesirable_weight", undesirable_weight}}) {
    if (value != 1 && rlhf_type != RlhfType::kKto) refuse_key(key, fmt::format("{}", value), method, "kto");
    require_non_negative(key, value);
  }
  if (simpo_gamma != 1 && loss != PreferenceLossType::kSimpo) {
    refuse_key("simpo_gamma", fmt::format("{}", simpo_gamma), full, "simpo (and cpo with loss_type simpo)");
  }
  require_finite("simpo_gamma", simpo_gamma);
  if (cpo_alpha != 1 && !is_pairwise_policy_only(rlhf_type)) {
    refuse_key("cpo_alpha", fmt::format("{}", cpo_alpha), method, "cpo and simpo");
  }
  require_non_negative("cpo_alpha", cpo_alpha);
  if (center_rewards_coefficient) {
    if (!is_rm) refuse_key("center_rewards_coefficient", fmt::format("{}", *center_rewards_coefficient), method, "rm");
    require_non_negative("center_rewards_coefficient", *center_rewards_coefficient);
  }
}

void PreferenceOptions::validate_batch_size(int64_t per_device_train_batch_size) const {
  if (rlhf_type == RlhfType::kKto && per_device_train_batch_size < 2) {
    fail<ConfigError>("'per_device_train_batch_size' must be at least 2 with rlhf_type kto (got {}): KTO estimates "
                      "its KL term from the other examples of the batch, and with one example it would be the "
                      "example's own reward", per_device_train_batch_size);
  }
}

PreferenceNeeds preference_needs(const PreferenceOptions& o) {
  PreferenceNeeds n;
  const PreferenceLossType loss = o.effective_loss_type();
  switch (o.rlhf_type) {
    case RlhfType::kDpo:
      n.reference = true;
      n.average_logps = loss == PreferenceLossType::kIpo;
      if (o.rpo_alpha) n.nll = NllTokens::kResponse;
      break;
    case RlhfType::kKto:
      n.reference = true;
      n.kl_batch = true;
      break;
    case RlhfType::kOrpo:
      n.average_logps = true;
      n.nll = NllTokens::kPromptAndResponse;
      break;
    case RlhfType::kCpo:
    case RlhfType::kSimpo:
      n.average_logps = loss == PreferenceLossType::kIpo || loss == PreferenceLossType::kSimpo;
      if (o.cpo_alpha != 0) n.nll = NllTokens::kResponse;
      break;
    case RlhfType::kRm: break;
  }
  return n;
}

at::Tensor SequenceLogps::average() const { return sum / count; }

SequenceLogps SequenceLogps::rows(int64_t start, int64_t length) const {
  const auto part = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, start, length) : at::Tensor(); };
  return {part(sum), part(count), part(token_logps)};
}

SequenceLogps sequence_logps(const at::Tensor& logits, const at::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 3, "sequence_logps: logits must be [B, T, V], got ", logits.sizes());
  TORCH_CHECK(labels.dim() == 2 && labels.size(0) == logits.size(0) && labels.size(1) == logits.size(1),
              "sequence_logps: labels must be [B, T] as the logits, got ", labels.sizes(), " for ", logits.sizes());
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  const at::Tensor flat_labels = labels.to(logits.device(), at::kLong).reshape({B * T});  // [B*T]
  const at::Tensor valid = flat_labels.ne(kIgnoreIndex);                                   // [B*T]
  const at::Tensor index = valid.nonzero().squeeze(1);                                     // [N]
  const at::Tensor targets = flat_labels.index_select(0, index);                           // [N]
  TORCH_CHECK(targets.numel() == 0 || (targets.min().item<int64_t>() >= 0 && targets.max().item<int64_t>() < V),
              "sequence_logps: a label is outside the vocabulary of ", V);
  // logits: [B, T, V] -> [N, V] at the labelled positions -> log-softmax (float32) -> [N] at the labels
  const at::Tensor rows = logits.reshape({B * T, V}).index_select(0, index);
  const at::Tensor picked = at::log_softmax(rows, -1, at::kFloat).gather(1, targets.unsqueeze(1)).squeeze(1);
  SequenceLogps out;
  out.token_logps = at::zeros({B * T}, picked.options()).index_copy(0, index, picked).view({B, T});  // [B, T]
  out.sum = out.token_logps.sum(1);                                                                  // [B]
  out.count = valid.view({B, T}).sum(1);                                                             // [B]
  return out;
}

at::Tensor token_mean_nll(const SequenceLogps& logps) { return -logps.sum.sum() / logps.count.sum(); }

double logits_mean(const at::Tensor& logits, const at::Tensor& positions) {
  TORCH_CHECK(logits.dim() == 3, "logits_mean: logits must be [B, T, V], got ", logits.sizes());
  const at::Tensor x = logits.detach().to(at::kFloat);
  if (!positions.defined()) return x.mean().item<double>();
  TORCH_CHECK(positions.dim() == 2 && positions.size(0) == x.size(0) && positions.size(1) == x.size(1),
              "logits_mean: positions must be [B, T] as the logits, got ", positions.sizes());
  // [B, T, V] -> the N * V values at the chosen positions
  return x.masked_select(positions.to(x.device(), at::kBool).unsqueeze(-1)).mean().item<double>();
}

PreferenceResult preference_loss(const PreferenceOptions& options, const PreferenceInputs& inputs) {
  switch (options.rlhf_type) {
    case RlhfType::kDpo: return dpo(options, inputs);
    case RlhfType::kKto: return kto(options, inputs);
    case RlhfType::kOrpo: return orpo(options, inputs);
    case RlhfType::kCpo:
    case RlhfType::kSimpo: return cpo(options, inputs);
    case RlhfType::kRm: break;
  }
  TORCH_CHECK(false, "preference_loss: rlhf_type rm scores pairs with reward_model_loss");
  return {};
}

PreferenceResult reward_model_loss(const PreferenceOptions& options, const at::Tensor& chosen_rewards,
                                   const at::Tensor& rejected_rewards, const at::Tensor& margin) {
  check_vector(chosen_rewards, "chosen_rewards");
  check_same_size(rejected_rewards, chosen_rewards, "reward-model scores");
  at::Tensor diff = chosen_rewards - rejected_rewards;  // [B]
  if (margin.defined()) {
    check_same_size(margin, chosen_rewards, "margin and scores");
    diff = diff - margin.to(diff.scalar_type());
  }
  PreferenceResult r;
  r.losses = -at::log_sigmoid(diff);
  r.loss = r.losses.mean();
  if (options.center_rewards_coefficient) {
    r.loss = r.loss + *options.center_rewards_coefficient * at::pow(chosen_rewards + rejected_rewards, 2).mean();
  }
  r.chosen_rewards = chosen_rewards.detach();
  r.rejected_rewards = rejected_rewards.detach();
  r.metrics["loss"] = item(r.loss);
  r.metrics["rewards/chosen"] = item(r.chosen_rewards.mean());
  r.metrics["rewards/rejected"] = item(r.rejected_rewards.mean());
  r.metrics["rewards/accuracies"] = item(r.chosen_rewards.gt(r.rejected_rewards).to(at::kFloat).mean());
  r.metrics["rewards/margins"] = item((r.chosen_rewards - r.rejected_rewards).mean());
  return r;
}

}  // namespace swiftcpp
