// Inference benchmark: prefill and greedy decode tokens/s and peak RSS, printed as one JSON line so
// bench/run.sh puts it beside llama.cpp's llama-bench and bench/run_pytorch.sh beside eager PyTorch.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <sys/resource.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "core/json.h"
#include "core/runtime.h"
#include "infer/sampling.h"
#include "models/decoder/decoder.h"
#include "nn/attention.h"
#include "nn/kernels.h"
#include "quant/gguf_model.h"

using namespace swiftcpp;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The benchmark prompt shared with bench/baseline_infer.py: splitmix64 seeded with 1234,
// prompt[i] = 3 + next() % (vocab_size - 3).
std::vector<int64_t> benchmark_prompt(int64_t n, int64_t vocab_size) {
  uint64_t state = 1234;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    ids.push_back(3 + static_cast<int64_t>(z % static_cast<uint64_t>(vocab_size - 3)));
  }
  return ids;
}

Json stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {{"median", v[v.size() / 2]}, {"min", v.front()}, {"max", v.back()}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swiftcpp inference benchmark"};
  std::string model_dir, prompt_ids_file, device = "cpu", dtype = "float32", attention = "auto";
  int64_t prompt_len = 128, new_tokens = 128;
  int threads = 2, runs = 3;
  int64_t batch = 1;
  app.add_option("--model", model_dir, "model folder")->required();
  app.add_option("--prompt-len", prompt_len, "prompt tokens");
  app.add_option("--new-tokens", new_tokens, "generated tokens (the first comes from the prefill)");
  app.add_option("--prompt-ids", prompt_ids_file, "JSON file with the prompt ids (shared with the baseline)");
  app.add_option("--threads", threads, "CPU threads");
  app.add_option("--runs", runs, "timed runs after one warm-up");
  app.add_option("--batch", batch, "sequences decoded together (row b's prompt is the prompt rotated by b tokens)")
      ->check(CLI::Range(1, 256));
  app.add_option("--device", device, "cpu or cuda");
  app.add_option("--dtype", dtype, "float32, bfloat16 or float16");
  app.add_option("--attention", attention, "auto, math or sdpa");
  CLI11_PARSE(app, argc, argv);
  try {
    configure_threads(threads);
    configure_allocator();
    if (attention == "math") nn::set_attention_backend(nn::AttentionBackend::kMath);
    if (attention == "sdpa") nn::set_attention_backend(nn::AttentionBackend::kSdpa);
    LoadOptions load{parse_device(device), parse_dtype(dtype)};
    load.quantized_kernels = true;  // as infer loads it
    CausalLM model = fs::is_regular_file(model_dir) ? load_gguf_model(model_dir, load) : load_causal_lm(model_dir, load);
    std::vector<int64_t> prompt;
    if (!prompt_ids_file.empty()) {
      prompt = load_json_file(prompt_ids_file).get<std::vector<int64_t>>();
    } else {
      prompt = benchmark_prompt(prompt_len, model->config().vocab_size);
    }
    prompt_len = static_cast<int64_t>(prompt.size());
    SamplingParams greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy);
    c10::InferenceMode guard;
    std::vector<int64_t> rows;  // [batch, prompt_len], row b rotated by b
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < prompt_len; ++i) rows.push_back(prompt[static_cast<size_t>((i + b) % prompt_len)]);
    }
    const at::Tensor input = at::tensor(rows, at::kLong).view({batch, prompt_len}).to(load.device);
    std::vector<double> prefill_rates, decode_rates;
    std::vector<int64_t> generated;
    nn::KVCache cache = model->make_cache(batch, prompt_len + new_tokens);  // allocated once, reused by every run
    for (int r = 0; r < runs + 1; ++r) {
      std::vector<int64_t> ids;
      cache.length = 0;
      ForwardOptions options;
      options.cache = &cache;
      options.last_token_only = true;
      // Prefill: the prompt's forward and the first new token.
      const double t0 = now();
      at::Tensor next = sampler.sample(model->forward(input, options).select(1, 0), {});  // [batch]
      ids.push_back(next[0].item<int64_t>());
      const double t1 = now();
      // Decode: new_tokens - 1 single-token steps, each ending with the host knowing the token.
      for (int64_t i = 1; i < new_tokens; ++i) {
        next = sampler.sample(model->forward(next.view({batch, 1}).to(load.device), options).select(1, 0), {});
        ids.push_back(next[0].item<int64_t>());
      }
      const double t2 = now();
      if (r == 0) continue;  // warm-up
      if (r == 1) generated = ids;
      prefill_rates.push_back(static_cast<double>(batch * prompt_len) / (t1 - t0));
      decode_rates.push_back(static_cast<double>(batch * (new_tokens - 1)) / (t2 - t1));
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    Json out = {{"impl", "swiftcpp"},
                {"model", model_dir},
                {"threads", threads},
                {"batch", batch},
                {"device", device},
                {"dtype", dtype},
                {"blas", loaded_blas()},
                {"kernels", kernels::isa_name(kernels::active_isa())},
                {"prompt_len", prompt_len},
                {"new_tokens", new_tokens},
                {"decode_steps", new_tokens - 1},
                {"runs", runs},
                {"prompt_ids", prompt},
                {"prefill_tok_s", stats(prefill_rates)},
                {"decode_tok_s", stats(decode_rates)},
                {"peak_rss_mb", usage.ru_maxrss / 1024.0},
                {"generated_ids", generated},
                {"torch_version", TORCH_VERSION}};
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "swiftcpp_bench_infer: " << e.what() << std::endl;
    return 1;
  }
}
