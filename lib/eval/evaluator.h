// Runs evaluation tasks on a model: prompts tokenised the way lm-evaluation-harness does, multiple choice scored
// by log-likelihood, generation tasks by greedy decoding and answer extraction, perplexity by rolling windows;
// results with standard errors, per-sample records, and the results JSON and markdown table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "eval/metrics.h"
#include "eval/scorer.h"
#include "eval/tasks.h"
#include "data/collate.h"
#include "data/encode.h"
#include "vision/image_processor.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {
class TextTokenizer;
class ChatTemplate;
struct ImageEncoding;
}  // namespace swiftcpp

namespace swiftcpp::eval {

struct EvalOptions {
  ScorerOptions scorer;           // batch size (also for generation) and model input length
  std::optional<bool> add_bos;    // unset: the tokenizer's own setting (tokenizer_config.json add_bos_token)
  std::shared_ptr<const ChatTemplate> chat_template;  // set: each prompt is one user turn of this template
  int64_t stride = 0;             // perplexity window stride; 0: max_length (lm-eval's disjoint windows)
  bool log_samples = false;       // keep a JSON record per item
  bool keep_requests = false;     // keep the multiple-choice requests' token ids (for baselines and debugging)
  fs::path model_dir;             // tasks with images: the model folder, whose preprocessor_config.json prepares them
  vision::ImageProcessorOverrides image_overrides;  // min_pixels / max_pixels over the folder's settings
  /// The image settings the model's session opened (ModelAssets::images); unset: made from model_dir when a task
  /// has images.
  std::shared_ptr<const ImageEncoding> images;
};

/// One reported number. `level` is "task", "group" (MMLU category or the macro average) or "subtask" (subject).
struct MetricResult {
  std::string task;
  std::string metric;
  double value = 0;
  double stderr_ = 0;  // NaN where undefined (perplexities, fewer than two items)
  int64_t n = 0;
  int num_fewshot = 0;
  std::string level = "task";
};

struct TaskResult {
  std::string task;
  TaskKind kind = TaskKind::kMultipleChoice;
  std::string source;
  std::string fewshot_source;
  int num_fewshot = 0;
  int64_t items = 0;
  int64_t requests = 0;  // continuations scored, or generations, or windows
  int64_t tokens = 0;    // tokens of the requests (contexts once each, continuations once each; before any cut)
  double seconds = 0;         // tokenisation + model time
  double encode_seconds = 0;  // tokenisation alone
  std::vector<MetricResult> metrics;
  std::vector<Json> samples;  // with log_samples
  std::vector<LoglikelihoodRequest> scored;  // with keep_requests: the token ids scored (multiple choice)
};

/// Called with (items done, items in the task) while a task runs.
using EvalProgress = std::function<void(int64_t, int64_t)>;

/// Greedy generations of a list of prompts, in the prompts' order.
struct Generations {
  struct Output {
    std::string text;           // decoded new tokens, cut before a stop string
    std::string finish_reason;  // "eos" | "stop" | "length"
    int64_t new_tokens = 0;
  };
  std::vector<Output> outputs;
  int64_t prompt_tokens = 0;   // after any cut
  double encode_seconds = 0;   // tokenisation (and image planning)
};

class Evaluator {
 public:
  /// Throws ConfigError on bad options.
  Evaluator(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer, EvalOptions options);

  /// Runs one task. Throws ConfigError / FormatError on requests the model cannot take, what check() throws, and
  /// for tasks with images IoError / FormatError naming the item's data file:line and the image when an image
  /// cannot be read or decoded.
  TaskResult run(const Task& task, const EvalProgress& progress = {});

  /// Greedy generation of each item's context (the chat template applied when set, images where its placeholders
  /// are) for at most spec.max_new_tokens tokens, stopping at spec.stop or EOS; prompts cut from the left to
  /// max_length - max_new_tokens as lm-eval does, batched longest first. `task` names the prompts in messages;
  /// with images, check() must have accepted a task with images first. Throws what run() throws for generation.
  Generations generate(const std::string& task, const std::vector<GenerationItem>& items, const GenerationSpec& spec,
                       const EvalProgress& progress = {});

  /// Checks, without running it, that the model can take `task`: a task with images (Task::has_images) needs a
  /// vision-language model whose folder (EvalOptions::model_dir) holds preprocessor_config.json and whose tokenizer
  /// encodes "<image>" to the model's image token. Throws ConfigError naming the task, and what reading
  /// preprocessor_config.json throws (vision::load_image_processor_config).
  void check(const Task& task);

  /// lm-eval's tokenisation of (context, continuation) pairs sharing a context: trailing whitespace of the
  /// context moves to the continuations, each pair is encoded whole and its continuation is what follows the
  /// length of the context's own encoding. An empty context becomes BOS (else EOS). Throws ConfigError when it
  /// is empty and the tokenizer has neither.
  LoglikelihoodRequest encode_request(const std::string& context, const std::vector<std::string>& continuations) const;
  /// Text -> ids: special-token strings parsed, BOS first when add_bos (once, even when the text writes it).
  std::vector<int64_t> encode(const std::string& text) const;

 private:
  TaskResult run_choice(const Task& task, const EvalProgress& progress);
  TaskResult run_generation(const Task& task, const EvalProgress& progress);
  TaskResult run_perplexity(const Task& task, const EvalProgress& progress);
  std::string prompt_text(const std::string& context) const;  // the chat template applied when set
  // Vision-language models: context ids with each image token expanded to as many copies as its image takes
  // positions, after checking they hold one image token per image (FormatError naming `source`). Text models: the
  // ids unchanged.
  std::vector<int64_t> expand_images(std::vector<int64_t> ids, const std::vector<ImageRef>& images,
                                     const std::string& source) const;
  // An item's images read and preprocessed, as a forward takes them, and the positions each takes.
  struct LoadedImages {
    ImageInputs inputs;
    std::vector<int64_t> tokens;
  };
  LoadedImages load_images(const std::vector<ImageRef>& images, const std::string& source) const;
  // The text with each image placeholder replaced by the family's image markup (MultimodalConfig::image_markup).
  std::string image_markup(std::string text) const;

  CausalLM model_;
  std::shared_ptr<const TextTokenizer> tokenizer_;
  EvalOptions options_;
  Scorer scorer_;
  bool add_bos_ = true;
  std::shared_ptr<const ImageEncoding> images_;  // set by check() for the first task with images
};

/// The markdown table of a run's metrics: | Task | Metric | Value | Stderr | n | Shots |, subjects indented.
std::string results_markdown(const std::vector<TaskResult>& results);

/// The metrics of a run as JSON records {task, metric, value, stderr, n, num_fewshot, level} (NaN -> null).
Json metrics_json(const std::vector<TaskResult>& results);

}  // namespace swiftcpp::eval
