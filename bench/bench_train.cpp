// swiftcpp training benchmark: LoRA or full fine-tuning steps through the real Trainer, float32 or bf16 autocast,
// padded or packed batches. Follows the measurement contract at the top of bench/baseline_train.py (the PyTorch
// eager baseline it is compared with) and writes the batches and LoRA init adapter that baseline reads.
//
//   build/bin/swiftcpp_bench_train --model bench/models/bench25m --mode lora --dtype float32 --batching packing
//       --batch 4 --seq 512 --warmup 3 --steps 10 --threads 2 --runs 3 --write-batches B.jsonl --write-init-adapter D
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/version.h>

#include "core/json.h"
#include "core/runtime.h"
#include "data/collate.h"
#include "nn/gemm.h"
#include "nn/kernels.h"
#include "peft/lora.h"
#include "quant/gptq.h"
#include "train/trainer.h"

using namespace swiftcpp;

namespace {

struct Options {
  std::string model = "bench/models/bench25m";
  std::string mode = "lora";
  std::string dtype = "float32";
  std::string batching = "padding";
  int64_t batch = 4;
  int64_t seq = 512;
  int64_t warmup = 3;
  int64_t steps = 10;
  int threads = 2;
  int64_t runs = 3;
  uint64_t data_seed = 0;
  double lr = 1e-4;
  int64_t lora_rank = 16;
  double lora_alpha = 32;
  std::string write_batches;
  std::string write_init_adapter;
  bool gradient_checkpointing = false;
  bool keep_attention_probs = false;
  int64_t small_head_dim = -1;  // -1: the library default
  std::string gemm = "auto";  // float32 products: auto (oneDNN where built), libtorch (at::mm, OpenBLAS)
  std::string profile;  // chrome trace of the first run's timed steps (LibTorch's legacy profiler)
  int64_t quant_bits = 0;  // QLoRA: the base's decoder linear layers packed (asymmetric RTN) before training
  int64_t quant_group_size = 64;
};

// Resets the kernel's resident-set high-water mark (VmHWM), so that the peak read later is the training steps'
// own, not the load's. Returns false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// VmHWM from /proc/self/status, in MiB (0 when unreadable).
double peak_rss_since_reset_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

struct SplitMix {
  uint64_t state;
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};

// Random samples: lengths uniform in [seq/8, seq], ids in [3, vocab), every next token trained.
std::vector<Sample> make_samples(size_t count, int64_t seq, int64_t vocab, uint64_t seed) {
  SplitMix rng{seed};
  std::vector<Sample> out(count);
  const int64_t lo = std::max<int64_t>(2, seq / 8);
  for (auto& s : out) {
    const int64_t len = lo + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(seq - lo + 1));
    for (int64_t t = 0; t < len; ++t) s.input_ids.push_back(3 + static_cast<int32_t>(rng.next() % (vocab - 3)));
    for (int64_t t = 0; t + 1 < len; ++t) s.labels.push_back(s.input_ids[t + 1]);
    s.labels.push_back(kIgnoreIndex);
  }
  return out;
}

std::vector<Batch> make_batches(const Options& o, int64_t vocab) {
  const int64_t n = o.warmup + o.steps;
  std::vector<Batch> batches;
  if (o.batching == "padding") {
    const auto samples = make_samples(static_cast<size_t>(n * o.batch), o.seq, vocab, o.data_seed);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<const Sample*> group;
      for (int64_t j = 0; j < o.batch; ++j) group.push_back(&samples[i * o.batch + j]);
      batches.push_back(collate_padded(group, 0));
    }
  } else {
    const auto samples = make_samples(static_cast<size_t>(3 * n * o.batch), o.seq, vocab, o.data_seed);
    std::vector<int64_t> lengths;
    for (const auto& s : samples) lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
    const auto rows = pack_best_fit_decreasing(lengths, o.seq);
    if (static_cast<int64_t>(rows.size()) < n * o.batch) throw std::runtime_error("not enough packed rows");
    for (int64_t i = 0; i < n; ++i) {
      std::vector<std::vector<const Sample*>> group;
      for (int64_t j = 0; j < o.batch; ++j) {
        group.emplace_back();
        for (size_t s : rows[i * o.batch + j]) group.back().push_back(&samples[s]);
      }
      batches.push_back(collate_packed(group, 0));
    }
  }
  return batches;
}

Json tensor_rows(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const at::Tensor c = t.to(at::kLong).contiguous();
  Json rows = Json::array();
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t* p = c[b].data_ptr<int64_t>();
    rows.push_back(std::vector<int64_t>(p, p + c.size(1)));
  }
  return rows;
}

