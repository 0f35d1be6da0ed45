// Vision-language training benchmark: real Trainer::step on LLaVA or Qwen2-VL batches, with the step's time split
// into the vision tower, the projector (Qwen2-VL: the merger) and the language model, and a count of how often the
// tower ran.
//
//   build/bin/swiftcpp_bench_mm_train --model bench/models/bench25m-llava --batch 4 --warmup 3 --steps 10
//       --profiled-steps 4 --runs 3 --threads 2 [--train-vit] [--sample-tokens 640]
//   (or --model bench/models/bench25m-qwen2-vl: scripts/make_bench_qwen2_vl.py)
//
// The family (config.json's model_type) gives the profiler ranges and the layout of a sample (kFamilies):
//   llava                 ranges "vision_tower" / "multi_modal_projector"; a LLaVA-1.5 chat turn:
//                         [bos, 3 prompt ids, image tokens, prompt ids, answer ids, eos]
//   qwen2_vl, qwen2_5_vl  ranges "visual" / "visual.merger"; Qwen2-VL's markup, no bos:
//                         [3 prompt ids, <|vision_start|>, image tokens, <|vision_end|>, prompt ids, answer ids, eos]
// Batches: B samples a step, each one real image (../shared/assets/images, read and run through the model's image
// processor, vision/image_processor.h, which says how many tokens the image takes: LLaVA's image_seq_length, or
// Qwen2-VL's t h w / merge^2 for that image; --min-pixels / --max-pixels override Qwen2-VL's bounds), cycled,
// and random text ids drawn from [3, the lowest special id above 2). Every sample is --sample-tokens long
// (default 640: bench25m-llava's 576 image tokens + 64 text tokens): the prompt ids after the image fill what the
// image, the fixed tokens and --answer-tokens (32) answer ids leave, so the families compare at one token count
// even when their images take different numbers of tokens. Labels on the answer and eos only. Qwen2-VL's images
// travel as pixel_values [patches, C T P P] + image_grid_thw [N, 3] (data/collate.h batch_images) and its M-RoPE
// positions are computed by the model (in the language model's part). Training: LoRA r 16 / alpha 32 (dropout 0)
// on every linear layer of the language model, the projector / merger trained in full, the tower frozen
// (freeze_vit) or, with --train-vit, trained in full; AdamW lr 1e-4 constant, no clipping, no weight decay,
// float32.
//
// How the split is measured. models/llava.cpp and models/qwen2_vl.cpp wrap the tower and the projector / merger
// in the family's two profiler ranges. After the warm-up, each run times --steps unprofiled steps (their wall time
// is the step time reported) with --profiled-steps steps spread evenly among them that run under LibTorch's legacy
// profiler (CPU events), whose events give
//   - forward: the duration of each named range;
//   - backward: every autograd node evaluated in backward carries the sequence number it was given when the
//     forward created it, and the numbers only grow on the forward thread. An observer of the two ranges notes the
//     next number at each range's start and end, so a node belongs to the tower or the projector when its number
//     lies in that range's interval. (Matching the node to a forward op event with its number would miss the
//     nodes of custom autograd Functions, nn::Linear's GemmLinear and the attention's BlockAttention, whose forward
//     records no op with it.) The whole `autograd::engine::evaluate_function` event of the node (the node and the
//     accumulation of its input gradients) is counted. Gradient accumulation into leaf tensors (AccumulateGrad, no
//     sequence number) stays with the language model, and its total is reported;
//   - optimizer: from the end of the last backward node to the end of the step (gradient norm, AdamW, the loss
//     read back);
//   - language model: the rest of the step (embedding and splicing, positions, decoder and loss forward and
//     backward); its backward is every backward node not counted above, its forward the remainder.
// The parts are in the profiler's own clock and sum to the profiled step by construction; the profiled step's
// wall time is reported beside the unprofiled one, so the profiler's overhead is visible.
// Tower runs are counted in every step (profiled or not) by an observer of the tower range that reads the rows of
// its pixel_values input (images for LLaVA, patches for Qwen2-VL) and compares them with the step's.
//
// Prints one JSON object on stdout (with every profiled step's split, so that runs in separate processes can be
// pooled: bench/run_mm_train.sh) and per-step lines on stderr.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <unordered_map>

