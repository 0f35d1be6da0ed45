// Vision-language training benchmark: real Trainer::step on LLaVA batches, with the step's time split into the
// vision tower, the projector and the language model, and a count of how often the tower ran.
//
//   build/bin/swiftcpp_bench_mm_train --model bench/models/bench25m-llava --batch 4 --warmup 3 --steps 10
//       --profiled-steps 4 --runs 3 --threads 2 [--train-vit]
//
// Batches: B samples a step, each one real image (../shared/assets/images, read and preprocessed with the model's
// preprocessor_config.json, cycled) and 64 text tokens of random ids laid out as a LLaVA-1.5 chat turn:
// [bos, 3 prompt ids, image_seq_length x image_token_index, 27 prompt ids, 32 answer ids, eos], labels on the
// answer and eos only. Training: LoRA r 16 / alpha 32 (dropout 0) on every linear layer of the language model,
// the projector trained in full, the tower frozen (freeze_vit) or, with --train-vit, trained in full; AdamW
// lr 1e-4 constant, no clipping, no weight decay, float32.
//
// How the split is measured. models/llava.cpp wraps the tower and the projector in profiler ranges named
// "vision_tower" and "multi_modal_projector". After the warm-up, each run times --steps unprofiled steps (their
// wall time is the step time reported) with --profiled-steps steps spread evenly among them that run under
// LibTorch's legacy profiler (CPU events), whose events give
//   - forward: the duration of each named range;
//   - backward: every autograd node evaluated in backward carries the sequence number of the forward op that
//     created it. A node belongs to the tower or the projector when the last forward op event holding its sequence
//     number lies inside that range; the whole `autograd::engine::evaluate_function` event of the node (the node
//     and the accumulation of its input gradients) is counted. Gradient accumulation into leaf tensors
//     (AccumulateGrad, no sequence number) stays with the language model, and its total is reported;
//   - optimizer: from the end of the last backward node to the end of the step (gradient norm, AdamW, the loss
//     read back);
//   - language model: the rest of the step (embedding and splicing, decoder and loss forward and backward); its
//     backward is every backward node not counted above, its forward the remainder.
// The parts are in the profiler's own clock and sum to the profiled step by construction; the profiled step's
// wall time is reported beside the unprofiled one, so the profiler's overhead is visible.
// Tower runs are counted in every step (profiled or not) by an observer of the "vision_tower" range that reads
// the number of images in its pixel_values input.
//
// Prints one JSON object on stdout and per-step lines on stderr.
#include <CLI/CLI.hpp>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <unordered_map>

#include <torch/version.h>

#include "core/json.h"
#include "core/runtime.h"
#include "data/collate.h"
#include "train/trainer.h"
#include "vision/image.h"
#include "vision/processor.h"

using namespace swiftcpp;

