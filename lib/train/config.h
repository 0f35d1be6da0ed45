// The training configuration: one typed struct, decoded strictly from a YAML recipe plus `key=value` overrides
// (names follow ms-swift / Hugging Face TrainingArguments where they exist), saved as args.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/schema.h"

namespace swiftcpp {

struct TrainConfig {
  // Model and tuning method
  std::string model = "models/stories260K";
  std::string train_type = "lora";  // lora | full
  std::string adapters;             // start from this PEFT adapter folder instead of a fresh one
  std::string torch_dtype = "float32";
  std::string device = "cpu";
  bool bf16 = false;                // bf16 autocast (float32 master weights)
  bool gradient_checkpointing = false;

  // LoRA / DoRA
  int64_t lora_rank = 8;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  std::vector<std::string> target_modules = {"all-linear"};
  bool use_rslora = false;
  bool use_dora = false;
  int64_t zero_stage = 0;         // multi-process: 1 shards the optimizer state across ranks (ZeRO-1)
  double ddp_timeout = 1800;      // multi-process: seconds a rendezvous or collective may wait for the others
  int64_t quant_bits = 0;         // QLoRA: 4 or 8 packs the frozen base linear layers (0: float base)
  int64_t quant_group_size = 64;  // QLoRA: input columns per quantisation scale
  std::vector<std::string> modules_to_save;
  // Vision-language models: which parts train (ms-swift's keys). With LoRA the adapters go on the language model,
  // and a part that is not frozen (aligner, vision tower) is trained in full and saved as modules_to_save.
  bool freeze_vit = true;
  int64_t max_pixels = 0;  // Qwen2-VL image processor: max_pixels over preprocessor_config.json's (0: the file's)
  int64_t min_pixels = 0;  // likewise min_pixels
  bool freeze_aligner = false;
  bool freeze_llm = false;

  // Data
  std::vector<std::string> dataset;
  std::vector<std::string> val_dataset;
  double split_dataset_ratio = 0.0;
  bool dataset_shuffle = true;
  std::string chat_template;  // recipe key "template"; empty: detected from the checkpoint
  std::string system;
  int64_t max_length = 2048;
  std::string truncation_strategy = "delete";
  std::string loss_scale = "default";
  bool packing = false;              // same as batching: packing (ms-swift's key)
  std::string batching = "padding";  // padding | packing | chunkflow
  int64_t chunk_size = 2048;         // ChunkFlow: tokens per chunk (C)
  int64_t chunk_keep = 1;            // ChunkFlow: chunks of a split sequence whose activations stay alive (K)
  std::string scheduler = "none";    // none | skrull | skrull_paper | round_robin | sorted | flops_balanced
  int64_t skrull_budget = 0;         // scheduler: tokens per micro-batch on one rank (0: max_length)
  std::string skrull_profile;        // scheduler: device profile JSON (empty: measured at the start of the run)
  int64_t context_parallel_size = 1; // scheduler: ranks of one context-parallel group (sharded long sequences)
  bool strict = true;
  int64_t dataset_num_proc = 0;
  std::string data_cache_dir;

  // Optimisation
  double learning_rate = 1e-4;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;
  bool skip_nonfinite_loss = false;  // a step whose loss is NaN/Inf: false stops the run, true drops that step
  std::string lr_scheduler_type = "cosine";
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  int64_t per_device_train_batch_size = 1;
  int64_t per_device_eval_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 1;
  int64_t max_steps = -1;
  int64_t seed = 42;

  // Preference training (`swiftcpp rlhf`; ms-swift's RLHFArguments). Empty rlhf_type: supervised fine-tuning.
  std::string rlhf_type;                     // dpo | kto | orpo | cpo | simpo | rm
  std::optional<double> beta;                // unset: 0.1, or 2.0 with simpo
  std::string loss_type;                     // empty: the method's default
  double label_smoothing = 0;
  std::optional<double> rpo_alpha;
  bool reference_free = false;
  double desirable_weight = 1;
  double undesirable_weight = 1;
  double simpo_gamma = 1;
  double cpo_alpha = 1;
  std::optional<double> center_rewards_coefficient;
  std::string ref_model;                     // full fine-tuning: the reference checkpoint (empty: model itself)
  bool precompute_ref_log_probs = false;     // reference log-probabilities computed once before training
  int64_t max_prompt_length = 0;             // truncation left/right: prompt tokens kept (0: max_length / 2)

