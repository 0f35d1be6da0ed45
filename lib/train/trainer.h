// The optimizer step (Trainer): the model being tuned, its trainable tensors, AdamW and the gradient reduction of
// several processes, with the parts an objective's step is made of (begin_step, backward, finish_step) and the
// token cross-entropy objective of supervised fine-tuning built from them. The job around it (run folder, data,
// logging, checkpoints, resume) is train/run.h; the preference objectives are train/rlhf.h.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/collate.h"
#include "distributed/comm.h"
#include "distributed/context_parallel.h"
#include "distributed/reducer.h"
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
  double compute_s = 0;  // this rank's forward and backward time, before the gradient reduction
  std::vector<double> rank_compute_s;  // [world] every rank's compute_s (several processes only)
  bool skipped = false;  // the loss or gradient norm was NaN/Inf and skip_nonfinite_loss dropped the step
  /// The objective's logged values of this step (token_acc; rewards/chosen, ...), averaged over a logging window.
  std::map<std::string, double> metrics;
  /// Values summed over a logging window instead (the scheduler's modelled_step_s and sharded_samples).
  std::map<std::string, double> window_sums;
};

/// This rank's shard of a sequence sharded over a context-parallel group: its tokens (position_ids from the
/// shard's offset, no padding) and the exchange of its K/V with the group's other shards.
struct ShardBatch {
  Batch batch;
  std::shared_ptr<dist::SequenceShard> shard;
};

/// The model being tuned, its trainable tensors and optimizer: one optimizer step over micro-batches.
class Trainer {
 public:
  /// Prepares `model` for `config`: LoRA/DoRA adapters (fresh from config.seed, or loaded from
  /// config.adapters / `adapter_dir` when given) with frozen base weights, or every weight trainable for full
  /// fine-tuning; AdamW over the trainable tensors. With `comm` (several processes, data parallel) each step's
  /// loss is normalised by the label tokens of every rank's micro-batches, gradients are summed across ranks in
  /// buckets, and with config.zero_stage 1 each rank keeps and updates the optimizer state of its share of the
  /// tensors only (ZeRO-1), then the updated tensors are broadcast from their owners. Every rank must call
  /// step() for every step, with or without micro-batches. Throws ConfigError / ModelError.
  Trainer(const TrainConfig& config, CausalLM model, const std::string& adapter_dir = "",
          std::shared_ptr<dist::Communicator> comm = nullptr);

  /// One optimizer step: forward and backward of every micro-batch (on the model's device; bf16 autocast when
  /// configured), then of every shard of a context-parallel sequence in order (each a collective of its CP group,
  /// run even when the shard has no label token), the loss normalised by the label tokens of all of them together
  /// (every rank's), clipping, AdamW with the scheduled rate of step `global_step` out of `total_steps`.
  /// When the step's loss or gradient norm is NaN or infinite the weights and the optimizer are left as they were:
  /// with config.skip_nonfinite_loss the gradients are dropped and the result says `skipped`, otherwise Error is
  /// thrown naming the step (global_step + 1, as the logs count).
  StepResult step(const std::vector<Batch>& micro_batches, int64_t global_step, int64_t total_steps,
                  const std::vector<ShardBatch>& shards = {});

  /// One optimizer step over a global batch in ChunkFlow chunks (config.chunk_keep graphs alive per split
  /// sample), normalised by the global batch's label tokens; otherwise as step().
  StepResult step(const ChunkedBatch& batch, int64_t global_step, int64_t total_steps);

  /// Sum of token cross-entropies and label-token count over `batches`, without gradients, in eval mode.
  std::pair<double, int64_t> evaluate(const std::vector<Batch>& batches);

  /// Seconds of one forward + backward of `batch` (loss summed, no optimizer update); the gradients it leaves are
  /// cleared. For measuring the device (train/schedule.h).
  double time_forward_backward(const Batch& batch);

  // The parts of an optimizer step, for objectives: begin_step, the objective's forwards with backward() of each
  // loss, then finish_step. Every rank calls all three for every step.

