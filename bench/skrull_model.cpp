// Modelled comparison of the Skrull schedulers (lib/distributed/skrull.h) at the scale of LONG_CONTEXT.md section 3:
// no training runs, only the cost model. Prints markdown tables.
//
//   g++ -std=c++17 -O2 -DFMT_HEADER_ONLY=1 -I lib -I . bench/skrull_model.cpp lib/distributed/skrull.cpp -o /tmp/skrull_model
//   /tmp/skrull_model [--profile FILE.json] [--batch-size 128] [--batches 20] [--seed 1]
//
// Settings: Qwen2.5-0.5B-like (h 896, 24 layers, 2 KV heads x 64) at DP 4 x CP 8, C = 26K tokens per rank;
// 7B-like (h 3584, 28 layers, 4 KV heads x 128) at DP 2 x CP 16, C = 13K (K = 1024 tokens). LM head left out of
// the FLOPs, as in the formula of LONG_CONTEXT.md. Each distribution: --batches global batches of --batch-size
// sequences from skrull::sample_lengths at full length (scale 1), seeds seed, seed+1, ...; the same batches for
// every scheduler. Device: paper_profile() (flops_per_s(t) = 400e12 * t / (t + 256) per call of t rows,
// 100 GB/s, 20 us per collective, bf16 K/V, one collective per layer and direction per micro-batch), or a measured
// DeviceProfile from --profile. "skrull, lookahead off" is the bare greedy objective (ScheduleOptions::lookahead).
// The last table per setting repeats the speed-ups with free communication and with costlier communication
// (25 GB/s, one collective per distributed sequence).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "distributed/skrull.h"

using namespace swiftcpp;
using namespace swiftcpp::skrull;

namespace {

struct Setting {
  const char* name;
  ModelShape shape;
  int64_t dp;
  int64_t cp;
  int64_t budget;
};

struct Row {
  double max_over_mean = 0;
  double step_s = 0;
  double micro_batches = 0;
  int64_t rollbacks = 0;
  int64_t chunked = 0;
  double plan_us = 0;
};

Row evaluate(const Setting& s, Scheduler sched, const CostModel& cost, const std::vector<std::vector<int64_t>>& batches,
             bool lookahead = true) {
  ScheduleOptions o;
  o.scheduler = sched;
  o.lookahead = lookahead;
  o.dp = s.dp;
  o.cp = s.cp;
  o.budget = s.budget;
  Row row;
  for (const auto& lengths : batches) {
    const auto t0 = std::chrono::steady_clock::now();
    const Plan plan = schedule(lengths, o, cost);
    const auto t1 = std::chrono::steady_clock::now();
    const ModelledStep step = model_step(plan, lengths, cost);
    row.max_over_mean += step.max_over_mean_compute();
    row.step_s += step.step_s;
    row.micro_batches += static_cast<double>(plan.stats.micro_batches);
    row.rollbacks += plan.stats.rollbacks;
    row.chunked += plan.stats.chunked;
    row.plan_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  const double k = static_cast<double>(batches.size());
  row.max_over_mean /= k;
  row.step_s /= k;
  row.micro_batches /= k;
  row.plan_us /= k;
  return row;
}

std::vector<std::vector<int64_t>> make_batches(Distribution d, int64_t batch_size, int64_t count, uint64_t seed) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0; b < count; ++b) out.push_back(sample_lengths(d, batch_size, seed + static_cast<uint64_t>(b), 1));
  return out;
}

