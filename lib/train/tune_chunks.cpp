#include "train/tune_chunks.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "core/runtime.h"
#include "train/run.h"

namespace swiftcpp {

std::vector<std::pair<int64_t, int64_t>> chunk_candidates(int64_t budget, int64_t min_chunk_size) {
  if (budget < 1) fail<ConfigError>("--tune-budget must be positive (got {})", budget);
  std::vector<std::pair<int64_t, int64_t>> out{{budget, 1}};
  for (int64_t keep = 2; budget / keep >= std::max<int64_t>(1, min_chunk_size); keep *= 2) out.emplace_back(budget / keep, keep);
  return out;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<ChunkTuneResult> tune_chunks(const TrainConfig& config, const ChunkTuneOptions& options, std::ostream& out) {
  const int64_t budget = options.budget > 0 ? options.budget : config.chunk_size * config.chunk_keep;
  if (options.steps < 2) fail<ConfigError>("--tune-steps must be at least 2 (the first step is not timed)");
  // The trainer's parts without the job around them: no run folder, log or checkpoint. The data are tokenised once
  // (a cache in a temporary folder unless the recipe names one); each candidate gets a fresh model, trainer and
  // ChunkFlow batching of the same samples.
  const fs::path work = fs::path(config.output_dir) / fmt::format(".tune-chunks-{}", getpid());
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  install_memory_tracking();
  std::vector<ChunkTuneResult> results;
  for (const auto& [chunk_size, keep] : chunk_candidates(budget, options.min_chunk_size)) {
    JobContext job;
    TrainConfig& c = job.config;
    c = config;
    c.batching = "chunkflow";
    c.packing = false;
    c.chunk_size = chunk_size;
    c.chunk_keep = keep;
    c.val_dataset.clear();
    c.split_dataset_ratio = 0;
    c.resume_from_checkpoint.clear();
    if (c.data_cache_dir.empty()) c.data_cache_dir = (work / "data-cache").string();  // tokenise once
    validate_train_config(c);
    job.device = parse_device(c.device);
    std::ostringstream quiet;
    job.out = &quiet;
    out << fmt::format("tune-chunks: chunk_size {} x chunk_keep {} ({} steps)\n", chunk_size, keep, options.steps);
    load_job(job);
    const std::unique_ptr<TrainingTask> task = make_sft_task(job);
    Trainer trainer(c, job.model);
    at::manual_seed(static_cast<uint64_t>(c.seed));
    const size_t items = task->size();
    const auto per_step = static_cast<size_t>(c.per_device_train_batch_size * c.gradient_accumulation_steps);
    const int64_t steps_per_epoch = std::max<int64_t>(1, static_cast<int64_t>((items + per_step - 1) / per_step));
    std::vector<double> tps;
    int64_t peak = 0;
    std::vector<size_t> order;
    int64_t cached_epoch = -1;
    for (int64_t step = 0; step < options.steps; ++step) {
      const int64_t epoch = step / steps_per_epoch;
      if (epoch != cached_epoch) {
        order = epoch_order(items, c.dataset_shuffle, static_cast<uint64_t>(c.seed), epoch);
        cached_epoch = epoch;
      }
      StepSlice slice;
      slice.order = &order;
      slice.index = step % steps_per_epoch;
      slice.first = std::min(items, static_cast<size_t>(slice.index) * per_step);
      slice.last = std::min(items, slice.first + per_step);
      slice.global_step = step;
      slice.total_steps = options.steps;
      reset_peak_memory(job.device);
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult r = task->step(trainer, slice);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      peak = std::max(peak, peak_memory_bytes(job.device));
      if (step > 0) tps.push_back(static_cast<double>(r.real_tokens) / std::max(1e-9, seconds));  // the first: warm-up
    }
    ChunkTuneResult t;
    t.chunk_size = chunk_size;
    t.chunk_keep = keep;
    t.tokens_per_s = median(tps);
    t.peak_mib = static_cast<double>(peak) / 1048576.0;
    t.fits = options.memory_limit_mib <= 0 || t.peak_mib <= options.memory_limit_mib;
    out << fmt::format("tune-chunks: chunk_size {} x chunk_keep {}: {:.1f} tokens/s, peak {:.1f} MiB{}\n", chunk_size,
                       keep, t.tokens_per_s, t.peak_mib, t.fits ? "" : " (over the limit)");
    results.push_back(t);
  }
  return results;
}

const ChunkTuneResult* best_chunk_setting(const std::vector<ChunkTuneResult>& results) {
  const ChunkTuneResult* best = nullptr;
  for (const auto& r : results) {
    if (r.fits && (best == nullptr || r.tokens_per_s > best->tokens_per_s)) best = &r;
  }
  return best;
}

}  // namespace swiftcpp
