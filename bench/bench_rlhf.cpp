// swiftcpp preference-training cost: one optimizer step of DPO against an SFT step over the same tokens, through
// the real Trainer. The data are `pairs` random prompts of `prompt` tokens, each with a chosen and a rejected answer
// of `answer` tokens; the SFT step trains the same 2 x pairs rows (prompt + answer, labels on the answer) with token
// cross-entropy. Objectives:
//   sft              Trainer::step over the 2 x pairs rows
//   dpo              pair_objective: policy forward + backward of both answers in one concatenated batch, plus the
//                    reference forward without autograd (the LoRA base: adapters switched off, no second copy)
//   dpo-precomputed  pair_objective with the reference log-probabilities computed once before the timed steps
//                    (precompute_ref_log_probs)
// Prints one JSON line: median / min / max step seconds over the timed steps, tokens/s, the peak RSS of the steps
// and the peak tensor memory of one step; for dpo also the median seconds of the step's reference forward (timed on
// its own inside the step, then handed to pair_objective: the same work pair_objective would do).
//
// With --image FILE (a vision-language model), each prompt holds that image's run of image tokens (as the model's
// processor counts it) after 8 random ids, then random ids up to `prompt` tokens. SFT trains each of the 2 x pairs
// rows with its own copy of the image (the tower runs for every row, as SFT on those rows does); DPO encodes each
// prompt's image once for both answers, in the policy's forward and in the reference's.
//
//   build/bin/swiftcpp_bench_rlhf --model bench/models/bench25m --objective dpo --pairs 2 --prompt 256 --answer 256
//   build/bin/swiftcpp_bench_rlhf --model bench/models/bench25m-qwen2-vl --image ../shared/assets/images/coffee.jpg
//       --objective dpo --pairs 2 --prompt 768 --answer 256
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>

#include "core/json.h"
#include "core/memory.h"
#include "core/runtime.h"
#include "data/encode.h"
#include "data/preference_data.h"
#include "train/rlhf.h"
#include "train/trainer.h"

using namespace swiftcpp;