void write_batches(const std::string& file, const std::vector<Batch>& batches) {
  std::ofstream out(file);
  for (const auto& b : batches) {
    Json j = {{"input_ids", tensor_rows(b.input_ids)}, {"labels", tensor_rows(b.labels)},
              {"position_ids", tensor_rows(b.position_ids)}, {"key_valid", tensor_rows(b.key_valid)},
              {"segment_ids", tensor_rows(b.segment_ids)}};
    out << j.dump() << "\n";
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The GEMM ceiling of the step's dtype with the product the step uses: nn::mm in float32 (oneDNN's sgemm where
// built), LibTorch's bfloat16 at::mm (oneDNN) for bf16 autocast.
double matmul_ceiling_gflops(bool bf16) {
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  const at::Tensor a = at::randn({1024, 1024}).to(dtype), b = at::randn({1024, 1024}).to(dtype);
  const auto product = [&] { return bf16 ? at::mm(a, b) : nn::mm(a, b); };
  for (int i = 0; i < 2; ++i) product();
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    product();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * 1024 * 1024 * 1024 / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"swiftcpp training benchmark (see bench/baseline_train.py for the contract)"};
  app.add_option("--model", o.model);
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"lora", "full"}));
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--batching", o.batching)->check(CLI::IsMember({"padding", "packing"}));
  app.add_option("--batch", o.batch);
  app.add_option("--seq", o.seq);
  app.add_option("--warmup", o.warmup);
  app.add_option("--steps", o.steps);
  app.add_option("--threads", o.threads);
  app.add_option("--runs", o.runs);
  app.add_option("--data-seed", o.data_seed);
  app.add_option("--lr", o.lr);
  app.add_option("--lora-rank", o.lora_rank);
  app.add_option("--lora-alpha", o.lora_alpha);
  app.add_option("--write-batches", o.write_batches);
  app.add_option("--write-init-adapter", o.write_init_adapter);
  app.add_flag("--gradient-checkpointing", o.gradient_checkpointing);
  app.add_option("--quant-bits", o.quant_bits, "QLoRA: pack the base to 4 or 8 bits (0: float base)")
      ->check(CLI::IsMember({0, 4, 8}));
  app.add_option("--quant-group-size", o.quant_group_size);
  app.add_option("--gemm", o.gemm, "float32 products: auto (oneDNN's sgemm where built) or libtorch (at::mm)")
      ->check(CLI::IsMember({"auto", "libtorch"}));
  app.add_option("--profile", o.profile,
                 "write a chrome://tracing file of the first run's timed steps (operator times; see bench/profile_ops.py)");
  app.add_flag("--keep-attention-probs", o.keep_attention_probs,
               "train with the attention kernel that keeps its probabilities for backward (default: recompute them)");
  app.add_option("--small-head-dim", o.small_head_dim,
                 "train heads of at most this dimension with the row kernels (0: none; default: the library's)");
  CLI11_PARSE(app, argc, argv);
  try {
    configure_threads(o.threads);
    if (o.small_head_dim >= 0) nn::set_small_head_dim(o.small_head_dim);
    configure_allocator();
    if (o.keep_attention_probs) nn::set_recompute_attention(false);
    if (o.gemm == "libtorch") kernels::set_fast_gemm(false);
    const double ceiling = matmul_ceiling_gflops(o.dtype == "bf16");
    CausalLM probe = load_causal_lm(o.model);
    const DecoderConfig mc = probe->config();  // a copy: the probe is released below
    const auto batches = make_batches(o, mc.vocab_size);
    if (!o.write_batches.empty()) write_batches(o.write_batches, batches);

    // The LoRA init adapter: A and B ~ N(0, 0.02) from the data seed, so the adapter acts from the first step.
    const std::string adapter_dir = o.write_init_adapter.empty() ? "/tmp/swiftcpp_bench_adapter" : o.write_init_adapter;
    LoraConfig lora;
    lora.r = o.lora_rank;
    lora.lora_alpha = o.lora_alpha;
    lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    // A mixture of experts (bench-moe): every linear layer but the routers, experts included.
    if (o.mode == "lora" && probe->config().moe.num_experts > 0) lora.target_modules = {"all-linear"};
    lora.base_model_name_or_path = o.model;
    int64_t n_mm = 0, n_lora = 0;
    for (const auto& item : probe->named_parameters(true)) {
      if (item.value().dim() == 2 && item.key() != "model.embed_tokens.weight") n_mm += item.value().numel();
    }
    if (mc.tie_word_embeddings) n_mm += probe->model->embed_tokens->weight.numel();
    if (o.mode == "lora") {
      inject_lora(probe, lora, o.data_seed);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(o.data_seed + 1);
      at::NoGradGuard no_grad;
      for (auto& t : adapter_tensors(probe, lora)) {
        t.tensor.normal_(0, 0.02, gen);
        n_lora += t.tensor.numel();
      }
      save_adapter(adapter_dir, probe, lora);
    }
    probe = nullptr;

    TrainConfig c;
    c.model = o.model;
    c.dataset = {"synthetic"};
    c.train_type = o.mode;
    if (o.mode == "lora") c.adapters = adapter_dir;
    c.learning_rate = o.lr;
    c.weight_decay = 0;
    c.max_grad_norm = 0;
    c.lr_scheduler_type = "constant";
    c.bf16 = o.dtype == "bf16";
    c.gradient_checkpointing = o.gradient_checkpointing;

    std::vector<double> run_tps, step_ms, run_gflops, train_rss;
    std::vector<double> first_losses;
    const int64_t n = o.warmup + o.steps;
    for (int64_t run = 0; run < o.runs; ++run) {
      CausalLM model = load_causal_lm(o.model);
      if (o.quant_bits != 0) {
        QuantSpec spec;
        spec.bits = o.quant_bits;
        spec.group_size = o.quant_group_size;
        spec.sym = false;
        attach_packed_weights(model, quantize_model_rtn(model, spec));
      }
      Trainer trainer(c, model);
      model = nullptr;
      const bool reset = reset_peak_rss();
      double tokens = 0, seconds = 0, flops = 0;
      for (int64_t i = 0; i < n; ++i) {
        const Batch& b = batches[i % batches.size()];
        std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
        if (!o.profile.empty() && run == 0 && i >= o.warmup) {
          profile = std::make_unique<torch::autograd::profiler::RecordProfile>(
              fmt::format("{}.step{}.json", o.profile, i - o.warmup));
        }
        const auto t0 = std::chrono::steady_clock::now();
        const StepResult r = trainer.step({b}, i, n);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (run == 0) first_losses.push_back(r.loss);
        std::cerr << fmt::format("run {} step {} loss {:.6f} {:.1f} ms\n", run, i, r.loss, dt * 1e3);
        if (i < o.warmup) continue;
        tokens += static_cast<double>(b.real_tokens);
        seconds += dt;
        step_ms.push_back(dt * 1e3);
        // Contract FLOPs: projections, LoRA, attention over the square of each row's valid tokens.
        const double ntok = static_cast<double>(b.real_tokens);
        double f = o.mode == "full" ? 6.0 * n_mm * ntok : 4.0 * n_mm * ntok + 6.0 * n_lora * ntok;
        const at::Tensor valid = b.key_valid.defined() ? b.key_valid.sum(1).to(at::kDouble)
                                                        : at::full({b.input_ids.size(0)}, static_cast<double>(b.input_ids.size(1)), at::kDouble);
        f += 12.0 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim * valid.square().sum().item<double>();
        flops += f;
      }
      if (reset) train_rss.push_back(peak_rss_since_reset_mib());
      run_tps.push_back(tokens / seconds);
      run_gflops.push_back(flops / seconds / 1e9);
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    Json out = {{"impl", "swiftcpp"},
                {"mode", o.mode},
                {"dtype", o.dtype},
                {"batching", o.batching},
                {"tokens_per_s", median(run_tps)},
                {"tokens_per_s_min", *std::min_element(run_tps.begin(), run_tps.end())},
                {"tokens_per_s_max", *std::max_element(run_tps.begin(), run_tps.end())},
                {"tokens_per_s_runs", run_tps},
                {"step_ms_median", median(step_ms)},
                {"losses", first_losses},
                {"peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0},
                {"train_peak_rss_mb", train_rss.empty() ? 0.0 : *std::max_element(train_rss.begin(), train_rss.end())},
                {"quant_bits", o.quant_bits},
                {"threads", o.threads},
                {"torch", TORCH_VERSION},
                {"blas", Json::array({loaded_blas()})},
                {"matmul_gflops", ceiling},
                {"achieved_gflops", median(run_gflops)},
                {"model", o.model},
                {"batch", o.batch},
                {"seq", o.seq},
                {"warmup", o.warmup},
                {"steps", o.steps},
                {"runs", o.runs},
                {"lr", o.lr},
                {"gradient_checkpointing", o.gradient_checkpointing},
                {"attention_probs", o.keep_attention_probs ? "kept" : "recomputed"},
                {"gemm", kernels::has_fast_gemm() ? "onednn" : "libtorch"},
                {"lora", o.mode == "lora" ? Json{{"r", lora.r}, {"lora_alpha", lora.lora_alpha}, {"use_rslora", false},
                                                 {"scale", lora.scale()}, {"target_modules", lora.target_modules}}
                                          : Json(nullptr)}};
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "swiftcpp_bench_train: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
