// Scoring as lm-evaluation-harness defines it: multiple choice by summed log-likelihood (acc) and by
// log-likelihood per character of the choice (acc_norm), exact match after regex extraction, perplexities from
// summed log-likelihoods, and the standard error of a mean.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/tasks.h"

namespace swiftcpp::eval {

/// Index of the largest value; the first one on ties (numpy's argmax). -1 for an empty vector.
int argmax(const std::vector<double>& values);

/// Number of Unicode code points in UTF-8 text (Python's len(str)); a stray byte counts as one.
size_t count_code_points(const std::string& text);

/// The decision on one multiple-choice item.
struct ChoiceOutcome {
  int pred = -1;       // argmax of the summed log-likelihoods
  int pred_norm = -1;  // argmax of log-likelihood / len(choice) in characters, as lm-eval computes acc_norm
  bool correct = false;
  bool correct_norm = false;
};

/// Throws FormatError when the sizes differ or `gold` is out of range.
ChoiceOutcome decide_choice(const std::vector<double>& loglikelihoods, const std::vector<std::string>& choices,
                            int gold);

/// The mean of `values` and its standard error: sample standard deviation (n - 1) / sqrt(n), lm-eval's
/// mean_stderr. The stderr is NaN for fewer than two values.
struct MeanStderr {
  double mean = 0;
  double stderr_ = 0;
  int64_t n = 0;
};
MeanStderr mean_stderr(const std::vector<double>& values);

/// Applies an AnswerFilter to a response.
std::string extract_answer(const std::string& response, const AnswerFilter& filter);

/// lm-eval's exact_match preprocessing: each regex removed (in order), then lower-cased when `ignore_case`.
std::string normalize_answer(const std::string& text, const std::vector<std::string>& ignore_regexes, bool ignore_case);

/// Perplexity figures of a set of documents from their summed log-likelihood (natural log).
struct PerplexityStats {
  double loglikelihood = 0;  // sum over predicted tokens
  int64_t tokens = 0;        // predicted tokens
  int64_t words = 0;         // whitespace-separated pieces of the documents (lm-eval's re.split(r"\s+"))
  int64_t bytes = 0;         // UTF-8 bytes of the documents
  double token_perplexity() const;
  double word_perplexity() const;
  double byte_perplexity() const;
  double bits_per_byte() const;
};

/// lm-eval's word count of a document: len(re.split(r"\s+", text)).
int64_t count_words(const std::string& text);

}  // namespace swiftcpp::eval