namespace {

struct Options {
  std::string model = "bench/models/bench25m";
  std::string objective = "dpo";
  int64_t pairs = 2;
  int64_t prompt = 256;
  int64_t answer = 256;
  int64_t warmup = 3;
  int64_t steps = 10;
  int threads = 2;
  uint64_t data_seed = 0;
  int64_t lora_rank = 16;
  double lora_alpha = 32;
  std::string image;  // a vision-language model's prompt image ("" for text)
};

// The prompt image of every pair: its preprocessed pixels and the tokens its run takes.
struct PromptImage {
  vision::ProcessedImage image;
  int64_t tokens = 0;
  int32_t token_id = -1;
  bool variable_size = false;  // Qwen2-VL: pixel_values [patches, C T P P] with a grid
};

uint64_t splitmix(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Per step: `pairs` pairs of random ids in [3, vocab) (the image token excluded), each prompt holding `image`'s run
// when it is given.
std::vector<std::vector<PreferenceSample>> make_pairs(const Options& o, int64_t vocab, const PromptImage* image) {
  uint64_t state = o.data_seed;
  const auto ids = [&](int64_t n) {
    std::vector<int32_t> v;
    while (static_cast<int64_t>(v.size()) < n) {
      const auto id = 3 + static_cast<int32_t>(splitmix(state) % static_cast<uint64_t>(vocab - 3));
      if (image == nullptr || id != image->token_id) v.push_back(id);
    }
    return v;
  };
  std::vector<std::vector<PreferenceSample>> steps(static_cast<size_t>(o.warmup + o.steps));
  for (auto& step : steps) {
    for (int64_t p = 0; p < o.pairs; ++p) {
      std::vector<int32_t> prompt = ids(o.prompt);
      if (image != nullptr) {  // 8 ids, the image's run, the rest
        std::fill(prompt.begin() + 8, prompt.begin() + 8 + image->tokens, image->token_id);
      }
      PreferenceSample s;
      for (Sample* side : {&s.chosen, &s.rejected}) {
        AnswerTokens a;
        a.ids = ids(o.answer);
        a.trained.assign(a.ids.size(), 1);
        *side = join_prompt_answer(prompt, a);
        if (image != nullptr) {  // the same tensor in both rows of the pair
          side->pixel_values = {image->image.pixel_values};
          if (image->variable_size) side->image_grids = {image->image.grid_thw};
          side->image_tokens = {image->tokens};
        }
      }
      s.prompt_length = o.prompt;
      step.push_back(std::move(s));
    }
  }
  return steps;
}

double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"swiftcpp preference-training cost: a DPO step against an SFT step over the same tokens"};
  app.add_option("--model", o.model);
  app.add_option("--objective", o.objective)->check(CLI::IsMember({"sft", "dpo", "dpo-precomputed"}));
  app.add_option("--pairs", o.pairs);
  app.add_option("--prompt", o.prompt);
  app.add_option("--answer", o.answer);
  app.add_option("--warmup", o.warmup);
  app.add_option("--steps", o.steps);
  app.add_option("--threads", o.threads);
  app.add_option("--data-seed", o.data_seed);
  app.add_option("--lora-rank", o.lora_rank);
  app.add_option("--lora-alpha", o.lora_alpha);
  app.add_option("--image", o.image, "a JPEG/PNG each prompt holds (a vision-language model)");
  CLI11_PARSE(app, argc, argv);
  try {
    configure_threads(o.threads);
    configure_allocator();
    install_memory_tracking();
    TrainConfig c;
    c.model = o.model;
    c.dataset = {"synthetic"};
    c.train_type = "lora";
    c.lora_rank = o.lora_rank;
    c.lora_alpha = o.lora_alpha;
    c.lora_dropout = 0;
    c.learning_rate = 1e-4;
    c.weight_decay = 0;
    c.max_grad_norm = 1.0;
    c.lr_scheduler_type = "constant";
    if (o.objective != "sft") {
      c.rlhf_type = "dpo";
      c.loss_scale = "last_round";
      c.precompute_ref_log_probs = o.objective == "dpo-precomputed";
    }
    Trainer trainer(c, load_causal_lm(o.model));
    const DecoderConfig& mc = trainer.model()->config();
    std::optional<PromptImage> image;
    if (!o.image.empty()) {
      if (!mc.multimodal) fail<ConfigError>("--image needs a vision-language model; {} takes text only", o.model);
      const ImageEncoding encoding = make_image_encoding(o.model, *mc.multimodal);
      const PlannedImage planned = plan_image_file(o.image, encoding);
      image = PromptImage{process_planned_image(planned, encoding), planned.tokens, encoding.image_token_id,
                          encoding.processor->variable_size()};
      if (image->tokens + 8 >= o.prompt) {
        fail<ConfigError>("--prompt {} cannot hold the image's {} tokens after 8 ids", o.prompt, image->tokens);
      }
    }
    const auto data = make_pairs(o, mc.vocab_size, image ? &*image : nullptr);
    const int64_t total = o.warmup + o.steps;
    const at::Device device = trainer.model()->device();

    // precompute_ref_log_probs: the reference sums of every step's pairs, before the timed steps.
    std::vector<SequenceLogps> precomputed(data.size());
    std::vector<PreferenceBatch> batches;
    std::vector<Batch> sft_batches;  // the same rows, each with its own copy of its image
    for (size_t s = 0; s < data.size(); ++s) {
      std::vector<const PreferenceSample*> group;
      std::vector<const Sample*> rows;
      for (const auto& p : data[s]) group.push_back(&p);
      for (const auto& p : data[s]) rows.push_back(&p.chosen);
      for (const auto& p : data[s]) rows.push_back(&p.rejected);
      batches.push_back(collate_preference(group, 0));
      sft_batches.push_back(collate_padded(rows, 0));
      if (o.objective == "dpo-precomputed") {
        precomputed[s] = reference_logps(trainer.model(), CausalLM(nullptr), batches.back().batch, false,
                                         {batches.back().images, 2});
      }
    }
    PreferenceOptions dpo;
    dpo.rlhf_type = RlhfType::kDpo;

    std::vector<double> seconds, reference_seconds;
    int64_t peak_tensor = 0;
    double rss_before = 0;
    for (int64_t step = 0; step < total; ++step) {
      if (step == o.warmup) {
        std::ofstream("/proc/self/clear_refs") << "5";  // the RSS high-water mark of the timed steps only
        rss_before = peak_rss_mib();
      }
      reset_peak_memory(device);
      const auto t0 = std::chrono::steady_clock::now();
      if (o.objective == "sft") {
        // The same rows as the pairs: every chosen row, then every rejected row, padded as one batch.
        trainer.step({sft_batches[static_cast<size_t>(step)]}, step, total);
      } else {
        StepResult r;
        trainer.begin_step(1);
        SequenceLogps reference = precomputed[static_cast<size_t>(step)];
        if (o.objective == "dpo") {
          // The reference forward pair_objective would run, timed on its own (the same work, in the same step).
          const auto r0 = std::chrono::steady_clock::now();
          const PreferenceBatch& pb = batches[static_cast<size_t>(step)];
          reference = reference_logps(trainer.model(), CausalLM(nullptr), pb.batch, false, {pb.images, 2});
          if (step >= o.warmup) {
            reference_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count());
          }
        }
        const PreferenceResult res = pair_objective(dpo, trainer.model(), batches[static_cast<size_t>(step)],
                                                    reference, CausalLM(nullptr), false);
        trainer.backward(res.loss);
        trainer.finish_step(r, {res.loss}, [&](const std::vector<double>& s) { r.loss = s[0]; }, step, total);
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (step >= o.warmup) {
        seconds.push_back(dt);
        peak_tensor = std::max(peak_tensor, peak_memory_bytes(device));
      }
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                            : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
    const double tokens = static_cast<double>(2 * o.pairs * (o.prompt + o.answer));
    Json out = {{"objective", o.objective}, {"model", o.model}, {"image", o.image},
                      {"image_tokens", image ? image->tokens : 0}, {"pairs", o.pairs}, {"prompt", o.prompt},
                      {"answer", o.answer}, {"threads", o.threads}, {"steps", o.steps},
                      {"step_s_median", median}, {"step_s_min", sorted.front()}, {"step_s_max", sorted.back()},
                      {"tokens_per_s", tokens / median}, {"peak_rss_mib", peak_rss_mib()},
                      {"rss_before_timed_mib", rss_before},
                      {"peak_tensor_mib", static_cast<double>(peak_tensor) / 1048576.0}};
    if (!reference_seconds.empty()) {
      std::sort(reference_seconds.begin(), reference_seconds.end());
      out["reference_s_median"] = reference_seconds[reference_seconds.size() / 2];
    }
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_rlhf: " << e.what() << std::endl;
    return 1;
  }
}
