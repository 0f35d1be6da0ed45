// Supervised fine-tuning as a task of the training job: conversations encoded through the chat template, batched
// as padded rows, packed rows, ChunkFlow chunks or scheduled micro-batches (context-parallel shards included), and
// the token cross-entropy objective (Trainer::step).
#include <ATen/ATen.h>
#include <algorithm>
#include <map>

#include "core/error.h"
#include "data/pipeline.h"
#include "models/registry.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "train/run.h"
#include "train/schedule.h"

namespace swiftcpp {


namespace {

class SftTask : public TrainingTask {
 public:
  explicit SftTask(JobContext& job) : job_(job), config_(job.config) {
    const TrainConfig& config = config_;
    const auto tmpl = chat_template_for(*job.tokenizer, config.chat_template);
    EncodeOptions enc;
    enc.max_length = config.max_length;
    enc.truncation = parse_truncation_strategy(config.truncation_strategy);
    enc.loss_scale = parse_loss_scale(config.loss_scale);
    std::string image_fingerprint;
    if (const auto& mm = job.model->config().multimodal) {
      // Vision-language model: <image> placeholders become runs of image tokens, images preprocessed as the
      // checkpoint's preprocessor_config.json says.
      if (job.cp > 1) {
        fail<ConfigError>("context_parallel_size {} with a vision-language model: images cannot be sharded across "
                          "ranks; use data parallelism", job.cp);
      }
      enc.images = job.assets.images;  // the processor preprocessor_config.json chose (load_job)
      image_fingerprint = "|images=" + image_encoding_fingerprint(*enc.images);
      // ChunkFlow keeps each image's run of tokens in one chunk.
      image_layout_ = {static_cast<int32_t>(mm->image_token_index), mm->image_seq_length,
                       job.model->config().rope_scaling.mrope_section.empty() ? 0 : mm->spatial_merge_size};
    }
    SampleEncoder encoder(job.tokenizer, tmpl, enc);
    const std::string data_fingerprint =
        fmt::format("{}|template={}|max_length={}|trunc={}|loss={}{}", tokenizer_files_fingerprint(config.model),
                    config.chat_template, config.max_length, config.truncation_strategy, config.loss_scale,
                    image_fingerprint);
    tokenized_ = prepare_data(data_options(config), encoder, data_fingerprint);
    if (tokenized_.train.empty()) {
      fail<ConfigError>("no training samples: all {} rows of {} were skipped or longer than max_length {}",
                        tokenized_.stats.rows, fmt::join(config.dataset, ", "), config.max_length);
    }
    pad_id_ = job.tokenizer->specials().pad.value_or(0);

    // Items: samples, or packed rows of samples. ChunkFlow chunks each step's samples itself.
    const std::string batching = effective_batching(config);
    packing_ = batching == "packing";
    chunkflow_ = batching == "chunkflow";
    scheduled_ = config.scheduler != "none";  // items are samples; the scheduler forms the micro-batches
    if (packing_ && !scheduled_) {
      std::vector<int64_t> lengths;
      for (const auto& s : tokenized_.train) lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
      items_ = pack_best_fit_decreasing(lengths, config.max_length);
    } else {
      for (size_t i = 0; i < tokenized_.train.size(); ++i) items_.push_back({i});
    }
    // Validation batches, built once.
    for (size_t i = 0; i < tokenized_.validation.size(); i += config.per_device_eval_batch_size) {
      std::vector<const Sample*> group;
      for (size_t j = i; j < std::min(tokenized_.validation.size(), i + config.per_device_eval_batch_size); ++j) {
        group.push_back(&tokenized_.validation[j]);
      }
      val_batches_.push_back(collate_padded(group, pad_id_));
    }
  }

  size_t size() const override { return items_.size(); }

  std::string describe() const override {
    const TrainConfig& config = config_;
    std::string layout;
    if (packing_) layout = fmt::format(", packed into {} rows of <= {}", items_.size(), config.max_length);
    if (chunkflow_) {
      int64_t longest = 0;
      for (const auto& s : tokenized_.train) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.input_ids.size()));
      layout = fmt::format(", ChunkFlow chunks of {} tokens keeping {} (longest sample {} = {} chunks)", config.chunk_size,
                           config.chunk_keep, longest, (longest + config.chunk_size - 1) / config.chunk_size);
    }
    std::string text = fmt::format("data: {} train samples, {} validation, {} tokens ({} trained){}\n",
                                   tokenized_.train.size(), tokenized_.validation.size(), tokenized_.stats.tokens,
                                   tokenized_.stats.label_tokens, layout);
    // strict: false skips bad rows; say how many and why, so that nothing is dropped unseen.
    if (const std::string skipped = tokenized_.stats.skipped.summary(); !skipped.empty()) text += "data: " + skipped + "\n";
    return text;
  }

