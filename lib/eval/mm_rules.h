// The answer-parsing rules of the two multimodal benchmark toolkits, as each one's scoring code applies them at
// the commits ../shared/assets/reference/mm_eval/README.md names (docs/eval.md paraphrases every rule):
// VLMEvalKit's option inference (can_infer), yes/no extraction and VQA normalisation, and lm-eval's multimodal
// fork lmms-eval's reasoning-tag strip, MMBench prefetch, static MCQ extraction, MMMU parsers and EvalAI
// normalisation; ChartQA's relaxed correctness is shared. Pure string functions: no model, no files.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "eval/pycompat.h"

namespace swiftcpp::eval::mm {

/// The options of a multiple-choice item in letter order: ('A', text), ('B', text), ... (missing ones left out).
using Options = std::vector<std::pair<char, std::string>>;

// ---- VLMEvalKit ----

/// can_infer_option: an option letter, "Z" (a refusal, or a lone "Z" token), or "" (nothing inferred).
std::string vlmeval_can_infer_option(const std::string& prediction, const Options& options);
/// can_infer_text: the one option whose lower-cased text occurs in the lower-cased prediction, within the length
/// guard (prediction at most twice the options' total length); "" otherwise.
std::string vlmeval_can_infer_text(const std::string& prediction, const Options& options);
/// can_infer: the option rule, else the text rule.
std::string vlmeval_can_infer(const std::string& prediction, const Options& options);
/// process_punctuation: the VQA punctuation step (its digit-comma-digit test and period rule).
std::string vlmeval_process_punctuation(const std::string& text);
/// process_answer: newlines and tabs to spaces, strip, punctuation, then numbers, articles and contractions.
std::string vlmeval_process_answer(const std::string& text);
/// YOrN_Extraction: "Yes", "No" or "Unknown" from the punctuation-split lower-cased words.
std::string vlmeval_yes_no(const std::string& prediction);

// ---- lmms-eval ----

/// strip_reasoning_tags with the CLI default tags (<think>, <analysis>): every closed block cut, everything up to
/// a closing tag left without its opening dropped, then strip().
std::string lmms_strip_reasoning(const std::string& response);
/// MMBench prefetch (MMBench_Evaluator.can_infer): bare-token letters A-E with the quantifier guard, then the
/// affix list, then the option text (no length guard); "" for nothing.
std::string lmms_mmbench_prefetch(const std::string& prediction, const Options& options);
/// _task_utils/mcq_extract.extract_mcq_answer: the highest-priority candidate letter (start, end, answer phrase,
/// "(X)", "X.", "X:", "X)", "X "; any occurrence as the last resort), the later one on ties; "" for none.
std::string lmms_extract_mcq_answer(const std::string& response, const std::vector<char>& letters);
/// EvalAIAnswerProcessor: lower-case, "," "?" removed, "'s" split, punctuation, periods, numbers, articles,
/// contractions.
std::string lmms_vqa_normalize(const std::string& text);

/// An MMMU multiple-choice parse: the letter, and whether it was drawn at random (no candidate found).
struct MmmuChoice {
  std::string letter;
  bool random_fallback = false;
};
/// parse_multi_choice_response: "(X)", then "X ", then "X.", then (over 5 words) the option texts; several
/// candidates: the last one in the text; none: random.choice(letters) from `rng`.
MmmuChoice lmms_mmmu_choice(const std::string& response, const Options& options, py::Random& rng);

/// A normalised open answer: a number rounded to 2 decimals, or lower-cased text.
struct OpenValue {
  bool is_number = false;
  double number = 0;
  std::string text;
  bool operator==(const OpenValue& o) const {
    return is_number == o.is_number && (is_number ? number == o.number : text == o.text);
  }
  std::string repr() const;  // Python's str() of the value
};
/// normalize_str.
std::vector<OpenValue> mmmu_normalize(const std::string& text);
/// parse_open_response: key sub-responses, the numbers in them, each normalised; duplicates removed (first seen
/// kept; Python's set order is not reproduced).
std::vector<OpenValue> mmmu_parse_open(const std::string& response);
/// eval_open: a text prediction containing a text gold, or a number equal to a number gold.
bool mmmu_eval_open(const std::string& gold, const std::vector<OpenValue>& predictions);

// ---- shared ----

/// _process_digit_article: lower-cased words, none/zero..ten to digits, articles dropped, contractions.
std::string vqa_digit_article(const std::string& text);
/// VQA accuracy terms: for each reference i, min(1, #{j != i : refs[j] == pred} / 3).
std::vector<double> vqa_matches(const std::string& prediction, const std::vector<std::string>& references);
/// relaxed_correctness: within 5% of a non-zero numeric target (percentages divided by 100), else the
/// case-insensitive strings equal.
bool relaxed_correctness(const std::string& target, const std::string& prediction);

}  // namespace swiftcpp::eval::mm