  /// Starts a step: the model in training mode, every trainable tensor's gradient cleared (with ZeRO-1 also those
  /// another rank updates), the compute clock started. `backwards`: how many backward() calls this rank makes in
  /// the step (the last one starts the overlapped gradient reduction of several processes; 0: reduced at the end).
  void begin_step(size_t backwards);
  /// Back-propagates `loss`, already scaled to its share of the step's objective.
  void backward(const at::Tensor& loss);
  /// Ends a step: waits for `sums` (this rank's device scalars, undefined counting 0), records the compute time,
  /// reduces the gradients, sums `sums` and r.real_tokens over every rank in one collective and passes the global
  /// sums to `finalize`, which sets r.loss (and r.metrics). Then clipping and AdamW with the scheduled rate of step
  /// `global_step` out of `total_steps` (a mixture of experts' load-balancing loss, part of r.loss, is also logged
  /// as r.metrics["aux_loss"]). When r.loss or the gradient norm is NaN or infinite the weights and the
  /// optimizer are left as they were: with config.skip_nonfinite_loss the gradients are dropped and r.skipped set,
  /// otherwise Error is thrown naming the step (global_step + 1, as the logs count).
  void finish_step(StepResult& r, const std::vector<at::Tensor>& sums,
                   const std::function<void(const std::vector<double>&)>& finalize, int64_t global_step,
                   int64_t total_steps);
  /// Data parallel: `local` summed over every rank (a collective; `local` itself in a single process).
  int64_t global_count(int64_t local) const;
  /// Whether forwards run under bf16 autocast (config.bf16); see train/autocast.h.
  bool autocast() const { return config_.bf16; }

  CausalLM& model() { return model_; }
  /// Every trainable tensor (with ZeRO-1 also those another rank updates).
  const std::vector<TrainableTensor>& trainables() const { return params_; }
  /// The optimizer state of every trainable tensor as AdamW::state() names it, and the step count. With ZeRO-1
  /// this is a collective: every rank must call it; each gets the whole state.
  std::pair<std::vector<std::pair<std::string, at::Tensor>>, int64_t> optimizer_state();
  /// Restores what optimizer_state() returned (from any world size); with ZeRO-1 each rank keeps its share.
  /// Throws FormatError naming `origin` as AdamW::load_state does.
  void load_optimizer_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps,
                            const std::string& origin);
  /// The process group (null in a single-process run).
  const std::shared_ptr<dist::Communicator>& comm() const { return comm_; }
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
  /// `image_features`, when given, are the batch's images already encoded ([N, F, D]).
  at::Tensor forward_loss(const Batch& batch, at::Tensor* correct, nn::ChunkKV* chunk = nullptr,
                          bool need_loss = true, const at::Tensor& image_features = {});
  /// Data parallel: gradients summed across ranks (the reducer's finish()).
  void reduce_gradients();
  /// ZeRO-1: every rank's updated tensors broadcast from their owners.
  void broadcast_updated();

  TrainConfig config_;
  CausalLM model_;
  LoraConfig lora_;
  std::vector<TrainableTensor> params_;
  std::unique_ptr<AdamW> optimizer_;
  std::shared_ptr<dist::Communicator> comm_;
  std::unique_ptr<dist::GradientReducer> reducer_;  // several processes: the overlapped gradient all-reduce
  std::chrono::steady_clock::time_point step_start_;  // when the current step's first forward began
  size_t backwards_ = 0, backwards_done_ = 0;          // the current step's backward() calls: planned, made
  at::Tensor aux_sum_;  // mixture of experts: the step's load-balancing losses, weighted by label tokens
  std::vector<int> owner_;  // ZeRO-1: the rank updating each of params_ (empty otherwise)
};

/// The adapter configuration a recipe asks for: config.adapters' adapter_config.json when set, else the lora_*
/// keys. Throws like read_adapter_config.
LoraConfig requested_lora(const TrainConfig& config);

}  // namespace swiftcpp
