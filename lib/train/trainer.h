// Supervised fine-tuning: the optimizer step over micro-batches (Trainer) and the whole job around it
// (run_training: run folder, data, logging, evaluation, checkpoints, exact resume).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/collate.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "train/chunkflow.h"
#include "train/config.h"
#include "train/optim.h"

namespace swiftcpp {

/// What one optimizer step did.
struct StepResult {
  double loss = 0;           // sum of token cross-entropies / label tokens of the whole step
  double grad_norm = 0;      // global L2 norm before clipping
  double token_acc = 0;      // share of label tokens the model ranked first
  double learning_rate = 0;  // the rate this update used
  int64_t label_tokens = 0;
  int64_t real_tokens = 0;
  int64_t forwards = 0;  // model forwards this step ran (ChunkFlow's recomputations included)
};

/// The model being tuned, its trainable tensors and optimizer: one optimizer step over micro-batches.
class Trainer {
 public:
  /// Prepares `model` for `config`: LoRA/DoRA adapters (fresh from config.seed, or loaded from
  /// config.adapters / `adapter_dir` when given) with frozen base weights, or every weight trainable for full
  /// fine-tuning; AdamW over the trainable tensors. Throws ConfigError / ModelError.
  Trainer(const TrainConfig& config, CausalLM model, const std::string& adapter_dir = "");

  /// One optimizer step: forward and backward of every micro-batch (on the model's device; bf16 autocast when
  /// configured), the loss normalised by the label tokens of all of them together, clipping, AdamW with the
  /// scheduled rate of step `global_step` out of `total_steps`.
  StepResult step(const std::vector<Batch>& micro_batches, int64_t global_step, int64_t total_steps);

  /// One optimizer step over a global batch in ChunkFlow chunks (config.chunk_keep graphs alive per split
  /// sample), normalised by the global batch's label tokens; otherwise as step().
  StepResult step(const ChunkedBatch& batch, int64_t global_step, int64_t total_steps);

  /// Sum of token cross-entropies and label-token count over `batches`, without gradients, in eval mode.
  std::pair<double, int64_t> evaluate(const std::vector<Batch>& batches);

  CausalLM& model() { return model_; }
  AdamW& optimizer() { return *optimizer_; }
  const std::vector<TrainableTensor>& trainables() const { return optimizer_->params(); }
  const TrainConfig& config() const { return config_; }
  /// The adapter configuration in use (LoRA only).
  const LoraConfig& lora_config() const { return lora_; }
  bool is_lora() const { return config_.train_type == "lora"; }
  int64_t warmup_steps(int64_t total_steps) const;

 private:
  /// Summed token cross-entropy of one micro-batch (lm_head only where labels are); adds the count of
  /// correctly ranked label tokens to `correct` (a device scalar) when given.
  /// With `chunk`, a ChunkFlow chunk attending to earlier chunks' K/V; with need_loss false, only the K/V are
  /// wanted and the head is skipped (returns an undefined tensor).
  at::Tensor forward_loss(const Batch& batch, at::Tensor* correct, nn::ChunkKV* chunk = nullptr,
                          bool need_loss = true);
  /// Clipping and the AdamW update after the gradients of a step are in.
  void finish_step(StepResult& r, const at::Tensor& loss_sum, const at::Tensor& correct, int64_t global_step,
                   int64_t total_steps);

  TrainConfig config_;
  CausalLM model_;
  LoraConfig lora_;
  std::unique_ptr<AdamW> optimizer_;
};

/// The adapter configuration a recipe asks for: config.adapters' adapter_config.json when set, else the lora_*
/// keys. Throws like read_adapter_config.
LoraConfig requested_lora(const TrainConfig& config);

/// Where a finished (or stopped) run left its results.
struct TrainResult {
  fs::path run_dir;
  fs::path last_checkpoint;
  int64_t global_step = 0;
  int64_t total_steps = 0;
  bool interrupted = false;
  std::vector<double> losses;                              // training loss per step (this process's steps)
  std::vector<std::pair<int64_t, double>> eval_losses;     // (step, validation loss)
};

/// How run_training talks to its caller: progress and messages go to `out` (a live bar when `tty`), and the
/// run stops cleanly (finishing the step, saving a checkpoint) once `stop` becomes true.
struct TrainHooks {
  std::ostream* out = nullptr;
  bool tty = false;
  int columns = 0;  // terminal width for the bar (0: unknown)
  const std::atomic<bool>* stop = nullptr;
  std::vector<std::string> command_line;  // recorded in args.json
};

/// The whole job: resolves `resume_from_checkpoint`, creates output_dir/vN-YYYYMMDD-HHMMSS (or continues the
/// checkpoint's run folder), writes args.json, loads model, tokenizer and data, trains with logging.jsonl,
/// validation and checkpoints (written under a temporary name and renamed), and at the end saves the last
/// checkpoint and images/train_loss.svg. Resuming restores weights, optimizer, RNG and data position, so the
/// loss sequence equals an uninterrupted run's. Throws the errors of its parts; refuses a checkpoint made for
/// another model or an incompatible recipe with ConfigError.
TrainResult run_training(const TrainConfig& config, const TrainHooks& hooks = {});

/// The newest checkpoint under `output_dir` (highest step in the newest run folder that has one). Throws
/// IoError when there is none.
fs::path find_latest_checkpoint(const fs::path& output_dir);

}  // namespace swiftcpp