namespace {

const char* const kImages[] = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"};
constexpr const char* kTowerRange = "vision_tower";
constexpr const char* kProjectorRange = "multi_modal_projector";
constexpr const char* kStepRange = "bench_train_step";
constexpr const char* kBackwardPrefix = "autograd::engine::evaluate_function: ";
constexpr const char* kAccumulateGrad = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad";

struct Options {
  std::string model = "bench/models/bench25m-llava";
  std::string images = "../shared/assets/images";
  int64_t batch = 4;
  int64_t warmup = 3;
  int64_t steps = 10;
  int64_t profiled_steps = 4;
  int64_t runs = 3;
  int threads = 2;
  uint64_t seed = 0;
  bool train_vit = false;
  int64_t prompt_tokens = 30;  // text before the answer, bos excluded
  int64_t answer_tokens = 32;  // eos excluded
  int64_t top_ops = 0;         // print the ops with the most self time in each part
};

// ----- tower-run observer --------------------------------------------------------------------------------------
std::atomic<int64_t> g_tower_runs{0};
std::atomic<int64_t> g_tower_images{0};

std::unique_ptr<at::ObserverContext> on_user_scope(const at::RecordFunction& fn) {
  if (std::strcmp(fn.name(), kTowerRange) == 0) {
    ++g_tower_runs;
    const auto inputs = fn.inputs();
    if (!inputs.empty() && inputs[0].isTensor()) g_tower_images += inputs[0].toTensor().size(0);
  }
  return nullptr;
}

// ----- profile analysis ------------------------------------------------------------------------------------------
// The parts of a step.
enum Part : int { kTowerFwd, kTowerBwd, kProjectorFwd, kProjectorBwd, kLmFwd, kLmBwd, kOptimizer, kParts };
const char* const kPartNames[kParts] = {"tower forward", "tower backward", "projector forward", "projector backward",
                                        "language model forward", "language model backward", "optimizer"};

struct Split {
  double step_ms = 0;  // the profiled step, profiler clock
  double tower_fwd_ms = 0, tower_bwd_ms = 0;
  double projector_fwd_ms = 0, projector_bwd_ms = 0;
  double backward_ms = 0;    // every backward node
  double accumulate_ms = 0;  // the AccumulateGrad nodes among them
  double optimizer_ms = 0;   // end of the last backward node -> end of the step
  std::map<std::string, double> self_ms[kParts];  // op name -> self time (--top-ops)
  double lm_ms() const { return step_ms - tower_fwd_ms - tower_bwd_ms - projector_fwd_ms - projector_bwd_ms - optimizer_ms; }
  double lm_bwd_ms() const { return backward_ms - tower_bwd_ms - projector_bwd_ms; }
  double lm_fwd_ms() const { return lm_ms() - lm_bwd_ms(); }
};

enum Region : int { kNone = 0, kTower = 1, kProjector = 2 };

struct Range {
  std::string name;
  uint8_t scope = 0;
  int64_t seq = -1;
  double start_us = 0, end_us = -1;
  double children_us = 0;     // time of the ranges directly inside it
  long parent = -1;
  int region = kNone;
  bool in_backward = false;   // inside an evaluate_function event
  bool backward_top = false;  // an outermost evaluate_function event
  int64_t node_seq = -1;      // backward_top: the sequence number of the node it evaluated
  long backward_root = -1;    // in_backward: the outermost evaluate_function event it is in
};

// Splits one profiled step (the events of enableProfilerLegacy .. disableProfilerLegacy); see the top of the file.
Split analyse(const torch::autograd::profiler::thread_event_lists& lists) {
  using torch::autograd::profiler::EventKind;
  Split s;
  std::vector<Range> ranges;  // in push order, thread by thread
  for (const auto& list : lists) {
    std::vector<size_t> stack;
    std::unordered_map<uint64_t, size_t> open;  // handle -> index into ranges
    for (const auto& e : list) {
      if (e.kind() == EventKind::PushRange) {
        Range r;
        r.name = e.name();
        r.scope = e.scope();
        r.seq = e.sequenceNr();
        r.start_us = e.cpuUs();
        if (!stack.empty()) {
          Range& parent = ranges[stack.back()];
          r.parent = static_cast<long>(stack.back());
          r.region = parent.region;
          r.in_backward = parent.in_backward || parent.backward_top;
          r.backward_root = parent.backward_top ? r.parent : parent.backward_root;
          if (parent.backward_top && r.scope == static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION) &&
              parent.node_seq < 0) {
            parent.node_seq = r.seq;
          }
        }
        if (r.name == kTowerRange) r.region = kTower;
        if (r.name == kProjectorRange) r.region = kProjector;
        if (!r.in_backward && r.name.rfind(kBackwardPrefix, 0) == 0) r.backward_top = true;
        open[e.handle()] = ranges.size();
        stack.push_back(ranges.size());
        ranges.push_back(std::move(r));
      } else if (e.kind() == EventKind::PopRange) {
        const auto it = open.find(e.handle());
        if (it == open.end()) continue;
        Range& r = ranges[it->second];
        r.end_us = e.cpuUs();
        if (r.parent >= 0) ranges[static_cast<size_t>(r.parent)].children_us += r.end_us - r.start_us;
        const auto pos = std::find(stack.rbegin(), stack.rend(), it->second);
        if (pos != stack.rend()) stack.erase(std::next(pos).base());
        open.erase(it);
      }
    }
  }
  // The node with sequence number n is created by the last forward op that saw n (the counter advances when a node
  // is created, so later ops see n + 1).
  std::unordered_map<int64_t, int> node_region;
  double step_end = 0, last_backward_end = 0;
  for (const auto& r : ranges) {
    if (r.end_us < 0) continue;
    const double ms = (r.end_us - r.start_us) / 1e3;
    if (r.name == kStepRange) {
      s.step_ms += ms;
      step_end = std::max(step_end, r.end_us);
    } else if (r.name == kTowerRange) {
      s.tower_fwd_ms += ms;
    } else if (r.name == kProjectorRange) {
      s.projector_fwd_ms += ms;
    }
    if (!r.in_backward && !r.backward_top && r.scope == static_cast<uint8_t>(at::RecordScope::FUNCTION) && r.seq >= 0) {
      node_region[r.seq] = r.region;
    }
  }
  std::vector<int> backward_region(ranges.size(), kNone);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (!r.backward_top || r.end_us < 0) continue;
    const double ms = (r.end_us - r.start_us) / 1e3;
    s.backward_ms += ms;
    if (r.name == kAccumulateGrad) s.accumulate_ms += ms;
    last_backward_end = std::max(last_backward_end, r.end_us);
    const auto it = node_region.find(r.node_seq);
    const int region = r.node_seq >= 0 && it != node_region.end() ? it->second : kNone;
    backward_region[i] = region;
    if (region == kTower) s.tower_bwd_ms += ms;
    if (region == kProjector) s.projector_bwd_ms += ms;
  }
  if (last_backward_end > 0 && step_end > last_backward_end) s.optimizer_ms = (step_end - last_backward_end) / 1e3;
  // Self time of every op, by part.
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.end_us < 0 || r.name == kStepRange) continue;
    Part part;
    if (r.backward_top || r.in_backward) {
      const int region = backward_region[r.backward_top ? i : static_cast<size_t>(r.backward_root)];
      part = region == kTower ? kTowerBwd : region == kProjector ? kProjectorBwd : kLmBwd;
    } else if (last_backward_end > 0 && r.start_us >= last_backward_end) {
      part = kOptimizer;
    } else {
      part = r.region == kTower ? kTowerFwd : r.region == kProjector ? kProjectorFwd : kLmFwd;
    }
    s.self_ms[part][r.name] += (r.end_us - r.start_us - r.children_us) / 1e3;
  }
  return s;
}

