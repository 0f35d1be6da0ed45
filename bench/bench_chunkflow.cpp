// swiftcpp ChunkFlow benchmark: peak memory against the longest sequence, and tokens/s of padding, packing and
// ChunkFlow on a synthetic long-tail workload, all through the real Trainer (LoRA on all linear layers, AdamW),
// side by side in one process.
//
//   build/bin/swiftcpp_bench_chunkflow memory --model bench/models/bench25m --chunk-size 256 --keep 1
//   build/bin/swiftcpp_bench_chunkflow throughput --model bench/models/bench25m --mix lmsys --scale 16
//
// Workload (`throughput`): ../shared/docs/LONG_CONTEXT.md's length distributions. A bucket is drawn with the
// published probabilities, then a length log-uniformly inside it; the first bucket starts at 64 tokens. Lengths are
// divided by --scale and capped at --max-length so a CPU can run them. Every mode trains on the same global
// batches (--global-batch sequences per optimizer step): padding in micro-batches of --micro-batch samples,
// packing into rows of --max-length (best fit decreasing, one row per micro-batch), ChunkFlow with (C, K).
// Peak memory is tensor memory through the counting CPU allocator (lib/core/memory.h), reset before each step.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include "core/json.h"
#include "core/memory.h"
#include "core/plot.h"
#include "core/runtime.h"
#include "models/registry.h"
#include "data/collate.h"
#include "train/chunkflow.h"
#include "train/trainer.h"

using namespace swiftcpp;

namespace {

struct Mix {
  std::vector<double> cumulative;  // share of sequences below each bound
  std::vector<double> bounds;      // upper bounds in tokens (unscaled)
};

// Cumulative shares from the Skrull paper's table (LONG_CONTEXT.md); the last bound is the longest sequence.
const Mix& mix_named(const std::string& name) {
  static const Mix wikipedia{{0.8788, 0.9934, 0.9992, 0.9999, 1.0}, {1024, 4096, 8192, 32768, 78000}};
  static const Mix lmsys{{0.8712, 0.9935, 0.9987, 0.9998, 0.9999, 1.0}, {1024, 4096, 8192, 32768, 131072, 1643000}};
  static const Mix chatqa2{{0.2192, 0.3148, 0.4043, 0.9986, 1.0}, {1024, 4096, 8192, 32768, 99000}};
  if (name == "wikipedia") return wikipedia;
  if (name == "lmsys") return lmsys;
  if (name == "chatqa2") return chatqa2;
  throw std::runtime_error("unknown mix " + name);
}

std::vector<int64_t> draw_lengths(const Mix& mix, size_t n, double scale, int64_t max_length, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i) {
    const double p = u(rng);
    size_t b = 0;
    while (b + 1 < mix.cumulative.size() && p >= mix.cumulative[b]) ++b;
    const double lo = b == 0 ? 64.0 : mix.bounds[b - 1], hi = mix.bounds[b];
    const double len = std::exp(std::log(lo) + u(rng) * (std::log(hi) - std::log(lo))) / scale;
    out.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::llround(len)), 2, max_length));
  }
  return out;
}

std::vector<Sample> make_samples(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Sample> out(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int64_t t = 0; t < lengths[i]; ++t) out[i].input_ids.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    for (int64_t t = 0; t + 1 < lengths[i]; ++t) out[i].labels.push_back(out[i].input_ids[t + 1]);
    out[i].labels.push_back(kIgnoreIndex);
  }
  return out;
}

