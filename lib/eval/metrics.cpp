#include "eval/metrics.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/text.h"
#include "eval/regex.h"

namespace swiftcpp::eval {

int argmax(const std::vector<double>& values) {
  if (values.empty()) return -1;
  return static_cast<int>(std::max_element(values.begin(), values.end()) - values.begin());
}

size_t count_code_points(const std::string& text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

ChoiceOutcome decide_choice(const std::vector<double>& loglikelihoods, const std::vector<std::string>& choices,
                            int gold) {
  if (loglikelihoods.size() != choices.size() || choices.empty()) {
    fail<FormatError>("{} log-likelihoods for {} choices", loglikelihoods.size(), choices.size());
  }
  if (gold < 0 || gold >= static_cast<int>(choices.size())) {
    fail<FormatError>("gold index {} is out of range for {} choices", gold, choices.size());
  }
  std::vector<double> normed(choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    // lm-eval divides by float(len(choice)); an empty choice would divide by zero there, here it keeps its sum.
    const double len = static_cast<double>(count_code_points(choices[i]));
    normed[i] = len > 0 ? loglikelihoods[i] / len : loglikelihoods[i];
  }
  ChoiceOutcome out;
  out.pred = argmax(loglikelihoods);
  out.pred_norm = argmax(normed);
  out.correct = out.pred == gold;
  out.correct_norm = out.pred_norm == gold;
  return out;
}

MeanStderr mean_stderr(const std::vector<double>& values) {
  MeanStderr r;
  r.n = static_cast<int64_t>(values.size());
  if (values.empty()) {
    r.mean = std::nan("");
    r.stderr_ = std::nan("");
    return r;
  }
  double sum = 0;
  for (double v : values) sum += v;
  r.mean = sum / static_cast<double>(r.n);
  if (r.n < 2) {
    r.stderr_ = std::nan("");
    return r;
  }
  double ss = 0;
  for (double v : values) ss += (v - r.mean) * (v - r.mean);
  r.stderr_ = std::sqrt(ss / static_cast<double>(r.n - 1)) / std::sqrt(static_cast<double>(r.n));
  return r;
}

std::string extract_answer(const std::string& response, const AnswerFilter& filter) {
  if (filter.regex.empty()) return response;
  const Pattern pattern(filter.regex);
  const auto matches = pattern.find_all(response);
  if (matches.empty()) return filter.fallback;
  const int count = static_cast<int>(matches.size());
  const int index = filter.group_select < 0 ? count + filter.group_select : filter.group_select;
  if (index < 0 || index >= count) return filter.fallback;
  const auto& m = matches[index];
  std::string answer;
  if (pattern.groups() <= 1) {
    answer = m[pattern.groups()];  // findall gives the whole match, or the one group
  } else {
    // findall gives the groups; with several, lm-eval keeps the first non-empty one.
    bool found = false;
    for (size_t g = 1; g < m.size() && !found; ++g) {
      if (!m[g].empty()) {
        answer = m[g];
        found = true;
      }
    }
    if (!found) return filter.fallback;
  }
  return strip_whitespace(answer);
}

std::string normalize_answer(const std::string& text, const std::vector<std::string>& ignore_regexes, bool ignore_case) {
  std::string s = text;
  for (const auto& r : ignore_regexes) s = Pattern(r).remove_all(s);
  if (ignore_case) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  }
  return s;
}

double PerplexityStats::token_perplexity() const { return std::exp(-loglikelihood / static_cast<double>(tokens)); }
double PerplexityStats::word_perplexity() const { return std::exp(-loglikelihood / static_cast<double>(words)); }
double PerplexityStats::byte_perplexity() const { return std::exp(-loglikelihood / static_cast<double>(bytes)); }
double PerplexityStats::bits_per_byte() const { return -loglikelihood / static_cast<double>(bytes) / std::log(2.0); }

int64_t count_words(const std::string& text) {
  // re.split(r"\s+", text): pieces between whitespace runs, including empty ones at either end.
  int64_t pieces = 1;
  bool in_space = false;
  for (unsigned char c : text) {
    const bool space = std::isspace(c) != 0;
    if (space && !in_space) ++pieces;
    in_space = space;
  }
  return pieces;
}

}  // namespace swiftcpp::eval
