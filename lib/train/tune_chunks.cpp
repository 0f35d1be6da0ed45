#include "train/tune_chunks.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "core/json.h"
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
  const fs::path work = fs::path(config.output_dir) / fmt::format(".tune-chunks-{}", getpid());
  std::vector<ChunkTuneResult> results;
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  for (const auto& [chunk_size, keep] : chunk_candidates(budget, options.min_chunk_size)) {
    TrainConfig c = config;
    c.batching = "chunkflow";
    c.packing = false;
    c.chunk_size = chunk_size;
    c.chunk_keep = keep;
    c.max_steps = options.steps;
    c.logging_steps = 1;
    c.save_steps = options.steps;
    c.eval_steps = options.steps + 1;
    c.save_total_limit = 1;
    c.save_only_model = true;
    c.val_dataset.clear();
    c.split_dataset_ratio = 0;
    c.resume_from_checkpoint.clear();
    c.output_dir = (work / fmt::format("c{}-k{}", chunk_size, keep)).string();
    if (c.data_cache_dir.empty()) c.data_cache_dir = (work / "data-cache").string();  // tokenise once
    out << fmt::format("tune-chunks: chunk_size {} x chunk_keep {} ({} steps)\n", chunk_size, keep, options.steps);
    TrainHooks hooks;
    const TrainResult r = run_training(c, hooks);
    ChunkTuneResult t;
    t.chunk_size = chunk_size;
    t.chunk_keep = keep;
    std::vector<double> tps;
    int64_t peak = 0;
    std::ifstream log(r.run_dir / "logging.jsonl");
    std::string line;
    while (std::getline(log, line)) {
      const Json j = parse_json(line, (r.run_dir / "logging.jsonl").string());
      if (!j.contains("loss")) continue;
      peak = std::max(peak, j.value("peak_memory_bytes", int64_t{0}));
      if (j.value("global_step", int64_t{0}) > 1) tps.push_back(j.value("tokens_per_s", 0.0));
    }
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
