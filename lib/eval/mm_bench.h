// Multimodal benchmarks scored the way the field scores them: POPE, MMBench (circular), ScienceQA-IMG, MMMU,
// TextVQA and ChartQA read from VLMEvalKit's TSV layout or lmms-eval's rows, with a prediction per row, scored by
// either toolkit's rules (lib/eval/mm_rules.h) into per-item results and the aggregates and per-category tables
// each toolkit reports. docs/eval.md lists the layouts, the rules and where the two toolkits disagree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"
#include "eval/mm_rules.h"
#include "eval/tasks.h"

namespace swiftcpp::eval::mm {

enum class Benchmark { kPope, kMMBench, kScienceQA, kMMMU, kTextVQA, kChartQA };
enum class Rules { kVLMEvalKit, kLmmsEval };

/// "pope", "mmbench", "scienceqa_img", "mmmu", "textvqa", "chartqa".
const char* benchmark_name(Benchmark benchmark);
std::vector<std::string> benchmark_names();
/// The benchmark of a name (also VLMEvalKit's dataset names: POPE, MMBench_DEV_EN, ScienceQA_TEST, MMMU_DEV_VAL,
/// TextVQA_VAL, ChartQA_TEST, case-insensitive); nullopt for another name.
std::optional<Benchmark> parse_benchmark(const std::string& name);
/// "vlmevalkit" or "lmms-eval".
const char* rules_name(Rules rules);
/// Throws ConfigError naming the accepted values.
Rules parse_rules(const std::string& name);

/// One row of a benchmark, whichever layout it came from.
struct BenchItem {
  std::string source;   // "file:line"
  int64_t index = 0;    // VLMEvalKit's index (MMBench: question g's rotation k is g + k * 1000000)
  std::string id;       // MMMU's id ("validation_<Subject>_<n>"), lmms-eval's question_id
  std::string question;
  std::string hint;
  Options options;      // multiple choice: the options present, in letter order
  std::string answer;   // the gold letter, Yes/No, the gold text, or (TextVQA, ChartQA) a Python list literal
  std::vector<std::string> answers;     // TextVQA's ten answers as lmms-eval rows give them
  std::vector<std::string> categories;  // POPE: the splits the question belongs to
  std::string category;                 // MMBench, ScienceQA, MMMU (the subject)
  std::string l2_category;              // MMBench
  std::string split;                    // MMBench (dev), ChartQA (human_test / augmented_test), ...
  std::string question_type;            // MMMU: multiple-choice or open
  /// The row's images as the file gives them: VLMEvalKit's base64 cell (or a list literal of them, or a reference
  /// to another row's index), lmms-eval's paths (`image`, or MMMU's `image_1`..`image_7`).
  std::vector<std::string> images;
  std::optional<std::string> prediction;
};

struct BenchData {
  Benchmark benchmark = Benchmark::kPope;
  std::string layout;  // "vlmevalkit" (TSV) or "lmms-eval" (JSON Lines)
  std::string file;
  std::vector<BenchItem> items;
  // The rows as read, to write them back with predictions: the TSV's columns (without `image` and `prediction`)
  // and cells, or lmms-eval's documents.
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> cells;
  std::vector<Json> docs;
};

/// Reads a VLMEvalKit benchmark TSV (pandas' read_csv: tab-separated, a header row, double-quoted fields with ""
/// inside, empty cells missing), with an optional `prediction` column as VLMEvalKit's inference writes it. Throws
/// IoError for an unreadable file and FormatError naming file:line and the column for a missing column, a row
/// with the wrong number of fields, a non-integer or repeated index, a bad answer, or (MMBench) a rotation whose
/// question is missing.
BenchData read_vlmeval_tsv(const fs::path& file, Benchmark benchmark, bool keep_images = true);

/// Reads lmms-eval rows (JSON Lines): documents with the task's fields plus a `prediction` (or `response`), or
/// lmms-eval's --log_samples records ({"doc": {...}, "resps": [[text]], ...}). Throws FormatError naming
/// file:line and the field.
BenchData read_lmms_rows(const fs::path& file, Benchmark benchmark);

/// Reads either layout by the file's extension (.tsv: VLMEvalKit; .jsonl / .json: lmms-eval).
BenchData read_benchmark(const fs::path& file, Benchmark benchmark, bool keep_images = true);

struct ScoreOptions {
  Rules rules = Rules::kVLMEvalKit;
  bool strip_reasoning = true;  // lmms-eval: --reasoning_tags default (think, analysis); false: "none"
  /// lmms-eval's MMMU open questions: the official contract (every parsed candidate compared); false: as
  /// lmms-eval scores them at the pinned commit (only one candidate string kept, so never right).
  bool mmmu_official_open = true;
  uint64_t seed = 0;  // lmms-eval's random.seed for MMMU's random fallback letters
};

/// One row's (or, for MMBench under VLMEvalKit, one rotation's) result.
struct ItemResult {
  std::string source;
  int64_t index = 0;
  std::string id;
  std::string prediction;  // as scored (after the reasoning strip where the rules apply one)
  std::string parsed;      // the extracted letter / yes-no / normalised answer ("" none)
  double score = 0;        // the row's score (MMBench: its question's circular hit)
  Json detail;             // the rule's intermediate values, named as the toolkit names them
};

/// A report table in the toolkit's column order (VLMEvalKit prints its report as such a table).
struct ReportTable {
  std::string title;
  std::vector<std::string> columns;
  std::vector<std::pair<std::string, std::vector<double>>> rows;  // row label, one value per column (NaN: none)
};

struct BenchResult {
  Benchmark benchmark = Benchmark::kPope;
  Rules rules = Rules::kVLMEvalKit;
  std::vector<ItemResult> items;
  /// The toolkit's aggregates: VLMEvalKit's report as {row: {column: value}} (splits x Overall, abbreviations
  /// and categories) or {column: value}; lmms-eval's metrics by name.
  Json aggregate;
  std::vector<ReportTable> tables;
  std::string headline_metric;  // VLMEvalKit POPE: F1 (its "Overall"); lmms-eval POPE: accuracy; ...
  double headline = 0;
};

/// Scores every row that has a prediction. Throws FormatError naming the row for a row without one, a bad gold
/// answer, or an MMBench rotation group without its question row.
BenchResult score_benchmark(const BenchData& data, const ScoreOptions& options);

/// A piece of a prompt: text, or the place of the row's next image.
struct PromptPart {
  bool image = false;
  std::string text;
};

/// The prompt a toolkit poses for a row by default: VLMEvalKit's build_prompt (the image first, or at MMMU's
/// "<image k>" marks; "Hint:", "Question:", "Options:" for multiple choice) or lmms-eval's doc_to_text with its
/// default post-prompt (images first).
std::vector<PromptPart> benchmark_prompt(const BenchItem& item, Benchmark benchmark, Rules rules);
/// The parts as one user message: kImagePlaceholder for each image ("<image>\n" when it opens the prompt).
std::string prompt_text(const std::vector<PromptPart>& parts);

/// The images of a row as the model reads them: VLMEvalKit's base64 decoded (a cell of at most 64 characters is
/// another row's index, whose image it shares), lmms-eval's paths resolved against the rows file's folder. Throws
/// FormatError naming file:line for undecodable base64, a reference to no row, or a row without an image; IoError
/// for a missing image file.
std::vector<std::vector<ImageRef>> benchmark_images(const BenchData& data);

/// Writes the rows back with a prediction each, in the layout they came in: VLMEvalKit's TSV (its columns
/// without `image`, then `prediction`, quoted as pandas writes) or lmms-eval's --log_samples records. Written
/// under a temporary name and renamed.
void write_predictions(const BenchData& data, const std::vector<std::string>& predictions, const fs::path& file);

/// The aggregates as markdown tables: VLMEvalKit's reports one row per split, lmms-eval's metrics one per line.
std::string result_markdown(const BenchResult& result);

}  // namespace swiftcpp::eval::mm
