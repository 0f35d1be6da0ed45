// Preference-training objectives (ms-swift's `swift rlhf --rlhf_type dpo|kto|orpo|cpo|simpo|rm`) as pure functions
// of sequence log-probabilities: the options with ms-swift's key names, the per-sequence log-probabilities TRL's
// get_batch_logps computes, and each method's loss, rewards and logged metrics with TRL v0.9.6's arithmetic and
// metric names. No model, data or optimizer here: the trainer runs the forwards and feeds the tensors in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace swiftcpp {

/// ms-swift's rlhf_type. simpo is CPO with loss_type simpo (and beta 2.0 unless given), as ms-swift maps it.
enum class RlhfType { kDpo, kKto, kOrpo, kCpo, kSimpo, kRm };

/// loss_type: sigmoid, ipo, hinge, robust (DPO); sigmoid, hinge, ipo, simpo (CPO); kto (KTO).
enum class PreferenceLossType { kSigmoid, kIpo, kHinge, kRobust, kSimpo, kKto };

/// "dpo" | "kto" | "orpo" | "cpo" | "simpo" | "rm". Throws ConfigError naming rlhf_type and the choices.
RlhfType parse_rlhf_type(const std::string& name);
/// "sigmoid" | "ipo" | "hinge" | "robust" | "simpo" | "kto". Throws ConfigError naming loss_type and the choices
/// (TRL's other loss types, e.g. bco_pair or sppo_hard, are refused as not implemented).
PreferenceLossType parse_preference_loss_type(const std::string& name);
/// The key value of a type ("dpo", "sigmoid", ...).
std::string to_string(RlhfType type);
std::string to_string(PreferenceLossType type);

/// The preference keys of a recipe, named and defaulted as ms-swift's RLHFArguments (simpo_gamma 1 is ms-swift's
/// default; TRL's CPOConfig has 0.5). Keys whose default depends on the method are optional; the others count as
/// given when they differ from their default.
struct PreferenceOptions {
  RlhfType rlhf_type = RlhfType::kDpo;
  std::optional<double> beta;                    // unset: 0.1, or 2.0 with rlhf_type simpo; not for rm
  std::optional<PreferenceLossType> loss_type;   // unset: sigmoid (dpo, cpo), simpo (simpo), kto (kto)
  double label_smoothing = 0;                    // dpo sigmoid/robust, cpo/simpo sigmoid/simpo; in [0, 0.5]
  std::optional<double> rpo_alpha;               // dpo: adds the chosen responses' NLL (RPO); unset: off
  bool reference_free = false;                   // dpo: the implicit reference assigns equal probability
  double desirable_weight = 1;                   // kto
  double undesirable_weight = 1;                 // kto
  double simpo_gamma = 1;                        // cpo/simpo with loss_type simpo: target margin
  double cpo_alpha = 1;                          // cpo/simpo: weight of the chosen responses' NLL
  std::optional<double> center_rewards_coefficient;  // rm: adds coefficient * mean((r_c + r_r)^2)

  /// beta in effect.
  double effective_beta() const;
  /// loss_type in effect (kSigmoid for orpo and rm, which have none).
  PreferenceLossType effective_loss_type() const;
  /// Checks every key against the method: a key the method does not use, given (set, or different from its
  /// default), and values out of range throw ConfigError naming the key. Where TRL v0.9.6 warns and ignores
  /// (label_smoothing with hinge/ipo) this refuses. Not checked here: TRL's KTO warning on desirable/undesirable
  /// weights against the dataset's class counts (it needs the data).
  void validate() const;
  /// KTO estimates its KL term from the other examples of the same micro-batch, so a per-device batch of one
  /// example would make it the example's own reward (TRL refuses it too). Throws ConfigError naming
  /// per_device_train_batch_size for kto with a batch below 2; nothing for other methods.
  void validate_batch_size(int64_t per_device_train_batch_size) const;
};

