// Choosing ChunkFlow's (chunk_size, chunk_keep): a short grid of real training runs on the user's data with
// C x K fixed, recommending the fastest pair whose peak memory fits a limit.
#pragma once

#include <ostream>
#include <vector>

#include "train/config.h"

namespace swiftcpp {

struct ChunkTuneOptions {
  int64_t budget = 0;             // C x K in tokens; 0: the recipe's chunk_size x chunk_keep
  int64_t steps = 3;              // optimizer steps per candidate; the first is not timed
  double memory_limit_mib = 0;    // 0: no limit
  int64_t min_chunk_size = 64;
};

struct ChunkTuneResult {
  int64_t chunk_size = 0;
  int64_t chunk_keep = 0;
  double tokens_per_s = 0;     // median over the timed steps
  double peak_mib = 0;         // highest tensor-memory peak of any step
  bool fits = true;            // peak within the limit
};

/// The candidates for a budget: C = budget, budget/2, budget/4, ... down to min_chunk_size, K = budget / C.
std::vector<std::pair<int64_t, int64_t>> chunk_candidates(int64_t budget, int64_t min_chunk_size);

/// Trains `options.steps` steps of `config` with batching chunkflow for every candidate, through the trainer's
/// parts (load_job, the SFT task, Trainer) without a run folder, log or checkpoint: a fresh model and trainer per
/// candidate, the data tokenised once (a cache in a temporary folder under output_dir, removed afterwards, unless
/// the recipe sets data_cache_dir), no validation. Reports progress to `out`. Results in candidate order. Throws the
/// errors of load_job, make_sft_task and Trainer.
std::vector<ChunkTuneResult> tune_chunks(const TrainConfig& config, const ChunkTuneOptions& options, std::ostream& out);

/// The fastest result that fits; nullptr when none does.
const ChunkTuneResult* best_chunk_setting(const std::vector<ChunkTuneResult>& results);

}  // namespace swiftcpp