  void add_fingerprint(Json&) const override {}

  void start(Trainer& trainer, const fs::path& run_dir, bool resumed) override {
    if (!scheduled_) return;
    const TrainConfig& config = config_;
    std::ostream& out = *job_.out;
    const bool writer = job_.rank == 0;
    dist::Communicator* comm = job_.comm.get();
    const int world = job_.world, data_ranks = job_.data_ranks, cp = job_.cp;
    GlobalBatchScheduler& scheduler = scheduler_;
    // The scheduler's cost model: the model's shape and a device profile, read from skrull_profile or measured
    // here (every rank takes part; rank 0's numbers are used by all) and saved as the run's device_profile.json.
    scheduler.options.scheduler = skrull::parse_scheduler(config.scheduler);
    scheduler.options.dp = data_ranks;
    scheduler.options.cp = cp;
    scheduler.options.budget = config.skrull_budget > 0 ? config.skrull_budget : config.max_length;
    scheduler.cost.shape = model_shape(trainer.model()->config());
    const fs::path stored = run_dir / "device_profile.json";
    if (!config.skrull_profile.empty()) {
      scheduler.cost.device = skrull::DeviceProfile::load(config.skrull_profile);
    } else if (resumed && fs::exists(stored)) {  // a resumed run plans as the run it continues
      scheduler.cost.device = skrull::DeviceProfile::load(stored.string());
    } else {
      out << "measuring the device for the scheduler's cost model...\n";
      // The probes must not move the random stream (dropout) the training continues with.
      auto generator = at::detail::getDefaultCPUGenerator();
      const at::Tensor rng = generator.get_state();
      scheduler.cost.device = measure_device_profile(trainer, comm, scheduler.options.budget);
      generator.set_state(rng);
    }
    scheduler.cost.validate();
    if (writer) write_file_atomic(stored, scheduler.cost.device.to_json().dump(2) + "\n");
    out << fmt::format("scheduler {}: {} process{} ({} data-parallel x {} context-parallel), {} tokens per "
                       "micro-batch, device profile {}\n", config.scheduler, world, world > 1 ? "es" : "", data_ranks, cp,
                       scheduler.options.budget,
                       config.skrull_profile.empty() ? stored.string() : config.skrull_profile);
  }

