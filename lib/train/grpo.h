// Online RL with GRPO (ms-swift's `swift rlhf --rlhf_type grpo`): prompts are rolled out num_generations times by
// the generation engine, the completions are scored by reward functions (train/rewards.h), rewards become group
// advantages, and the policy takes clipped policy-gradient steps with an optional k3 KL term toward the reference,
// with TRL's loss arithmetic (GRPOTrainer._compute_loss of TRL 0.21; dapo from 0.22). The pure parts (options,
// advantages, the loss) are separate from the task that runs them in the training job (run_grpo).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/encode.h"
#include "train/rewards.h"
#include "train/run.h"

namespace swiftcpp {

/// loss_type: how per-token losses are aggregated (TRL's names).
enum class GrpoLossType {
  kGrpo,    // mean over completions of each completion's token mean
  kBnpo,    // token mean over the micro-batch
  kDrGrpo,  // token sum / (completions x max_completion_length)
  kDapo,    // token sum / the step's completion tokens (every micro-batch and process together)
};

/// scale_rewards: what the advantages are divided by (after subtracting the group mean).
enum class ScaleRewards { kGroup, kBatch, kNone };

/// The GRPO keys of a recipe, validated (grpo_options).
struct GrpoOptions {
  int64_t num_generations = 8;
  int64_t max_completion_length = 512;
  double temperature = 0.9;
  double top_p = 0.9;
  int64_t top_k = 50;
  double repetition_penalty = 1.0;
  double beta = 0.04;  // 0: no KL term and no reference forward
  double epsilon = 0.2, epsilon_high = 0.2;
  GrpoLossType loss_type = GrpoLossType::kGrpo;
  ScaleRewards scale_rewards = ScaleRewards::kGroup;
  int64_t num_iterations = 1;
  bool mask_truncated_completions = false;
  std::vector<std::string> reward_funcs;
  std::vector<double> reward_weights;  // one per reward function
  RewardSettings rewards;
  bool log_completions = false;
};

/// "grpo" | "bnpo" | "dr_grpo" | "dapo"; "group" | "batch" | "none". Throw ConfigError naming the key and choices.
GrpoLossType parse_grpo_loss_type(const std::string& name);
ScaleRewards parse_scale_rewards(const std::string& name);
std::string to_string(GrpoLossType type);
std::string to_string(ScaleRewards scale);

/// The GRPO options of a recipe with rlhf_type grpo. Throws ConfigError naming the key for: no reward_funcs,
/// reward_weights of another count, a preference-only key (label_smoothing, rpo_alpha, ref_model with LoRA, ...),
/// per_device_train_batch_size x gradient_accumulation_steps not a multiple of num_generations (a prompt's
/// completions stay in one process's step), save_steps not a multiple of num_iterations, batching other than
/// padding, a scheduler, context parallelism, truncation_strategy right, or a reward's own settings out of range.
GrpoOptions grpo_options(const TrainConfig& config);

/// Advantages of rewards [N] float32 laid out in groups of `group` consecutive completions of one prompt:
/// reward - its group's mean, divided (scale group) by the group's unbiased std + 1e-4, (scale batch) by
/// `batch_std` + 1e-4 (the unbiased std over every process's rewards; unset: over `rewards`), or (none) not.
/// Also each group's std [N / group] (for frac_reward_zero_std).
struct GroupAdvantages {
  at::Tensor advantages;  // [N] float32
  at::Tensor group_std;   // [N / group] float32
};
GroupAdvantages group_advantages(const at::Tensor& rewards, int64_t group, ScaleRewards scale,
                                 std::optional<double> batch_std = std::nullopt);

/// What one micro-batch's loss is computed from; every [R, C] tensor is laid out alike (row = completion,
/// column = its token), values outside `mask` are ignored.
struct GrpoLossInputs {
  at::Tensor logps;       // [R, C] float32 policy log-probs at the sampling temperature (with gradient)
  at::Tensor old_logps;   // [R, C] at rollout time (num_iterations > 1); undefined: logps detached (ratio 1)
  at::Tensor ref_logps;   // [R, C] reference log-probs (beta != 0)
  at::Tensor advantages;  // [R] float32
  at::Tensor mask;        // [R, C] float32: 1 for tokens up to and including the first EOS
  at::Tensor entropy;     // [R, C] optional, for the entropy metric
  double dapo_tokens = 0; // dapo: the completion tokens of the whole step (every micro-batch and process)
};

struct GrpoLossResult {
  at::Tensor loss;  // []
  /// TRL's names: kl (beta != 0), entropy (when given), clip_ratio/low_mean, clip_ratio/high_mean,
  /// clip_ratio/region_mean: masked token means over the micro-batch.
  std::map<std::string, double> metrics;
};

/// TRL's GRPO loss: ratio = exp(logps - old), per token -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A)
/// + beta (exp(ref - logps) - (ref - logps) - 1), aggregated as loss_type says (dr_grpo divides by R x
/// max_completion_length). A grpo loss can be ~0 while its gradient is not: the advantages of a group sum to 0 and
/// the ratio is 1, but each token's gradient is weighted by its own advantage.
GrpoLossResult grpo_loss(const GrpoOptions& options, const GrpoLossInputs& inputs);

/// Completions as model input: each row is its prompt followed by the completion's counted tokens, right-padded.
struct CompletionBatch {
  at::Tensor input_ids;  // [R, T] int64
  at::Tensor key_valid;  // [R, T] bool
  at::Tensor targets;    // [R, T] int64: the completion token a position predicts, kIgnoreIndex elsewhere
  at::Tensor index;      // [R, C] int64: the position predicting completion token c (0 where c is not counted)
  at::Tensor mask;       // [R, C] float32: 1 for counted tokens; C = the longest count
  int64_t tokens = 0;    // real (non-padding) tokens
  /// The prompts' images, each prompt's once (its G rows share them): row r holds image_sets[row_image_set[r]]
  /// (-1: none). The training forward encodes each set once and gives its features to every row that holds it.
  std::vector<ImageInputs> image_sets;
  std::vector<int64_t> row_image_set;  // [R]
  at::Tensor image_grid_thw;           // [N, 3] every row's grids in row order (variable-size images: M-RoPE)
};

/// Rows of `prompts[r]` + the first `counted[r]` tokens of `completions[r]`, padded with `pad_id`, with the images
/// of each row's prompt (`images[r]`, may be empty or null; none when `images` is empty) in row order. Throws
/// ConfigError when the sizes differ, a count exceeds its completion, or fixed-size and variable-size images meet.
CompletionBatch collate_completions(const std::vector<const std::vector<int64_t>*>& prompts,
                                    const std::vector<const std::vector<int64_t>*>& completions,
                                    const std::vector<int64_t>& counted, int64_t pad_id,
                                    const std::vector<const ImageInputs*>& images = {});

/// Per-token log-probs [R, C] float32 of a batch's completion tokens under `model` at `temperature` (TRL's
/// logits / temperature, log-softmax, gathered), with autograd as the caller has it; with `entropy`, also the
/// entropy of each position's scaled distribution [R, C] (detached). The tower runs once for all of the batch's
/// image sets.
struct CompletionLogps {
  at::Tensor logps;
  at::Tensor entropy;
};
CompletionLogps completion_logps(CausalLM& model, const CompletionBatch& batch, double temperature, bool entropy);

/// One prompt of GRPO data: the conversation to complete and the row's other columns for the reward functions.
struct GrpoPrompt {
  std::vector<ChatMessage> messages;  // [system] user (assistant user)*
  /// The prompt's images, one per kImagePlaceholder of the messages in order (relative paths from the dataset
  /// file's folder).
  std::vector<fs::path> images;
  Json fields = Json::object();       // every other column of the row (GSM8K's "answer" also as "solution"; with
                                      // images, "images": the resolved paths)
  std::string where;                  // "file:line"
};

/// Recognises one GRPO row: {"messages": [...]} (a final assistant turn is dropped; the rest must end with a user
/// turn), {"prompt": "..." | [messages]}, {"query": "..."} (ms-swift; "response" is dropped), or GSM8K's
/// {"question", "answer"} (the answer also becomes "solution" unless the row has one); "system" adds a system
/// turn. Images come as SFT rows give them: an "images" column with kImagePlaceholders in the messages, or image
/// content parts (relative paths resolved against `base_dir`). Throws BadRowError naming `where` ("no prompt",
/// "prompt must end with a user turn", "bad message", and the image reasons of normalise_row).
GrpoPrompt normalise_grpo_row(const Json& row, const std::string& where, const fs::path& base_dir = {});

/// GRPO: run_job with the rollout task. Throws ConfigError as grpo_options, and the errors of run_job, the data,
/// the engine and the reward functions.
TrainResult run_grpo(const TrainConfig& config, const TrainHooks& hooks = {});

}  // namespace swiftcpp