/// Which tokens the chosen rows' token-mean NLL term runs over.
enum class NllTokens {
  kNone,               // no NLL term
  kResponse,           // response tokens (DPO's rpo_alpha, CPO/SimPO's cpo_alpha): the labels of the log-probs
  kPromptAndResponse,  // every non-padding target, prompt included (ORPO in TRL v0.9.6)
};

/// What a method needs the trainer to compute for preference_loss.
struct PreferenceNeeds {
  bool reference = false;      // reference log-probs (dpo, kto; DPO's reference_free still uses them for rewards)
  bool average_logps = false;  // length-averaged log-probs (dpo ipo, orpo, cpo ipo/simpo) instead of sums
  NllTokens nll = NllTokens::kNone;
  bool kl_batch = false;       // kto: log-probs of the mismatched (KL) batch, policy and reference, no gradient
};

/// What `options` (validated) needs.
PreferenceNeeds preference_needs(const PreferenceOptions& options);

/// Per-sequence label log-probabilities, as TRL's get_batch_logps returns them.
struct SequenceLogps {
  at::Tensor sum;          // [B] float32: sum of log p(label) over the labelled positions (0 for a row without)
  at::Tensor count;        // [B] int64: labelled positions
  at::Tensor token_logps;  // [B, T] float32: log p(label) per position, 0 where the label is kIgnoreIndex

  /// sum / count [B] (TRL's average_log_prob; NaN for a row without labels).
  at::Tensor average() const;
  /// Rows [start, start + length) of every field (an undefined field stays undefined: precomputed reference
  /// log-probabilities have no per-token values).
  SequenceLogps rows(int64_t start, int64_t length) const;
};

/// Label log-probabilities of logits [B, T, V] against shifted labels [B, T] int64 (labels[t] is the token
/// position t predicts, kIgnoreIndex where nothing is predicted; lib/data/collate.h's convention). The log-softmax
/// runs in float32 over the labelled positions only (a [N, V] float32 copy for N labelled positions; no float64
/// copy), and the per-row sums add the [B, T] per-token values with zeros elsewhere, as TRL does. Differentiable
/// with respect to the logits.
SequenceLogps sequence_logps(const at::Tensor& logits, const at::Tensor& labels);

/// Token-mean negative log-likelihood over all labelled positions of `logps` (every row): -sum(sum) / sum(count),
/// a float32 scalar. What TRL's nn.CrossEntropyLoss over those rows and labels computes (up to summation order).
at::Tensor token_mean_nll(const SequenceLogps& logps);

/// Mean of logits [B, T, V] over all positions (TRL v0.9.6's logits/chosen and logits/rejected take the padded
/// half-batch whole, padding positions included, so the value depends on the pad id and on how padded positions
/// are computed), or over the positions where `positions` [B, T] bool is true. Computed in float32, detached.
double logits_mean(const at::Tensor& logits, const at::Tensor& positions = {});

/// The tensors TRL's loss functions receive. Pairwise methods (dpo, orpo, cpo, simpo): row i of chosen and rejected
/// is pair i. KTO: chosen = desirable examples, rejected = undesirable ones (either may be empty), each in batch
/// order. Log-probs are sums or averages as preference_needs says.
struct PreferenceInputs {
  at::Tensor policy_chosen_logps;       // [Nc]
  at::Tensor policy_rejected_logps;     // [Nr]
  at::Tensor reference_chosen_logps;    // [Nc] (dpo, kto)
  at::Tensor reference_rejected_logps;  // [Nr] (dpo, kto)
  at::Tensor policy_kl_logps;           // [M] kto: the KL batch under the policy (no gradient needed)
  at::Tensor reference_kl_logps;        // [M] kto: the KL batch under the reference
  at::Tensor nll_loss;                  // [] the chosen rows' token-mean NLL, when preference_needs().nll is set
  std::optional<double> chosen_logits_mean;    // logits/chosen (pairwise methods), see logits_mean
  std::optional<double> rejected_logits_mean;  // logits/rejected
};