// Prints the `top` ops with the most self time in each part, summed over `splits`.
void print_top_ops(const std::vector<Split>& splits, int64_t top) {
  for (int p = 0; p < kParts; ++p) {
    std::map<std::string, double> sum;
    for (const auto& s : splits) {
      for (const auto& [name, ms] : s.self_ms[p]) sum[name] += ms;
    }
    std::vector<std::pair<double, std::string>> v;
    double total = 0;
    for (const auto& [name, ms] : sum) {
      v.emplace_back(ms, name);
      total += ms;
    }
    std::sort(v.rbegin(), v.rend());
    std::cerr << fmt::format("{} (self time of its ops, {:.1f} ms per profiled step):\n", kPartNames[p],
                             total / std::max<size_t>(1, splits.size()));
    for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < top; ++i) {
      std::cerr << fmt::format("  {:9.1f} ms  {}\n", v[i].first / std::max<size_t>(1, splits.size()), v[i].second);
    }
  }
}

// ----- data ------------------------------------------------------------------------------------------------------
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

// One LLaVA-1.5 chat turn of random text around one image; labels on the answer and eos.
Sample make_sample(SplitMix& rng, const Options& o, const DecoderConfig& mc, const at::Tensor& image) {
  const auto& mm = *mc.multimodal;
  const auto text_id = [&] { return 3 + static_cast<int32_t>(rng.next() % static_cast<uint64_t>(std::min<int64_t>(mm.image_token_index, mc.vocab_size) - 3)); };
  Sample s;
  s.input_ids.push_back(static_cast<int32_t>(mc.bos_token_id.value_or(1)));
  const int64_t before = std::min<int64_t>(3, o.prompt_tokens);
  for (int64_t i = 0; i < before; ++i) s.input_ids.push_back(text_id());
  for (int64_t i = 0; i < mm.image_seq_length; ++i) s.input_ids.push_back(static_cast<int32_t>(mm.image_token_index));
  for (int64_t i = before; i < o.prompt_tokens; ++i) s.input_ids.push_back(text_id());
  const size_t answer_start = s.input_ids.size();
  for (int64_t i = 0; i < o.answer_tokens; ++i) s.input_ids.push_back(text_id());
  s.input_ids.push_back(static_cast<int32_t>(mc.eos_token_ids.empty() ? 2 : mc.eos_token_ids[0]));
  s.labels.assign(s.input_ids.size(), kIgnoreIndex);
  for (size_t t = answer_start - 1; t + 1 < s.input_ids.size(); ++t) s.labels[t] = s.input_ids[t + 1];
  s.pixel_values = {image};
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Json split_json(const std::vector<Split>& splits) {
  const auto med = [&](auto f) {
    std::vector<double> v;
    for (const auto& s : splits) v.push_back(f(s));
    return median(v);
  };
  return {{"steps", splits.size()},
          {"step_ms", med([](const Split& s) { return s.step_ms; })},
          {"tower_fwd_ms", med([](const Split& s) { return s.tower_fwd_ms; })},
          {"tower_bwd_ms", med([](const Split& s) { return s.tower_bwd_ms; })},
          {"projector_fwd_ms", med([](const Split& s) { return s.projector_fwd_ms; })},
          {"projector_bwd_ms", med([](const Split& s) { return s.projector_bwd_ms; })},
          {"lm_ms", med([](const Split& s) { return s.lm_ms(); })},
          {"lm_fwd_ms", med([](const Split& s) { return s.lm_fwd_ms(); })},
          {"lm_bwd_ms", med([](const Split& s) { return s.lm_bwd_ms(); })},
          {"accumulate_grad_ms", med([](const Split& s) { return s.accumulate_ms; })},
          {"optimizer_ms", med([](const Split& s) { return s.optimizer_ms; })},
          {"backward_ms", med([](const Split& s) { return s.backward_ms; })}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"swiftcpp vision-language training step benchmark (time split into tower, projector, language model)"};
  app.add_option("--model", o.model, "LLaVA checkpoint folder (scripts/make_bench_llava.py)");
  app.add_option("--images", o.images, "folder holding the five test images");
  app.add_option("--batch", o.batch, "samples (= images) per step")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "timed unprofiled steps per run")->check(CLI::PositiveNumber);
  app.add_option("--profiled-steps", o.profiled_steps, "profiled steps per run, spread among the timed ones")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", o.runs, "model loads, each with its warm-up and timed steps")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads);
  app.add_option("--seed", o.seed, "seed of the random text ids");
  app.add_option("--prompt-tokens", o.prompt_tokens)->check(CLI::NonNegativeNumber);
  app.add_option("--answer-tokens", o.answer_tokens)->check(CLI::PositiveNumber);
  app.add_option("--top-ops", o.top_ops, "print the N ops with the most self time in each part (stderr)");
  app.add_flag("--train-vit", o.train_vit, "train the vision tower in full (freeze_vit false)");
  CLI11_PARSE(app, argc, argv);
  try {
    configure_threads(o.threads);
    configure_allocator();
    const DecoderConfig mc = load_causal_lm(o.model)->config();
    if (!mc.multimodal) throw std::runtime_error(o.model + " is not a vision-language model");
    const vision::ImageProcessorConfig pc = vision::load_image_processor_config(o.model);
    std::vector<at::Tensor> images;  // [3, H, W] each
    for (const char* name : kImages) images.push_back(vision::preprocess_image(vision::read_image(fs::path(o.images) / name), pc));

    // One batch per step of a run (the same batches in every run), images cycled.
    const int64_t timed_steps = o.steps + o.profiled_steps;
    const int64_t n = o.warmup + timed_steps;
    SplitMix rng{o.seed};
    std::vector<Batch> batches;
    size_t next_image = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<Sample> samples;
      for (int64_t j = 0; j < o.batch; ++j) samples.push_back(make_sample(rng, o, mc, images[next_image++ % images.size()]));
      std::vector<const Sample*> group;
      for (const auto& s : samples) group.push_back(&s);
      batches.push_back(collate_padded(group, 0));
    }

    TrainConfig c;
    c.model = o.model;
    c.dataset = {"synthetic"};
    c.train_type = "lora";
    c.lora_rank = 16;
    c.lora_alpha = 32;
    c.lora_dropout = 0;
    c.target_modules = {"all-linear"};
    c.freeze_vit = !o.train_vit;
    c.freeze_aligner = false;
    c.learning_rate = 1e-4;
    c.weight_decay = 0;
    c.max_grad_norm = 0;
    c.lr_scheduler_type = "constant";
    c.seed = static_cast<int64_t>(o.seed);

    const auto observer = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&on_user_scope).needsInputs(true).scopes({at::RecordScope::USER_SCOPE}));
    const torch::profiler::impl::ProfilerConfig profiler_config(torch::profiler::impl::ProfilerState::CPU);

    std::vector<double> run_step_ms, run_profiled_ms, losses;
    std::vector<Split> splits;
    int64_t min_runs = INT64_MAX, max_runs = 0, min_images = INT64_MAX, max_images = 0, trainable = 0;
    bool images_match = true;  // every step's tower saw exactly the step's images
    int64_t tokens_per_step = 0, label_tokens_per_step = 0;
    for (int64_t run = 0; run < o.runs; ++run) {
      Trainer trainer(c, load_causal_lm(o.model));
      trainable = 0;
      for (const auto& t : trainer.trainables()) trainable += t.tensor.numel();
      std::vector<double> step_ms, profiled_ms;
      for (int64_t i = 0; i < n; ++i) {
        const Batch& b = batches[static_cast<size_t>(i)];
        const bool timed = i >= o.warmup;
        const int64_t k = i - o.warmup;  // P profiled steps spread evenly over the T timed ones
        const bool profiled = timed && (k + 1) * o.profiled_steps / timed_steps > k * o.profiled_steps / timed_steps;
        g_tower_runs = 0;
        g_tower_images = 0;
        if (profiled) torch::autograd::profiler::enableProfilerLegacy(profiler_config);
        const auto t0 = std::chrono::steady_clock::now();
        StepResult r;
        {
          RECORD_USER_SCOPE(kStepRange);
          r = trainer.step({b}, i, n);
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        Split split;
        if (profiled) split = analyse(torch::autograd::profiler::disableProfilerLegacy());
        const int64_t tower_runs = g_tower_runs, tower_images = g_tower_images;
        if (tower_runs == 0) {
          throw std::runtime_error("the step opened no 'vision_tower' profiler range, so nothing can be attributed "
                                   "to the tower (models/llava.cpp marks it in the encoder's encode())");
        }
        min_runs = std::min(min_runs, tower_runs);
        max_runs = std::max(max_runs, tower_runs);
        min_images = std::min(min_images, tower_images);
        max_images = std::max(max_images, tower_images);
        images_match = images_match && tower_images == b.pixel_values.size(0);
        tokens_per_step = b.real_tokens;
        label_tokens_per_step = b.label_tokens;
        if (run == 0) losses.push_back(r.loss);
        std::cerr << fmt::format("run {} step {}{} loss {:.5f} {:.1f} ms, tower ran {}x on {} images ({} in the batch)",
                                 run, i, !timed ? " (warm-up)" : profiled ? " (profiled)" : "", r.loss, ms, tower_runs,
                                 tower_images, b.pixel_values.size(0));
        if (profiled) {
          std::cerr << fmt::format(": profiler step {:.1f} = tower {:.1f}+{:.1f}, projector {:.1f}+{:.1f}, "
                                   "language model {:.1f}+{:.1f}, optimizer {:.1f}",
                                   split.step_ms, split.tower_fwd_ms, split.tower_bwd_ms, split.projector_fwd_ms,
                                   split.projector_bwd_ms, split.lm_fwd_ms(), split.lm_bwd_ms(), split.optimizer_ms);
        }
        std::cerr << "\n";
        if (!timed) continue;
        if (profiled) {
          profiled_ms.push_back(ms);
          splits.push_back(split);
        } else {
          step_ms.push_back(ms);
        }
      }
      run_step_ms.push_back(median(step_ms));
      run_profiled_ms.push_back(median(profiled_ms));
    }
    at::removeCallback(observer);
    if (o.top_ops > 0) print_top_ops(splits, o.top_ops);

    const double step_ms = median(run_step_ms);
    Json out = {{"impl", "swiftcpp"},
                {"case", o.train_vit ? "tower trained (freeze_vit false)" : "tower frozen (freeze_vit true)"},
                {"train_vit", o.train_vit},
                {"model", o.model},
                {"batch", o.batch},
                {"images_per_step", o.batch},
                {"tokens_per_step", tokens_per_step},
                {"image_tokens_per_step", o.batch * mc.multimodal->image_seq_length},
                {"label_tokens_per_step", label_tokens_per_step},
                {"trainable_parameters", trainable},
                {"step_ms_median", step_ms},
                {"step_ms_min", *std::min_element(run_step_ms.begin(), run_step_ms.end())},
                {"step_ms_max", *std::max_element(run_step_ms.begin(), run_step_ms.end())},
                {"step_ms_runs", run_step_ms},
                {"profiled_step_ms_runs", run_profiled_ms},
                {"tokens_per_s", static_cast<double>(tokens_per_step) / (step_ms / 1e3)},
                {"images_per_s", static_cast<double>(o.batch) / (step_ms / 1e3)},
                {"split", split_json(splits)},
                {"tower_runs_per_step_min", min_runs},
                {"tower_runs_per_step_max", max_runs},
                {"tower_images_per_step_min", min_images},
                {"tower_images_per_step_max", max_images},
                {"tower_images_equal_step_images", images_match},
                {"losses", losses},
                {"threads", o.threads},
                {"torch", TORCH_VERSION},
                {"blas", loaded_blas()},
                {"warmup", o.warmup},
                {"steps", o.steps},
                {"profiled_steps", o.profiled_steps},
                {"runs", o.runs}};
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "swiftcpp_bench_mm_train: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