  StepResult step(Trainer& trainer, const StepSlice& slice) override {
    const TrainConfig& config = config_;
    const std::vector<size_t>& order = *slice.order;
    const int64_t bs = config.per_device_train_batch_size, ga = config.gradient_accumulation_steps;
    const int data_ranks = job_.data_ranks;
    const auto& items = items_;
    const auto& tokenized = tokenized_;
    const int32_t pad_id = pad_id_;
    std::vector<Batch> micro;
    std::vector<ShardBatch> shards;
    ChunkedBatch chunked;
    double modelled_s = 0;
    int64_t sharded = 0;
    if (scheduled_) {  // the whole global batch's samples, placed by the scheduler; this rank's micro-batches packed
      const int64_t k = slice.index;
      const size_t g0 = std::min(items.size(), static_cast<size_t>(k * data_ranks * bs * ga));
      const size_t g1 = std::min(items.size(), g0 + static_cast<size_t>(data_ranks * bs * ga));
      std::vector<int64_t> lengths;
      for (size_t j = g0; j < g1; ++j) {
        lengths.push_back(static_cast<int64_t>(tokenized.train[items[order[j]][0]].input_ids.size()));
      }
      const skrull::Plan plan = scheduler_.plan(lengths);
      modelled_s = skrull::model_step(plan, lengths, scheduler_.cost).step_s;
      if (job_.cp > 1) sharded = plan.stats.distributed;  // a group of one holds "distributed" samples whole
      for (const auto& mb : GlobalBatchScheduler::micro_batches_of(plan, job_.dp_rank, job_.cp_rank)) {
        std::vector<const Sample*> row;
        for (size_t pos : mb.local) row.push_back(&tokenized.train[items[order[g0 + pos]][0]]);
        if (!row.empty()) micro.push_back(collate_packed({row}, pad_id));
        for (size_t pos : mb.sharded) {  // this CP rank's shard of the sequence
          const Sample& whole = tokenized.train[items[order[g0 + pos]][0]];
          ShardBatch sb;
          sb.shard = std::make_shared<dist::SequenceShard>(job_.cp_group, static_cast<int64_t>(whole.input_ids.size()));
          Sample part;
          const auto from = static_cast<std::ptrdiff_t>(sb.shard->offset());
          const auto to = from + static_cast<std::ptrdiff_t>(sb.shard->size());
          part.input_ids.assign(whole.input_ids.begin() + from, whole.input_ids.begin() + to);
          part.labels.assign(whole.labels.begin() + from, whole.labels.begin() + to);  // labels are already shifted
          sb.batch = collate_packed({{&part}}, pad_id);
          sb.batch.position_ids = sb.batch.position_ids + sb.shard->offset();
          sb.batch.segment_ids = at::Tensor();
          sb.batch.key_valid = at::Tensor();
          shards.push_back(std::move(sb));
        }
      }
    }
    const size_t first = slice.first, last = slice.last;
    if (chunkflow_) {  // the whole global batch, re-cut into chunks
      std::vector<const Sample*> group;
      for (size_t j = first; j < last; ++j) group.push_back(&tokenized.train[items[order[j]][0]]);
      chunked = build_chunked_batch(group, config.chunk_size, pad_id, image_layout_);
    }
    for (size_t i = first; i < last && !chunkflow_ && !scheduled_; i += bs) {
      const size_t end = std::min(last, i + static_cast<size_t>(bs));
      if (packing_) {
        std::vector<std::vector<const Sample*>> rows;
        for (size_t j = i; j < end; ++j) {
          rows.emplace_back();
          for (size_t s : items[order[j]]) rows.back().push_back(&tokenized.train[s]);
        }
        micro.push_back(collate_packed(rows, pad_id));
      } else {
        std::vector<const Sample*> group;
        for (size_t j = i; j < end; ++j) group.push_back(&tokenized.train[items[order[j]][0]]);
        micro.push_back(collate_padded(group, pad_id));
      }
    }
    StepResult r = chunkflow_ ? trainer.step(chunked, slice.global_step, slice.total_steps)
                              : trainer.step(micro, slice.global_step, slice.total_steps, shards);
    if (scheduled_) {
      r.window_sums["modelled_step_s"] = modelled_s;
      r.window_sums["sharded_samples"] = static_cast<double>(sharded);
    }
    return r;
  }

  std::map<std::string, double> evaluate(Trainer& trainer) override {
    if (val_batches_.empty()) return {};
    // Each rank scores every world-th batch; the sums are combined.
    std::vector<Batch> mine;
    for (size_t i = static_cast<size_t>(job_.rank); i < val_batches_.size(); i += static_cast<size_t>(job_.world)) {
      mine.push_back(val_batches_[i]);
    }
    auto [sum, tokens] = trainer.evaluate(mine);
    if (job_.comm) {
      const auto sums = job_.comm->all_reduce_sum(std::vector<double>{sum, static_cast<double>(tokens)});
      sum = sums[0];
      tokens = static_cast<int64_t>(sums[1]);
    }
    return {{"eval_loss", sum / static_cast<double>(std::max<int64_t>(1, tokens))},
            {"eval_tokens", static_cast<double>(tokens)}};
  }

 private:
  JobContext& job_;
  const TrainConfig config_;
  TokenizedData tokenized_;
  int32_t pad_id_ = 0;
  ImageTokenLayout image_layout_;
  bool packing_ = false, chunkflow_ = false, scheduled_ = false;
  std::vector<std::vector<size_t>> items_;
  std::vector<Batch> val_batches_;
  GlobalBatchScheduler scheduler_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_sft_task(JobContext& job) { return std::make_unique<SftTask>(job); }

TrainResult run_training(const TrainConfig& config, const TrainHooks& hooks) {
  if (!config.rlhf_type.empty()) {
    fail<ConfigError>("rlhf_type {}: preference training runs with 'swiftcpp rlhf' (train is supervised fine-tuning)",
                      config.rlhf_type);
  }
  return run_job(config, hooks, make_sft_task, "sft");
}

}  // namespace swiftcpp
