// Preference training as tasks of the training job (`swiftcpp rlhf`): DPO and its loss types, KTO, ORPO, CPO, SimPO
// and reward models, on preference data (lib/data/preference_data.h) with the losses of train/preference.h. Chosen
// and rejected answers run in one concatenated forward; the reference of a LoRA policy is its own base (adapters
// switched off for a no-grad forward), a full fine-tune keeps a frozen reference copy, and
// precompute_ref_log_probs computes the reference log-probabilities once before training instead.
#pragma once

#include <cstdint>

#include "data/preference_data.h"
#include "train/preference.h"
#include "train/run.h"

namespace swiftcpp {

/// The preference options of a recipe (rlhf_type and its keys), validated as PreferenceOptions::validate and
/// validate_batch_size do, plus what the job refuses: rlhf_type empty; ref_model with train_type lora (TRL refuses
/// a ref_model beside a peft_config: the base is the reference); ref_model or precompute_ref_log_probs for a method
/// without a reference (orpo, cpo, simpo, rm, reference_free dpo's precompute is allowed); a LoRA reference run
/// with modules_to_save (their base values are not kept); batching other than padding, a scheduler or context
/// parallelism; loss_scale other than last_round. Throws ConfigError naming the key.
PreferenceOptions preference_options(const TrainConfig& config);

/// Preference training: run_job with the task of config.rlhf_type ("dpo", "kto", ... in messages). Throws
/// ConfigError as preference_options and the errors of run_job.
TrainResult run_rlhf(const TrainConfig& config, const TrainHooks& hooks = {});

/// Adds the reward head of a sequence-classification model to `model` as Hugging Face's
/// LlamaForSequenceClassification names it: `score`, Linear(hidden_size, 1, bias=False), initialised from
/// N(0, 0.02) (initializer_range) with `seed`, on the model's device and dtype. Throws ConfigError when the model
/// has a `score` module already.
void attach_reward_head(CausalLM& model, uint64_t seed);

/// hidden [R, T, D] and key_valid [R, T] (right padding; undefined: every position real) -> the reward head's
/// score at each row's last real position, [R] float32.
at::Tensor reward_scores(CausalLM& model, const at::Tensor& hidden, const at::Tensor& key_valid);

/// The log-probabilities the preference and GRPO losses need, computed from hidden states [R, T, D] with the head
/// applied at the positions of `targets` [R, T] (kIgnoreIndex elsewhere) only: token log p(target) [R, T] float32
/// (0 elsewhere) of the logits divided by `temperature` (GRPO scores completions at their sampling temperature; 1
/// divides nothing); with `logit_sums`, the sum of each such position's logits [R, T] float32, detached (0
/// elsewhere; for TRL's logits/chosen and logits/rejected); with `entropy`, the entropy of each such position's
/// temperature-scaled distribution [R, T] float32, detached (0 elsewhere).
struct HeadLogps {
  at::Tensor token_logps;
  at::Tensor logit_sums;
  at::Tensor entropy;
};
HeadLogps head_logps(CausalLM& model, const at::Tensor& hidden, const at::Tensor& targets, bool logit_sums,
                     double temperature = 1.0, bool entropy = false);

/// The sequence log-probabilities over the positions where `labels` [R, T] is not kIgnoreIndex, from per-position
/// values `token_logps` [R, T] (other positions are zeroed), summed as sequence_logps sums them.
SequenceLogps masked_logps(const at::Tensor& token_logps, const at::Tensor& labels);

/// Puts `model` in eval mode (nothing dropped) for its scope, and back in training mode afterwards when it was
/// training: reference forwards and rollouts run the policy this way.
class EvalScope {
 public:
  explicit EvalScope(CausalLM& model) : model_(model), training_(model->is_training()) { model_->eval(); }
  ~EvalScope() {
    if (training_) model_->train();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  CausalLM& model_;
  bool training_;
};

/// The frozen reference of a full fine-tune: ref_model (or model) loaded on `device` in torch_dtype, in eval mode,
/// without gradients. Throws the loader's errors.
CausalLM load_reference_model(const TrainConfig& config, const at::Device& device);

/// Images that several groups of a batch's rows share: each image once, its features repeated `copies` times in
/// row order (a preference batch: 2, its chosen rows then its rejected rows, which hold the same prompts' images).
struct SharedImages {
  ImageInputs images;
  int64_t copies = 1;
};

/// The features of `shared` under `model`'s vision encoder ([copies N, F, D] or [copies M, D]): the tower runs once
/// for all copies. Undefined when there are no images. Throws ConfigError for a text model given images.
at::Tensor shared_image_features(CausalLM& model, const SharedImages& shared);

/// Reference log-probabilities of `batch`'s labels ([R] sums and counts), without autograd: under `reference` when
/// it is not null, else under `policy` with its LoRA adapters switched off, its modules_to_save at their original
/// values and dropout off (AdaptersDisabled; the policy's mode is restored). The batch's image positions take
/// `shared`'s features when it holds images (encoded by the reference's own tower and aligner), else
/// batch.pixel_values. Throws ConfigError as AdaptersDisabled does.
SequenceLogps reference_logps(CausalLM& policy, CausalLM reference, const Batch& batch, bool autocast,
                              const SharedImages& shared = {});

/// One micro-batch of pairs (collate_preference: [2B] rows, chosen then rejected) through the objective of
/// `options` as TRL computes it: the reference log-probabilities first where the method uses them, then one
/// concatenated policy forward (each prompt's images encoded once for both of its rows; the head only at answer
/// positions, and for ORPO at the chosen rows' prompt positions), then preference_loss. The reference is
/// `reference` when its sum is defined (precomputed), else reference_logps with `reference_model` and the batch's
/// shared images;
/// for rm the reward head's scores and reward_model_loss with the pairs' margins. logits/chosen and
/// logits/rejected are the mean logit over the answers' predicting positions (TRL 0.9.6 averages the padded batch
/// whole, padding included). bf16 autocast when `autocast`.
PreferenceResult pair_objective(const PreferenceOptions& options, CausalLM& policy, const PreferenceBatch& batch,
                                const SequenceLogps& reference, CausalLM reference_model, bool autocast);

}  // namespace swiftcpp