TrainConfig lora_config(const std::string& model, int64_t chunk_size, int64_t keep) {
  TrainConfig c;
  c.model = model;
  c.dataset = {"synthetic"};
  c.train_type = "lora";
  c.lora_rank = 16;
  c.lora_alpha = 32;
  c.lora_dropout = 0;
  c.target_modules = {"all-linear"};
  c.learning_rate = 1e-4;
  c.lr_scheduler_type = "constant";
  c.chunk_size = chunk_size;
  c.chunk_keep = keep;
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One optimizer step of `mode` over the global batch `group`; returns (seconds, peak bytes, forwards).
struct StepMeasure {
  double seconds = 0;
  int64_t peak = 0;
  int64_t forwards = 0;
  int64_t tokens = 0;
  double loss = 0;
};

StepMeasure run_step(Trainer& trainer, const std::string& mode, const std::vector<const Sample*>& group,
                     int64_t micro_batch, int64_t max_length, int64_t chunk_size, int64_t step, int64_t total) {
  const at::Device cpu(at::kCPU);
  StepMeasure m;
  StepResult r;
  if (mode == "chunkflow") {
    const ChunkedBatch batch = build_chunked_batch(group, chunk_size, 0);
    reset_peak_memory(cpu);
    const auto t0 = std::chrono::steady_clock::now();
    r = trainer.step(batch, step, total);
    m.seconds = seconds_since(t0);
  } else {
    std::vector<Batch> micro;
    if (mode == "padding") {
      for (size_t i = 0; i < group.size(); i += static_cast<size_t>(micro_batch)) {
        std::vector<const Sample*> part(group.begin() + static_cast<std::ptrdiff_t>(i),
                                        group.begin() + static_cast<std::ptrdiff_t>(std::min(group.size(), i + micro_batch)));
        micro.push_back(collate_padded(part, 0));
      }
    } else {
      std::vector<int64_t> lengths;
      for (const Sample* s : group) lengths.push_back(static_cast<int64_t>(s->input_ids.size()));
      for (const auto& row : pack_best_fit_decreasing(lengths, max_length)) {
        std::vector<const Sample*> samples;
        for (size_t k : row) samples.push_back(group[k]);
        micro.push_back(collate_packed({samples}, 0));
      }
    }
    reset_peak_memory(cpu);
    const auto t0 = std::chrono::steady_clock::now();
    r = trainer.step(micro, step, total);
    m.seconds = seconds_since(t0);
  }
  m.peak = peak_memory_bytes(cpu);
  m.forwards = r.forwards;
  m.tokens = r.real_tokens;
  m.loss = r.loss;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swiftcpp ChunkFlow benchmark"};
  std::string model = "bench/models/bench25m";
  int threads = 2;
  app.add_option("--model", model);
  app.add_option("--threads", threads);
  app.require_subcommand(1);

  auto* memory = app.add_subcommand("memory", "peak memory of one long sequence: unchunked vs ChunkFlow");
  int64_t chunk_size = 256, keep = 1;
  std::vector<int64_t> multiples = {2, 4, 8, 16};
  memory->add_option("--chunk-size", chunk_size);
  memory->add_option("--keep", keep);
  memory->add_option("--multiples", multiples, "sequence lengths as multiples of the chunk size");
  std::string plot;
  memory->add_option("--plot", plot, "write an SVG chart of peak memory against sequence length here");

  auto* throughput = app.add_subcommand("throughput", "tokens/s of padding, packing and ChunkFlow on a long-tail mix");
  std::string mix = "lmsys";
  double scale = 16;
  int64_t max_length = 4096, global_batch = 128, micro_batch = 4, warmup = 1, steps = 3, tp_chunk = 512, tp_keep = 1;
  uint64_t seed = 0;
  std::vector<std::string> modes = {"padding", "packing", "chunkflow"};
  throughput->add_option("--mix", mix)->check(CLI::IsMember({"wikipedia", "lmsys", "chatqa2"}));
  throughput->add_option("--scale", scale);
  throughput->add_option("--max-length", max_length);
  throughput->add_option("--global-batch", global_batch);
  throughput->add_option("--micro-batch", micro_batch);
  throughput->add_option("--warmup", warmup);
  throughput->add_option("--steps", steps);
  throughput->add_option("--chunk-size", tp_chunk);
  throughput->add_option("--keep", tp_keep);
  throughput->add_option("--seed", seed);
  throughput->add_option("--modes", modes);
  CLI11_PARSE(app, argc, argv);

  try {
    configure_threads(threads);
    configure_allocator();
    install_memory_tracking();
    const DecoderConfig mc = load_decoder_config(model);
    const int64_t kv_dim = mc.num_key_value_heads * mc.head_dim;
    Json out = Json::object();
    out["model"] = model;
    out["threads"] = threads;
    out["blas"] = loaded_blas();

    if (*memory) {
      Json rows = Json::array();
      for (int64_t m : multiples) {
        const int64_t L = m * chunk_size;
        const auto samples = make_samples({L}, mc.vocab_size, 7);
        const std::vector<const Sample*> group{&samples[0]};
        Json row = {{"length", L}, {"chunks", m}};
        // K/V store of the earlier chunks (keys and values, float32) and their gradients.
        row["kv_store_bytes"] = 4 * mc.num_hidden_layers * (L - chunk_size) * kv_dim * 4;
        for (const std::string mode : {"padding", "chunkflow"}) {
          Trainer trainer(lora_config(model, chunk_size, keep), load_causal_lm(model));
          // Step 0 allocates the optimizer state; the measured step is the second.
          run_step(trainer, mode, group, 1, L, chunk_size, 0, 2);
          const StepMeasure s = run_step(trainer, mode, group, 1, L, chunk_size, 1, 2);
          const std::string key = mode == "padding" ? "unchunked" : "chunkflow";
          row[key + "_peak_bytes"] = s.peak;
          row[key + "_seconds"] = s.seconds;
          row[key + "_forwards"] = s.forwards;
          row[key + "_loss"] = s.loss;
          std::cerr << fmt::format("L={} {}: peak {:.1f} MiB, {:.2f} s, {} forwards\n", L, key, s.peak / 1048576.0,
                                   s.seconds, s.forwards);
        }
        rows.push_back(row);
      }
      if (!plot.empty()) {
        Series unchunked{"unchunked", {}, {}, ""}, chunkflow{fmt::format("ChunkFlow C={} K={}", chunk_size, keep), {}, {}, ""},
            store{"ChunkFlow K/V store (with gradients)", {}, {}, ""};
        for (const auto& row : rows) {
          const double L = row["length"].get<double>();
          unchunked.x.push_back(L);
          unchunked.y.push_back(row["unchunked_peak_bytes"].get<double>() / 1048576.0);
          chunkflow.x.push_back(L);
          chunkflow.y.push_back(row["chunkflow_peak_bytes"].get<double>() / 1048576.0);
          store.x.push_back(L);
          store.y.push_back(row["kv_store_bytes"].get<double>() / 1048576.0);
        }
        ChartOptions chart;
        chart.title = fmt::format("Peak tensor memory of one LoRA step, {} ({} layers)", fs::path(model).filename().string(),
                                  mc.num_hidden_layers);
        chart.x_label = "sequence length (tokens)";
        chart.y_label = "peak tensor memory (MiB)";
        write_file_atomic(plot, line_chart_svg({unchunked, chunkflow, store}, chart));
      }
      out["benchmark"] = "memory";
      out["chunk_size"] = chunk_size;
      out["keep"] = keep;
      out["rows"] = rows;
    } else {
      const auto lengths = draw_lengths(mix_named(mix), static_cast<size_t>(global_batch * (warmup + steps)), scale,
                                        max_length, seed);
      const auto samples = make_samples(lengths, mc.vocab_size, seed + 1);
      Json results = Json::array();
      for (const auto& mode : modes) {
        Trainer trainer(lora_config(model, tp_chunk, tp_keep), load_causal_lm(model));
        std::vector<double> tps;
        double tokens = 0, seconds = 0;
        int64_t peak = 0, forwards = 0;
        for (int64_t step = 0; step < warmup + steps; ++step) {
          std::vector<const Sample*> group;
          for (int64_t j = 0; j < global_batch; ++j) group.push_back(&samples[static_cast<size_t>(step * global_batch + j)]);
          const StepMeasure s = run_step(trainer, mode, group, micro_batch, max_length, tp_chunk, step, warmup + steps);
          std::cerr << fmt::format("{} step {}: {} tokens, {:.2f} s, {:.1f} tokens/s, peak {:.1f} MiB, loss {:.5f}\n",
                                   mode, step, s.tokens, s.seconds, s.tokens / s.seconds, s.peak / 1048576.0, s.loss);
          if (step < warmup) continue;
          tokens += static_cast<double>(s.tokens);
          seconds += s.seconds;
          tps.push_back(static_cast<double>(s.tokens) / s.seconds);
          peak = std::max(peak, s.peak);
          forwards += s.forwards;
        }
        results.push_back({{"mode", mode}, {"tokens_per_s", tokens / seconds}, {"step_tokens_per_s", tps},
                           {"peak_bytes", peak}, {"forwards", forwards}, {"tokens", tokens}, {"seconds", seconds}});
      }
      int64_t longest = 0;
      double total = 0;
      for (int64_t l : lengths) {
        longest = std::max(longest, l);
        total += static_cast<double>(l);
      }
      out["benchmark"] = "throughput";
      out["mix"] = mix;
      out["scale"] = scale;
      out["max_length"] = max_length;
      out["global_batch"] = global_batch;
      out["micro_batch"] = micro_batch;
      out["chunk_size"] = tp_chunk;
      out["keep"] = tp_keep;
      out["warmup"] = warmup;
      out["steps"] = steps;
      out["mean_length"] = total / static_cast<double>(lengths.size());
      out["longest"] = longest;
      out["results"] = results;
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    out["peak_rss_mb"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "swiftcpp_bench_chunkflow: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
