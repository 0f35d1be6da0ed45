// The training job around an objective: run folder and args.json, model and tokenizer, exact resume, the step
// loop with logging.jsonl, validation, checkpoints (written under a temporary name and renamed) and the loss
// picture. What is trained on and how a step is computed is a TrainingTask: supervised fine-tuning
// (run_training, train/sft.cpp) and the preference methods (run_rlhf, train/rlhf.h) are tasks of the same job.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "infer/session.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/pipeline.h"
#include "train/trainer.h"

namespace swiftcpp {

class TextTokenizer;

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

/// How a job talks to its caller: progress and messages go to `out` (a live bar when `tty`), and the run stops
/// cleanly (finishing the step, saving a checkpoint) once `stop` becomes true.
struct TrainHooks {
  std::ostream* out = nullptr;
  bool tty = false;
  int columns = 0;  // terminal width for the bar (0: unknown)
  const std::atomic<bool>* stop = nullptr;
  std::vector<std::string> command_line;  // recorded in args.json
  dist::DistEnv dist_env;  // this process's place in a multi-process job (the default: the only process)
};

/// What a task is given when the job makes it: the resolved recipe, the loaded model and tokenizer (the task may
/// add modules to the model, such as a reward head, before the trainer takes it) and the job's processes.
struct JobContext {
  TrainConfig config;  // resolved: the chat template detected when the recipe left it empty
  at::Device device = at::kCPU;
  CausalLM model{nullptr};
  std::shared_ptr<const TextTokenizer> tokenizer;
  ModelAssets assets;  // tokenizer, chat template and image settings of config.model (the one front door)
  std::shared_ptr<dist::Communicator> comm;      // null in a single-process run
  std::shared_ptr<dist::Communicator> cp_group;  // this rank's context-parallel group (cp > 1)
  int rank = 0, world = 1;
  int cp = 1, data_ranks = 1, dp_rank = 0, cp_rank = 0;  // world = data_ranks x cp
  bool resuming = false;
  std::ostream* out = nullptr;  // rank 0's messages (a null stream on the others)
};

/// This rank's share of one step's global batch: a global batch is per_device_train_batch_size x
/// gradient_accumulation_steps items on each data-parallel rank, and rank r takes the r-th run of them.
struct StepSlice {
  const std::vector<size_t>* order = nullptr;  // the epoch's permutation of the task's items
  int64_t index = 0;                           // the step within its epoch
  size_t first = 0, last = 0;                  // this rank's items: (*order)[first..last)
  int64_t iteration = 0;                       // which of the task's steps_per_slice() steps over these items
  int64_t global_step = 0;                     // 0-based
  int64_t total_steps = 0;
};

/// What is trained on and how one step is computed: the data prepared for an objective, its batching, the step
/// (Trainer::begin_step / backward / finish_step around the objective's forwards) and validation.
class TrainingTask {
 public:
  virtual ~TrainingTask() = default;
  /// Items of one epoch (samples, packed rows, preference pairs, KTO examples).
  virtual size_t size() const = 0;
  /// What the log says of the data before training ("data: ..." lines, newline-terminated).
  virtual std::string describe() const = 0;
  /// What a resumed run must share with the checkpoint's run beyond the job's own keys.
  virtual void add_fingerprint(Json& fingerprint) const = 0;
  /// Called on every rank once the trainer exists and the run folder is known, before the first step.
  virtual void start(Trainer& trainer, const fs::path& run_dir, bool resumed) {
    (void)trainer;
    (void)run_dir;
    (void)resumed;
  }
  /// Items one rank's step takes (a global batch is this times the data-parallel ranks). The default is
  /// per_device_train_batch_size x gradient_accumulation_steps; GRPO takes prompts, each giving num_generations
  /// completions.
  virtual int64_t items_per_step() const { return -1; }
  /// Optimizer steps made over the same items, one after another (GRPO's num_iterations reuse one rollout batch);
  /// StepSlice::iteration counts them.
  virtual int64_t steps_per_slice() const { return 1; }
  /// Whether the run may be checkpointed (and so stopped) once `global_step` steps are done: a task that carries
  /// state from one step to the next (a rollout batch reused for several steps) says no in between, and a stop
  /// request then waits for the next step that may.
  virtual bool checkpointable(int64_t global_step) const {
    (void)global_step;
    return true;
  }
  /// One optimizer step over this rank's share of the global batch. Every rank calls it for every step.
  virtual StepResult step(Trainer& trainer, const StepSlice& slice) = 0;
  /// Validation over every rank's share, combined: "eval_loss" and the objective's values prefixed "eval_"
  /// (empty without validation data). Every rank calls it.
  virtual std::map<std::string, double> evaluate(Trainer& trainer) = 0;
  /// Full fine-tuning: called with a checkpoint's temporary folder once model.safetensors and the model's files
  /// are in it, before it is renamed into place (a reward model rewrites config.json for its head).
  virtual void complete_model_checkpoint(const fs::path& dir) const { (void)dir; }
  /// Metric names drawn beside the loss in images/train_loss.svg (training values, and eval_ ones when logged).
  virtual std::vector<std::string> plotted_metrics() const { return {}; }
};

using TaskFactory = std::function<std::unique_ptr<TrainingTask>(JobContext& job)>;

/// Loads what a task needs into `job` from job.config on job.device: the model (its decoder's linear layers packed
/// for QLoRA when quant_bits is set) and the tokenizer, and detects the chat template when the recipe left it empty.
/// Throws the loaders' errors.
void load_job(JobContext& job);

/// The supervised fine-tuning task (token cross-entropy) over job.config's data, prepared now. Throws ConfigError
/// when no training sample remains, and the data errors of prepare_data.
std::unique_ptr<TrainingTask> make_sft_task(JobContext& job);

/// The whole job: resolves `resume_from_checkpoint`, creates output_dir/vN-YYYYMMDD-HHMMSS (or continues the
/// checkpoint's run folder), loads model and tokenizer, makes the task (which prepares its data), writes args.json,
/// trains with logging.jsonl, validation and checkpoints, and at the end saves the last checkpoint and
/// images/train_loss.svg. Resuming restores weights, optimizer, RNG and data position, so the loss sequence
/// equals an uninterrupted run's. `kind` names the job in messages and the chart ("sft", "dpo", ...). Throws the
/// errors of its parts; refuses a checkpoint made for another model or an incompatible recipe with ConfigError.
TrainResult run_job(const TrainConfig& config, const TrainHooks& hooks, const TaskFactory& make_task,
                    const std::string& kind);

/// Supervised fine-tuning (token cross-entropy over samples, packed rows, ChunkFlow chunks or scheduled
/// micro-batches): run_job with the SFT task. Throws ConfigError for a recipe with rlhf_type set.
TrainResult run_training(const TrainConfig& config, const TrainHooks& hooks = {});

/// The newest checkpoint under `output_dir` (highest step in the newest run folder that has one). Throws
/// IoError when there is none.
fs::path find_latest_checkpoint(const fs::path& output_dir);

/// The data options of a recipe (files, split, shuffle, seed, strictness, system prompt, workers, cache).
DataOptions data_options(const TrainConfig& config);

/// The permutation of `n` items for an epoch: identity without shuffling, else Fisher-Yates from a generator
/// seeded by (seed, epoch), portable across standard libraries.
std::vector<size_t> epoch_order(size_t n, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace swiftcpp