#include <torch/version.h>

#include "core/json.h"
#include "core/runtime.h"
#include "data/collate.h"
#include "train/trainer.h"
#include "vision/image.h"
#include "vision/image_processor.h"

using namespace swiftcpp;

namespace {

const char* const kImages[] = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"};

// What the benchmark needs to know of a vision-language family.
struct Family {
  const char* model_type;       // config.json's
  const char* tower_range;      // the profiler range around the vision tower (models/<family>.cpp)
  const char* projector_range;  // ... around the projector / merger
  const char* projector_name;   // what the report calls the latter
  bool vision_markers;          // <|vision_start|> / <|vision_end|> around the image tokens and no bos (Qwen2-VL)
};
constexpr Family kFamilies[] = {
    {"llava", "vision_tower", "multi_modal_projector", "projector", false},
    {"qwen2_vl", "visual", "visual.merger", "merger", true},
    {"qwen2_5_vl", "visual", "visual.merger", "merger", true},
};

const Family& find_family(const std::string& model_type) {
  for (const Family& f : kFamilies) {
    if (model_type == f.model_type) return f;
  }
  std::string known;
  for (const Family& f : kFamilies) known += std::string(known.empty() ? "" : ", ") + f.model_type;
  throw std::runtime_error("model_type '" + model_type + "' is not a family this benchmark knows (" + known + ")");
}

const Family* g_family = &kFamilies[0];  // set once in main, before any step
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
  int64_t sample_tokens = 640;  // every sample's length, image tokens included
  int64_t answer_tokens = 32;   // eos excluded
  std::optional<int64_t> min_pixels, max_pixels;  // Qwen2-VL image processor overrides
  int64_t top_ops = 0;         // print the ops with the most self time in each part
};

// ----- tower and projector observer -----------------------------------------------------------------------------
std::atomic<int64_t> g_tower_runs{0};
std::atomic<int64_t> g_tower_rows{0};  // pixel_values rows: images (LLaVA) or patches (Qwen2-VL)

// The autograd sequence numbers handed out while a range was open, [begin, end): every node created in it, custom
// autograd Functions included (their forward records no op with the node's number), has one. Written by the
// observer on the forward thread, read after the step.
struct SeqInterval {
  uint64_t begin = 0, end = 0;
};
std::vector<SeqInterval> g_tower_seq, g_projector_seq;

struct SeqContext : at::ObserverContext {
  uint64_t begin = 0;
};

std::unique_ptr<at::ObserverContext> on_user_scope(const at::RecordFunction& fn) {
  const bool tower = std::strcmp(fn.name(), g_family->tower_range) == 0;
  if (tower) {
    ++g_tower_runs;
    const auto inputs = fn.inputs();
    if (!inputs.empty() && inputs[0].isTensor()) g_tower_rows += inputs[0].toTensor().size(0);
  }
  if (!tower && std::strcmp(fn.name(), g_family->projector_range) != 0) return nullptr;
  auto ctx = std::make_unique<SeqContext>();
  ctx->begin = at::sequence_number::peek();
  return ctx;
}

void on_user_scope_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  const SeqInterval interval{static_cast<SeqContext*>(ctx)->begin, at::sequence_number::peek()};
  (std::strcmp(fn.name(), g_family->tower_range) == 0 ? g_tower_seq : g_projector_seq).push_back(interval);
}

