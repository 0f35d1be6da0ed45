#include "eval/metrics.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/text.h"

namespace swiftcpp::eval {

namespace {

// A compiled Perl-compatible regex (Python's re syntax for what evaluation configs use: groups, (?s), classes).
class Pattern {
 public:
  explicit Pattern(const std::string& pattern) : pattern_(pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &code, &offset, nullptr);
    if (code_ == nullptr) {
      std::array<PCRE2_UCHAR, 256> buffer{};
      pcre2_get_error_message(code, buffer.data(), buffer.size());
      fail<ConfigError>("invalid regex '{}' at offset {}: {}", pattern, offset, reinterpret_cast<const char*>(buffer.data()));
    }
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    uint32_t groups = 0;
    pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &groups);
    groups_ = static_cast<int>(groups);
  }
  ~Pattern() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Every non-overlapping match from the left: [0] the whole match, [1..] the groups ("" when unset).
  std::vector<std::vector<std::string>> find_all(const std::string& s) const {
    std::vector<std::vector<std::string>> out;
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0, data_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail<FormatError>("matching the regex '{}' failed (code {})", pattern_, rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
      std::vector<std::string> m;
      for (int g = 0; g <= groups_; ++g) {
        m.push_back(ov[2 * g] == PCRE2_UNSET ? std::string() : s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
      }
      out.push_back(std::move(m));
      start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;  // an empty match moves on by one
      while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;  // stay on a character
    }
    return out;
  }

  // Every match replaced by nothing (re.sub(pattern, "", s)).
  std::string remove_all(const std::string& s) const {
    std::string out;
    size_t last = 0, start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0, data_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail<FormatError>("matching the regex '{}' failed (code {})", pattern_, rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
      out += s.substr(last, ov[0] - last);
      last = ov[1];
      start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
      while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
    }
    if (last < s.size()) out += s.substr(last);
    return out;
  }

  int groups() const { return groups_; }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
  int groups_ = 0;
};

}  // namespace

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