void usage() {
  std::fprintf(stderr, "usage: skrull_model [--profile FILE.json] [--batch-size N] [--batches N] [--seed N]\n"
                       "       skrull_model --sample DISTRIBUTION [--scale S] [--batch-size N] [--batches N] [--seed N]\n"
                       "         (prints N x batches lengths, one per line: the workload of bench/run_skrull.sh)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string profile_path;
  int64_t batch_size = 128;
  int64_t batches = 20;
  uint64_t seed = 1;
  std::string sample;  // --sample: print lengths of this distribution instead of the tables
  int64_t scale = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--profile" || a == "--batch-size" || a == "--batches" || a == "--seed" || a == "--sample" ||
         a == "--scale") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--profile") profile_path = v;
      else if (a == "--sample") sample = v;
      else if (a == "--scale") scale = std::atoll(v.c_str());
      else if (a == "--batch-size") batch_size = std::atoll(v.c_str());
      else if (a == "--batches") batches = std::atoll(v.c_str());
      else seed = std::strtoull(v.c_str(), nullptr, 10);
    } else {
      usage();
      return 2;
    }
  }
  if (batch_size < 1 || batches < 1) {
    usage();
    return 2;
  }
  try {
    if (!sample.empty()) {
      const Distribution d = parse_distribution(sample);
      for (int64_t b = 0; b < batches; ++b) {
        for (int64_t len : sample_lengths(d, batch_size, seed + static_cast<uint64_t>(b), scale)) {
          std::printf("%lld\n", static_cast<long long>(len));
        }
      }
      return 0;
    }
    const DeviceProfile device = profile_path.empty() ? paper_profile() : DeviceProfile::load(profile_path);
    const std::vector<Setting> settings = {
        {"Qwen2.5-0.5B-like, DP 4 x CP 8, C = 26K", ModelShape{896, 2 * 64, 24, 0}, 4, 8, 26 * 1024},
        {"7B-like, DP 2 x CP 16, C = 13K", ModelShape{3584, 4 * 128, 28, 0}, 2, 16, 13 * 1024},
    };
    const Distribution dists[] = {Distribution::kWikipediaZh, Distribution::kLmsysChat1M,
                                  Distribution::kChatQA2LongSft};

    std::printf("# Skrull schedulers, modelled\n\n");
    std::printf("Device: %s (%s); curve points %zu, %.3g TFLOP/s at 64 tokens, %.3g at 1K, %.3g at 16K; "
                "%.3g GB/s, %.3g us per collective, %.3g bytes per K/V element.\n",
                device.name.empty() ? "unnamed" : device.name.c_str(), device.source.c_str(), device.efficiency.size(),
                device.flops_per_s(64) / 1e12, device.flops_per_s(1024) / 1e12, device.flops_per_s(16384) / 1e12,
                device.bandwidth_bytes_per_s / 1e9, device.collective_latency_s * 1e6, device.bytes_per_element);
    std::printf("Workload: %lld global batches of %lld sequences per distribution, full-length (unscaled), seeds "
                "%llu..%llu. Step time = max over DP ranks of the sum over micro-batches of max over CP ranks of "
                "max(comm, T_local) + T_dist; max/mean = slowest GPU's modelled compute over the mean GPU's.\n\n",
                static_cast<long long>(batches), static_cast<long long>(batch_size),
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed + batches - 1));

    struct Variant {
      const char* name;
      CostModel cost;
    };
    for (const auto& s : settings) {
      CostModel paper{s.shape, device, false};
      DeviceProfile costly_device = device;
      costly_device.bandwidth_bytes_per_s = 25e9;
      CostModel costly{s.shape, costly_device, true};
      DeviceProfile free_device = device;
      free_device.bandwidth_bytes_per_s = 1e300;
      free_device.collective_latency_s = 0;
      CostModel free{s.shape, free_device, false};

      std::printf("## %s\n\n", s.name);
      std::vector<std::string> summary;
      for (Distribution d : dists) {
        const auto lengths = make_batches(d, batch_size, batches, seed);
        std::printf("### %s\n\n", distribution_name(d));
        std::printf("| scheduler | max/mean compute | step (ms, mean) | speed-up vs round_robin | micro-batches per step "
                    "(all DP ranks, mean) | roll-backs (total) | plan (us, mean) |\n");
        std::printf("|---|---|---|---|---|---|---|\n");
        const Row rr = evaluate(s, Scheduler::kRoundRobin, paper, lengths);
        int64_t chunked = 0;
        auto print = [&](const std::string& name, const Row& r) {
          std::printf("| %s | %.2f | %.1f | %.2fx | %.1f | %lld | %.0f |\n", name.c_str(), r.max_over_mean,
                      r.step_s * 1e3, rr.step_s / r.step_s, r.micro_batches, static_cast<long long>(r.rollbacks),
                      r.plan_us);
        };
        for (Scheduler sched : all_schedulers()) {
          const Row r = sched == Scheduler::kRoundRobin ? rr : evaluate(s, sched, paper, lengths);
          chunked = r.chunked;
          print(scheduler_name(sched), r);
          if (sched == Scheduler::kSkrull) {
            print("skrull, lookahead off", evaluate(s, sched, paper, lengths, false));
          }
        }
        if (chunked > 0) {
          std::printf("\n%lld sequence(s) longer than CP x C were chunked (ChunkFlow pieces, one micro-batch each).\n",
                      static_cast<long long>(chunked));
        }
        std::printf("\n");
        // Communication sensitivity: skrull and skrull_paper against round_robin under three cost models.
        for (const Variant& v : {Variant{"zero communication", free}, Variant{"paper (100 GB/s, shared collective)", paper},
                                 Variant{"costly (25 GB/s, a collective per sequence)", costly}}) {
          const Row base = evaluate(s, Scheduler::kRoundRobin, v.cost, lengths);
          const Row sk = evaluate(s, Scheduler::kSkrull, v.cost, lengths);
          const Row greedy = evaluate(s, Scheduler::kSkrull, v.cost, lengths, false);
          const Row sp = evaluate(s, Scheduler::kSkrullPaper, v.cost, lengths);
          const Row fb = evaluate(s, Scheduler::kFlopsBalanced, v.cost, lengths);
          char line[512];
          std::snprintf(line, sizeof(line), "| %s | %s | %.2fx | %.2fx | %.2fx | %.2fx |", distribution_name(d),
                        v.name, base.step_s / sk.step_s, base.step_s / greedy.step_s, base.step_s / sp.step_s,
                        base.step_s / fb.step_s);
          summary.push_back(line);
        }
      }
      std::printf("### Speed-up vs round_robin under other communication costs (%s)\n\n", s.name);
      std::printf("| distribution | communication | skrull | skrull, lookahead off | skrull_paper | flops_balanced "
                  "|\n|---|---|---|---|---|---|\n");
      for (const auto& line : summary) std::printf("%s\n", line.c_str());
      std::printf("\n");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "skrull_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
