#include "train/schedule.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "data/collate.h"
#include "train/trainer.h"

namespace swiftcpp {

skrull::ModelShape model_shape(const DecoderConfig& c) {
  skrull::ModelShape s;
  s.hidden = c.hidden_size;
  s.kv_hidden = c.num_key_value_heads * c.head_dim;
  s.layers = c.num_hidden_layers;
  s.vocab = c.vocab_size;
  return s;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One packed row of t tokens with every label trained (random ids from a fixed generator).
Batch probe_row(int64_t t, int64_t vocab) {
  Batch b;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  b.input_ids = at::randint(0, vocab, {1, t}, gen, at::TensorOptions().dtype(at::kLong));
  b.labels = b.input_ids.clone();
  b.position_ids = at::arange(t, at::kLong).unsqueeze(0);
  b.label_tokens = t;
  b.real_tokens = t;
  return b;
}

// Seconds of one collective, median over `repeats` after a warm-up; every rank measures the same collectives.
double time_all_gather(dist::Communicator& comm, int64_t elements, int repeats) {
  const at::Tensor x = at::zeros({elements}, at::kFloat);
  comm.all_gather(x);
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    comm.all_gather(x);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // The slowest rank's view: a collective ends when the last rank is done.
  std::vector<double> mine(static_cast<size_t>(comm.size()), 0.0);
  mine[static_cast<size_t>(comm.rank())] = median(s);
  const auto all = comm.all_reduce_sum(mine);
  return *std::max_element(all.begin(), all.end());
}

}  // namespace

skrull::DeviceProfile measure_device_profile(Trainer& trainer, dist::Communicator* comm, int64_t max_tokens,
                                             int repeats) {
  const DecoderConfig& config = trainer.model()->config();
  const skrull::ModelShape shape = model_shape(config);
  std::vector<int64_t> sizes;
  for (int64_t t = 16; t < max_tokens; t *= 2) sizes.push_back(t);
  sizes.push_back(std::max<int64_t>(1, max_tokens));
  skrull::DeviceProfile p;
  p.name = fmt::format("{} ({} layers, h {}), {}", config.model_type, config.num_hidden_layers, config.hidden_size,
                       trainer.model()->device().str());
  p.source = fmt::format("measured by swiftcpp train: forward+backward of one packed row, median of {}", repeats);
  std::vector<double> curve;  // flops_per_s per size, rank 0's
  if (comm == nullptr || comm->rank() == 0) {
    for (const int64_t t : sizes) {
      const Batch b = probe_row(t, config.vocab_size);
      trainer.time_forward_backward(b);  // warm-up
      std::vector<double> s;
      for (int i = 0; i < repeats; ++i) s.push_back(trainer.time_forward_backward(b));
      curve.push_back(skrull::training_flops(shape, t, t) / std::max(1e-9, median(s)));
    }
  }
  if (comm != nullptr) {
    std::vector<double> shared(sizes.size(), 0.0);
    if (comm->rank() == 0) shared = curve;
    curve = comm->all_reduce_sum(shared);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    // The curve must be strictly ascending in tokens; max_tokens may equal the last power of two.
    if (!p.efficiency.empty() && static_cast<double>(sizes[i]) <= p.efficiency.back().tokens) continue;
    p.efficiency.push_back({static_cast<double>(sizes[i]), curve[i]});
  }
  if (comm != nullptr && comm->size() > 1) {
    const double latency = time_all_gather(*comm, 1, 20);
    constexpr int64_t kElements = (1 << 20) / 4;
    const double seconds = time_all_gather(*comm, kElements, 5);
    p.collective_latency_s = latency;
    p.bandwidth_bytes_per_s =
        static_cast<double>(kElements * 4) * static_cast<double>(comm->size() - 1) / std::max(1e-9, seconds - latency);
  } else {
    p.collective_latency_s = 0;
    p.bandwidth_bytes_per_s = 1e12;
  }
  p.bytes_per_element = static_cast<double>(c10::elementSize(trainer.model()->dtype()));
  p.validate();
  return p;
}

skrull::Plan GlobalBatchScheduler::plan(const std::vector<int64_t>& lengths) const {
  return skrull::schedule(lengths, options, cost);
}

std::vector<GlobalBatchScheduler::Work> GlobalBatchScheduler::micro_batches_of(const skrull::Plan& plan, int dp_rank,
                                                                               int cp_rank) {
  if (dp_rank < 0 || static_cast<size_t>(dp_rank) >= plan.ranks.size() || cp_rank < 0 || cp_rank >= plan.cp) {
    fail("schedule: rank ({}, {}) outside the plan's {} x {} ranks", dp_rank, cp_rank, plan.ranks.size(), plan.cp);
  }
  if (plan.stats.chunked != 0 || plan.stats.truncated != 0) {
    fail("schedule: the plan cut {} samples; the trainer's budget must hold every sample",
         plan.stats.chunked + plan.stats.truncated);
  }
  std::vector<Work> out;
  for (const auto& mb : plan.ranks[static_cast<size_t>(dp_rank)].micro_batches) {
    Work w;
    for (int64_t id : mb.local.at(static_cast<size_t>(cp_rank))) {
      w.local.push_back(static_cast<size_t>(plan.items.at(static_cast<size_t>(id)).sequence));
    }
    for (int64_t id : mb.distributed) {  // a group of one rank holds a "sharded" sample whole
      (plan.cp == 1 ? w.local : w.sharded).push_back(static_cast<size_t>(plan.items.at(static_cast<size_t>(id)).sequence));
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace swiftcpp
