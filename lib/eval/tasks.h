// Evaluation tasks: the public data layouts of MMLU, ARC, HellaSwag, GSM8K, plain-text perplexity and custom
// YAML tasks, read into the prompts lm-evaluation-harness poses (docs/eval.md gives each task's prompt). No
// model here: lib/eval/evaluator turns these items into log-likelihood and generation requests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"

namespace swiftcpp::eval {

enum class TaskKind { kMultipleChoice, kGeneration, kPerplexity };
const char* task_kind_name(TaskKind kind);

/// An item's image: a file, or JPEG/PNG bytes held in memory (a benchmark TSV's base64 cell) with the name of
/// where they came from. Nothing is opened until the item is planned or scored.
struct ImageRef {
  ImageRef() = default;
  ImageRef(fs::path path) : file(std::move(path)) {}  // NOLINT(google-explicit-constructor): a path is an image file
  ImageRef(std::shared_ptr<const std::string> data, std::string name) : bytes(std::move(data)), origin(std::move(name)) {}
  fs::path file;
  std::shared_ptr<const std::string> bytes;  // set: the encoded image; `origin` names it
  std::string origin;
  /// The file, or the in-memory image's origin (for messages and --log-samples).
  std::string name() const { return bytes ? origin : file.string(); }
};

/// One multiple-choice question: the model scores `delimiter + choices[i]` after `context`.
struct ChoiceItem {
  std::string context;               // the whole prompt: description, few-shot examples, the question
  std::vector<std::string> choices;  // continuations without the delimiter (lm-eval's doc_to_choice)
  std::string delimiter = " ";       // put between context and each choice (lm-eval's target_delimiter)
  int gold = 0;
  std::string group;   // MMLU subject; empty elsewhere
  std::string source;  // "file:line" of the question
  std::vector<ImageRef> images;  // image tasks: one per "<image>" in context (examples' first), in order
};

/// One generation question: greedy continuation of `context`, compared with `target` after extraction.
struct GenerationItem {
  std::string context;
  std::string target;  // the reference answer as the data gives it (GSM8K: the whole solution with "#### N")
  std::string source;
  std::vector<ImageRef> images;  // image tasks: one per "<image>" in context (examples' first), in order
};

/// One document of a perplexity task.
struct TextDocument {
  std::string text;
  std::string source;
};

/// How an answer is pulled out of a generated response (lm-eval's regex filter): the `group_select`-th match of
/// `regex` (0 first, -1 last); with capture groups, the first non-empty group of that match, else the whole
/// match. No match gives `fallback`.
struct AnswerFilter {
  std::string name;  // the metric's suffix, e.g. "strict-match"
  std::string regex;
  int group_select = 0;
  std::string fallback = "[invalid]";
};

/// Generation settings of a task and how its exact match compares strings.
struct GenerationSpec {
  std::vector<std::string> stop;
  int64_t max_new_tokens = 256;
  std::vector<AnswerFilter> filters;        // one exact_match metric per filter
  std::vector<std::string> ignore_regexes;  // removed from prediction and reference before comparing
  bool ignore_case = false;
};

/// A task read from disk, ready to score.
struct Task {
  std::string name;  // "mmlu", "arc_easy", ... or a custom task's name
  TaskKind kind = TaskKind::kMultipleChoice;
  std::string source;  // the file or folder read
  int num_fewshot = 0;
  std::string fewshot_source;  // where the few-shot examples came from (empty with 0 shots)
  std::vector<ChoiceItem> choice_items;
  std::vector<GenerationItem> generation_items;
  std::vector<TextDocument> documents;
  GenerationSpec generation;
  std::map<std::string, std::string> categories;  // group -> category (MMLU subject -> STEM, ...)
  bool has_images = false;  // a custom task with image_field: its items carry images (a vision-language model's task)
};

/// Settings that apply to every task of a run.
struct TaskOptions {
  std::optional<int> num_fewshot;  // unset: each task's default (MMLU 5, GSM8K 5, others 0)
  std::optional<int64_t> limit;    // the first N items of each task (MMLU: of each subject, as lm-eval does)
  uint64_t seed = 1234;            // few-shot sampling where examples come from the evaluated split
};

/// GSM8K's generation settings as lm-eval's gsm8k task has them: stops, 256 new tokens, the strict-match ("#### N")
/// and flexible-extract (last number) filters and the exact-match normalisation (commas, "$", the reasoning before
/// "#### " and a final "." removed; case ignored).
GenerationSpec gsm8k_spec();

/// The built-in task names: mmlu (and mmlu_<subject>), arc_easy, arc_challenge, hellaswag, gsm8k, perplexity.
std::vector<std::string> builtin_task_names();

/// Reads one task from a `--tasks` entry: "NAME" (data found under `data_dir` as docs/eval.md lists),
/// "NAME=PATH" (a built-in task read from PATH) or "FILE.yaml" (a custom task). Throws ConfigError for an
/// unknown task name or a bad option, IoError for a missing file (naming the paths tried), FormatError naming the
/// file and line for malformed data (a CSV row with the wrong number of fields, a gold index out of range, a
/// missing field); nothing is skipped silently. A custom task with `image_field` gives items with images: a row's
/// prompt keeps the "<image>" placeholders it writes (one per image) or gets one "<image>\n" per image in front;
/// an image file that does not exist is an IoError naming the data file:line and the image, a placeholder count
/// that differs from the row's images a FormatError naming file:line.
Task load_task(const std::string& spec, const fs::path& data_dir, const TaskOptions& options);

/// Checks a `--tasks` entry's name without reading data, so a typo is reported before any loading. Throws
/// ConfigError listing the built-in tasks.
void check_task_name(const std::string& spec);

// ---- the pieces, exposed for tests ----

/// Parses RFC 4180 CSV (quoted fields with commas, doubled quotes and newlines). Each row comes with the line
/// it starts on. Throws FormatError naming `origin` and the line of an unterminated quote.
std::vector<std::pair<size_t, std::vector<std::string>>> parse_csv(const std::string& text, const std::string& origin);

/// lm-eval's HellaSwag text cleanup: strip, " [title]" -> ". ", drop "[...]" tags, "  " -> " ".
std::string hellaswag_preprocess(const std::string& text);

/// Substitutes "{field}" (dotted paths into nested objects, list indices as numbers: {choices.0}) from a JSON
/// row; "{{" and "}}" are literal braces. Throws FormatError naming `origin` and the field when it is missing.
std::string render_fields(const std::string& templ, const Json& row, const std::string& origin);

}  // namespace swiftcpp::eval