  // Online RL (`swiftcpp rlhf` with rlhf_type grpo; ms-swift's GRPO arguments). per_device_train_batch_size counts
  // completions; beta (unset) is 0.04 and loss_type (empty) grpo here.
  int64_t num_generations = 8;               // G: completions sampled per prompt
  int64_t max_completion_length = 512;       // new tokens per completion
  double temperature = 0.9;                  // rollout sampling (and the log-probabilities of the loss)
  double top_p = 0.9;
  int64_t top_k = 50;                        // 0: off
  double repetition_penalty = 1.0;
  double epsilon = 0.2;                      // ratio clip, lower side
  std::optional<double> epsilon_high;        // ratio clip, upper side (unset: epsilon)
  std::string scale_rewards = "group";       // group | batch | none
  int64_t num_iterations = 1;                // optimizer steps per rollout batch (old log-probs when > 1)
  bool mask_truncated_completions = false;   // completions without EOS count no token
  std::vector<std::string> reward_funcs;     // accuracy | format | soft_overlong | repetition | cosine | external:CMD
  std::vector<double> reward_weights;        // one per reward function (empty: all 1)
  double reward_timeout = 300;               // external reward commands: seconds per batch
  bool log_completions = false;              // completions.jsonl every logging_steps steps
  int64_t soft_max_length = 0;               // soft_overlong: 0 = max_completion_length
  int64_t soft_cache_length = 0;             // soft_overlong: the penalised stretch before soft_max_length
  int64_t repetition_n_grams = 3;
  double repetition_max_penalty = -1.0;
  double cosine_min_len_value_wrong = -0.5;
  double cosine_max_len_value_wrong = 0.0;
  double cosine_min_len_value_correct = 1.0;
  double cosine_max_len_value_correct = 0.5;
  int64_t cosine_max_len = 0;                // cosine: 0 = max_completion_length

  // Outputs
  std::string output_dir = "output";
  int64_t logging_steps = 5;
  int64_t save_steps = 500;
  int64_t save_total_limit = -1;
  int64_t eval_steps = -1;  // -1: same as save_steps
  bool save_only_model = false;
  std::string resume_from_checkpoint;  // a checkpoint folder, or "latest" (newest under output_dir)
};

/// The schema of TrainConfig: every recipe key with its type, range and help.
const ConfigSchema<TrainConfig>& train_config_schema();

/// Loads a recipe (when `recipe` is not empty) and applies the overrides in order, then checks the combination
/// (validate_train_config). Throws ConfigError naming the file:line or the argument.
/// `defaults` are the values before the recipe (`swiftcpp rlhf` starts from rlhf_defaults()).
TrainConfig load_train_config(const std::string& recipe, const std::vector<std::string>& overrides,
                              const TrainConfig& defaults = TrainConfig{});

/// The defaults of `swiftcpp rlhf`: TrainConfig's, with ms-swift's RLHF defaults where they differ (rlhf_type
/// dpo, loss_scale last_round).
TrainConfig rlhf_defaults();

/// Checks what single-field ranges cannot: combinations and required keys. Throws ConfigError.
void validate_train_config(const TrainConfig& config);

/// Each GRPO key with whether `config` sets it (differs from its default), in declaration order.
std::vector<std::pair<std::string, bool>> grpo_keys_given(const TrainConfig& config);

/// The batching mode in effect: `batching`, or "packing" when the ms-swift key packing is true.
std::string effective_batching(const TrainConfig& config);

}  // namespace swiftcpp