/// A loss with what TRL logs of it.
struct PreferenceResult {
  /// The per-example vector TRL's loss function returns: DPO after RPO's NLL term; CPO/SimPO before the NLL
  /// term; ORPO the odds-ratio terms beta * log sigmoid(log_odds), which the loss subtracts; KTO the weighted
  /// desirable losses followed by the undesirable ones; rm the per-pair Bradley-Terry losses.
  at::Tensor losses;
  at::Tensor loss;              // [] the value to back-propagate
  at::Tensor chosen_rewards;    // [Nc] detached
  at::Tensor rejected_rewards;  // [Nr] detached
  /// TRL's logged names: loss, rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
  /// logps/chosen, logps/rejected, logits/chosen, logits/rejected (when given), nll_loss (rpo_alpha, cpo, simpo,
  /// orpo), log_odds_ratio and log_odds_chosen (orpo), kl (kto). KTO logs no accuracies or logits, and a side
  /// with no examples logs no rewards/logps (nor margins). Each value is one micro-batch's; over several, TRL
  /// averages these values (DPO, ORPO, CPO) but divides KTO's summed rewards and logps by the summed counts.
  std::map<std::string, double> metrics;
};

/// The loss of `options`' method (dpo, kto, orpo, cpo, simpo; validated) from `inputs`, as TRL v0.9.6 computes it,
/// with h = (pi_c - pi_r) - (ref_c - ref_r) and beta, epsilon = label_smoothing:
///  - dpo sigmoid: -(1 - eps) log s(beta h) - eps log s(-beta h); robust: [-(1 - eps) log s(beta h) + eps
///    log s(-beta h)] / (1 - 2 eps); hinge: relu(1 - beta h); ipo: (h - 1 / (2 beta))^2 on averaged log-probs;
///    reference_free: h = pi_c - pi_r. rpo_alpha: losses = rpo_alpha * losses + nll (TRL v0.9.6; later TRL
///    releases weight the NLL instead, losses + rpo_alpha * nll, which agrees at rpo_alpha 1). Rewards
///    beta (pi - ref), also when reference_free.
///  - kto: z0 = max(0, mean(policy_kl - reference_kl)), detached; desirable w_D (1 - s(beta (pi - ref - z0))),
///    undesirable w_U (1 - s(beta (z0 - (pi - ref)))); loss = nanmean. Rewards beta (pi - ref).
///  - orpo: log_odds = (pi_c - pi_r) - (log(1 - e^pi_c) - log(1 - e^pi_r)) on averaged log-probs; loss = nll -
///    mean(beta log s(log_odds)). Rewards beta pi.
///  - cpo sigmoid/hinge/ipo: the DPO formulas with h = pi_c - pi_r (no reference); simpo: h = pi_c - pi_r -
///    gamma / beta on averaged log-probs with the sigmoid formula; loss = mean + cpo_alpha nll. Rewards beta pi.
/// Metrics as PreferenceResult says. TORCH_CHECKs that the tensors the method needs are present and sized alike.
PreferenceResult preference_loss(const PreferenceOptions& options, const PreferenceInputs& inputs);

/// A reward model's Bradley-Terry loss as TRL's RewardTrainer computes it: mean(-log s(r_c - r_r - margin)) (margin
/// [B] per pair, or none), plus center_rewards_coefficient * mean((r_c + r_r)^2) when set. chosen_rewards
/// and rejected_rewards are the model's scalar scores [B]. Metrics: loss, rewards/chosen, rewards/rejected,
/// rewards/accuracies, rewards/margins (the DPO names; TRL v0.9.6's RewardTrainer logs only the loss in training).
PreferenceResult reward_model_loss(const PreferenceOptions& options, const at::Tensor& chosen_rewards,
                                   const at::Tensor& rejected_rewards, const at::Tensor& margin = {});

}  // namespace swiftcpp