bool in_any(const std::vector<SeqInterval>& intervals, int64_t seq) {
  for (const auto& i : intervals) {
    if (seq >= 0 && static_cast<uint64_t>(seq) >= i.begin && static_cast<uint64_t>(seq) < i.end) return true;
  }
  return false;
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
        if (r.name == g_family->tower_range) r.region = kTower;
        if (r.name == g_family->projector_range) r.region = kProjector;
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
  double step_end = 0, last_backward_end = 0;
  for (const auto& r : ranges) {
    if (r.end_us < 0) continue;
    const double ms = (r.end_us - r.start_us) / 1e3;
    if (r.name == kStepRange) {
      s.step_ms += ms;
      step_end = std::max(step_end, r.end_us);
    } else if (r.name == g_family->tower_range) {
      s.tower_fwd_ms += ms;
    } else if (r.name == g_family->projector_range) {
      s.projector_fwd_ms += ms;
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
    // The node was created inside the range whose sequence numbers hold its own.
    const int region = in_any(g_tower_seq, r.node_seq)       ? kTower
                       : in_any(g_projector_seq, r.node_seq) ? kProjector
                                                             : kNone;
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
    std::string part = kPartNames[p];
    if (part.rfind("projector", 0) == 0) part.replace(0, std::strlen("projector"), g_family->projector_name);
    std::cerr << fmt::format("{} (self time of its ops, {:.1f} ms per profiled step):\n", part,
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

// The token ids a sample is made of.
struct TokenIds {
  int32_t bos = 1, eos = 2, image = -1, vision_start = -1, vision_end = -1;
  int32_t text_end = 0;  // random text ids are drawn from [3, text_end)
};

// The model's special ids: config().multimodal, and vision_end_token_id from config.json (Qwen2-VL).
TokenIds token_ids(const DecoderConfig& mc, const std::string& model_dir) {
  const auto& mm = *mc.multimodal;
  TokenIds t;
  t.bos = static_cast<int32_t>(mc.bos_token_id.value_or(1));
  t.eos = static_cast<int32_t>(mc.eos_token_ids.empty() ? 2 : mc.eos_token_ids[0]);
  t.image = static_cast<int32_t>(mm.image_token_index);
  if (g_family->vision_markers) {
    t.vision_start = static_cast<int32_t>(mm.vision_start_token_id);
    const JsonObject config = JsonObject::load(fs::path(model_dir) / "config.json");
    t.vision_end = static_cast<int32_t>(config.get_or<int64_t>("vision_end_token_id", mm.vision_start_token_id + 1));
  }
  int64_t end = mc.vocab_size;
  for (const int64_t id : {int64_t{t.bos}, int64_t{t.eos}, int64_t{t.image}, int64_t{t.vision_start},
                           int64_t{t.vision_end}}) {
    if (id > 2) end = std::min(end, id);
  }
  if (end <= 3) throw std::runtime_error("no room for text ids below the special ids");
  t.text_end = static_cast<int32_t>(end);
  return t;
}

// One chat turn of random text around one image, `o.sample_tokens` long (see the top of the file); labels on the
// answer and eos.
Sample make_sample(SplitMix& rng, const Options& o, const TokenIds& ids, const vision::ProcessedImage& image) {
  const auto text_id = [&] { return 3 + static_cast<int32_t>(rng.next() % static_cast<uint64_t>(ids.text_end - 3)); };
  const bool markers = g_family->vision_markers;
  constexpr int64_t kBefore = 3;  // prompt ids before the image
  const int64_t fixed = (markers ? 2 : 1) + kBefore + o.answer_tokens + 1;  // markers or bos, eos
  const int64_t after = o.sample_tokens - image.tokens - fixed;            // prompt ids after the image
  if (after < 0) {
    throw std::runtime_error(fmt::format("--sample-tokens {} leaves no room: the image takes {} tokens and the text "
                                         "at least {}", o.sample_tokens, image.tokens, fixed));
  }
  Sample s;
  if (!markers) s.input_ids.push_back(ids.bos);
  for (int64_t i = 0; i < kBefore; ++i) s.input_ids.push_back(text_id());
  if (markers) s.input_ids.push_back(ids.vision_start);
  for (int64_t i = 0; i < image.tokens; ++i) s.input_ids.push_back(ids.image);
  if (markers) s.input_ids.push_back(ids.vision_end);
  for (int64_t i = 0; i < after; ++i) s.input_ids.push_back(text_id());
  const size_t answer_start = s.input_ids.size();
  for (int64_t i = 0; i < o.answer_tokens; ++i) s.input_ids.push_back(text_id());
  s.input_ids.push_back(ids.eos);
  s.labels.assign(s.input_ids.size(), kIgnoreIndex);
  for (size_t t = answer_start - 1; t + 1 < s.input_ids.size(); ++t) s.labels[t] = s.input_ids[t + 1];
  s.pixel_values = {image.pixel_values};  // [C, H, W] or [patches, C T P P]
  if (image.grid_thw[0] > 0) s.image_grids = {image.grid_thw};
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Json split_values(const Split& s) {
  return {{"step_ms", s.step_ms},
          {"tower_fwd_ms", s.tower_fwd_ms},
          {"tower_bwd_ms", s.tower_bwd_ms},
          {"projector_fwd_ms", s.projector_fwd_ms},
          {"projector_bwd_ms", s.projector_bwd_ms},
          {"lm_ms", s.lm_ms()},
          {"lm_fwd_ms", s.lm_fwd_ms()},
          {"lm_bwd_ms", s.lm_bwd_ms()},
          {"accumulate_grad_ms", s.accumulate_ms},
          {"optimizer_ms", s.optimizer_ms},
          {"backward_ms", s.backward_ms}};
}

// The median of every part over `splits`, and the splits themselves.
Json split_json(const std::vector<Split>& splits) {
  Json all = Json::array();
  for (const auto& s : splits) all.push_back(split_values(s));
  Json out = {{"steps", splits.size()}, {"per_step", all}};
  const Json keys = split_values(Split{});
  for (const auto& [key, value] : keys.items()) {
    (void)value;
    std::vector<double> v;
    for (const auto& s : all) v.push_back(s.at(key).get<double>());
    out[key] = median(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"swiftcpp vision-language training step benchmark (time split into tower, projector, language model)"};
  app.add_option("--model", o.model,
                 "LLaVA or Qwen2-VL checkpoint folder (scripts/make_bench_llava.py, scripts/make_bench_qwen2_vl.py)");
  app.add_option("--images", o.images, "folder holding the five test images");
  app.add_option("--batch", o.batch, "samples (= images) per step")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "timed unprofiled steps per run")->check(CLI::PositiveNumber);
  app.add_option("--profiled-steps", o.profiled_steps, "profiled steps per run, spread among the timed ones")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", o.runs, "model loads, each with its warm-up and timed steps")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads);
  app.add_option("--seed", o.seed, "seed of the random text ids");
  app.add_option("--sample-tokens", o.sample_tokens, "every sample's length, its image tokens included")
      ->check(CLI::PositiveNumber);
  app.add_option("--answer-tokens", o.answer_tokens)->check(CLI::PositiveNumber);
  app.add_option("--min-pixels", o.min_pixels, "Qwen2-VL: override the image processor's min_pixels");
  app.add_option("--max-pixels", o.max_pixels, "Qwen2-VL: override the image processor's max_pixels");
  app.add_option("--top-ops", o.top_ops, "print the N ops with the most self time in each part (stderr)");
  app.add_flag("--train-vit", o.train_vit, "train the vision tower in full (freeze_vit false)");
  CLI11_PARSE(app, argc, argv);
  try {
    configure_threads(o.threads);
    configure_allocator();
    const DecoderConfig mc = load_causal_lm(o.model)->config();
    if (!mc.multimodal) throw std::runtime_error(o.model + " is not a vision-language model");
    g_family = &find_family(mc.model_type);
    const TokenIds ids = token_ids(mc, o.model);
    const auto processor =
        vision::load_image_processor(o.model, mc.multimodal->image_seq_length, {o.min_pixels, o.max_pixels});
    std::vector<vision::ProcessedImage> images;  // pixel_values [3, H, W] or [patches, C T P P] each
    Json image_info = Json::array();
    for (const char* name : kImages) {
      images.push_back(processor->process(vision::read_image(fs::path(o.images) / name)));
      const auto& im = images.back();
      image_info.push_back(
          {{"file", name}, {"tokens", im.tokens}, {"pixel_values_shape", im.pixel_values.sizes().vec()}});
      if (im.grid_thw[0] > 0) image_info.back()["grid_thw"] = im.grid_thw;
    }

    // One batch per step of a run (the same batches in every run), images cycled.
    const int64_t timed_steps = o.steps + o.profiled_steps;
    const int64_t n = o.warmup + timed_steps;
    SplitMix rng{o.seed};
    std::vector<Batch> batches;
    size_t next_image = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<Sample> samples;
      for (int64_t j = 0; j < o.batch; ++j) {
        samples.push_back(make_sample(rng, o, ids, images[next_image++ % images.size()]));
      }
      std::vector<const Sample*> group;
      for (const auto& s : samples) group.push_back(&s);
      batches.push_back(collate_padded(group, 0));
    }
    // Image tokens and tower input rows (images or patches) per step, over the steps of a run.
    int64_t min_image_tokens = INT64_MAX, max_image_tokens = 0, sum_image_tokens = 0;
    int64_t min_step_rows = INT64_MAX, max_step_rows = 0;
    for (const Batch& b : batches) {
      const int64_t t = (b.input_ids == ids.image).sum().item<int64_t>();
      min_image_tokens = std::min(min_image_tokens, t);
      max_image_tokens = std::max(max_image_tokens, t);
      sum_image_tokens += t;
      min_step_rows = std::min(min_step_rows, b.pixel_values.size(0));
      max_step_rows = std::max(max_step_rows, b.pixel_values.size(0));
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
        at::RecordFunctionCallback(&on_user_scope, &on_user_scope_end)
            .needsInputs(true)
            .scopes({at::RecordScope::USER_SCOPE}));
    const torch::profiler::impl::ProfilerConfig profiler_config(torch::profiler::impl::ProfilerState::CPU);

    std::vector<double> run_step_ms, run_profiled_ms, losses;
    std::vector<Split> splits;
    int64_t min_runs = INT64_MAX, max_runs = 0, min_rows = INT64_MAX, max_rows = 0, trainable = 0;
    bool rows_match = true;  // every step's tower saw exactly the step's images (their pixel_values rows)
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
        g_tower_rows = 0;
        g_tower_seq.clear();
        g_projector_seq.clear();
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
        const int64_t tower_runs = g_tower_runs, tower_rows = g_tower_rows;
        if (tower_runs == 0) {
          throw std::runtime_error(fmt::format("the step opened no '{}' profiler range, so nothing can be attributed "
                                               "to the tower (the {} encoder's encode() marks it)",
                                               g_family->tower_range, g_family->model_type));
        }
        min_runs = std::min(min_runs, tower_runs);
        max_runs = std::max(max_runs, tower_runs);
        min_rows = std::min(min_rows, tower_rows);
        max_rows = std::max(max_rows, tower_rows);
        rows_match = rows_match && tower_rows == b.pixel_values.size(0);
        tokens_per_step = b.real_tokens;
        label_tokens_per_step = b.label_tokens;
        if (run == 0) losses.push_back(r.loss);
        std::cerr << fmt::format("run {} step {}{} loss {:.5f} {:.1f} ms, tower ran {}x on {} {} ({} in the batch)",
                                 run, i, !timed ? " (warm-up)" : profiled ? " (profiled)" : "", r.loss, ms, tower_runs,
                                 tower_rows, processor->variable_size() ? "patches" : "images",
                                 b.pixel_values.size(0));
        if (profiled) {
          std::cerr << fmt::format(": profiler step {:.1f} = tower {:.1f}+{:.1f}, {} {:.1f}+{:.1f}, "
                                   "language model {:.1f}+{:.1f}, optimizer {:.1f}",
                                   split.step_ms, split.tower_fwd_ms, split.tower_bwd_ms, g_family->projector_name,
                                   split.projector_fwd_ms,
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
                {"model_type", mc.model_type},
                {"tower_range", g_family->tower_range},
                {"projector_range", g_family->projector_range},
                {"projector_name", g_family->projector_name},
                {"image_processor", processor->type()},
                {"image_processor_settings", processor->fingerprint()},
                {"images", image_info},
                {"batch", o.batch},
                {"images_per_step", o.batch},
                {"sample_tokens", o.sample_tokens},
                {"tokens_per_step", tokens_per_step},
                {"image_tokens_per_step_min", min_image_tokens},
                {"image_tokens_per_step_max", max_image_tokens},
                {"image_tokens_per_step_mean", static_cast<double>(sum_image_tokens) / static_cast<double>(n)},
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
                {"tower_rows_unit", processor->variable_size() ? "patches" : "images"},
                {"tower_rows_per_step_min", min_rows},
                {"tower_rows_per_step_max", max_rows},
                {"step_rows_min", min_step_rows},
                {"step_rows_max", max_step_rows},
                {"tower_rows_equal_step_rows", rows_match},
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
