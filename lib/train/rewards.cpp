#include "train/rewards.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/process.h"
#include "eval/metrics.h"
#include "eval/tasks.h"

namespace swiftcpp {

namespace {

// What an external reward command may print: one number a line, so 4 KiB a completion is generous; at least 1 MiB
// (stderr too, for its messages).
constexpr int64_t kRewardOutputBytesPerSample = 4096;
constexpr int64_t kMinRewardOutputBytes = int64_t{1} << 20;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

const std::string& solution_of(const RewardSample& s, const std::string& reward) {
  const auto it = s.fields.find("solution");
  if (it == s.fields.end() || !it->is_string()) {
    fail<ConfigError>("{}: the {} reward needs a string 'solution' column (GSM8K rows give it from 'answer')",
                      s.where.empty() ? "a prompt row" : s.where, reward);
  }
  return it->get_ref<const std::string&>();
}

class NamedReward : public RewardFunction {
 public:
  explicit NamedReward(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
};

class AccuracyReward : public NamedReward {
 public:
  AccuracyReward() : NamedReward("accuracy") {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const auto& s : samples) out.push_back(gsm8k_accuracy(s.completion, solution_of(s, "accuracy")));
    return out;
  }
};

class FormatReward : public NamedReward {
 public:
  FormatReward() : NamedReward("format") {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const auto& s : samples) out.push_back(think_answer_format(s.completion) ? 1.0 : 0.0);
    return out;
  }
};

class SoftOverlongReward : public NamedReward {
 public:
  SoftOverlongReward(int64_t max_length, int64_t cache_length)
      : NamedReward("soft_overlong"), max_(max_length), cache_(cache_length) {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    const double expected = static_cast<double>(max_ - cache_);
    for (const auto& s : samples) {
      const double exceed = static_cast<double>(s.completion_tokens) - expected;
      out.push_back(std::min(0.0, -exceed / static_cast<double>(cache_)));
    }
    return out;
  }

 private:
  int64_t max_, cache_;
};

class RepetitionReward : public NamedReward {
 public:
  RepetitionReward(int64_t n, double max_penalty) : NamedReward("repetition"), n_(n), max_penalty_(max_penalty) {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    for (const auto& s : samples) {
      std::vector<std::string> words;
      std::string word;
      for (char c : s.completion) {
        if (is_space(c)) {
          if (!word.empty()) words.push_back(std::move(word));
          word.clear();
        } else {
          word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        }
      }
      if (!word.empty()) words.push_back(std::move(word));
      const auto n = static_cast<size_t>(n_);
      if (words.size() < n) {
        out.push_back(0.0);
        continue;
      }
      std::set<std::vector<std::string>> distinct;
      size_t total = 0;
      for (size_t i = 0; i + n <= words.size(); ++i, ++total) {
        distinct.insert(std::vector<std::string>(words.begin() + static_cast<std::ptrdiff_t>(i),
                                                 words.begin() + static_cast<std::ptrdiff_t>(i + n)));
      }
      const double scaling = 1.0 - static_cast<double>(distinct.size()) / static_cast<double>(total);
      out.push_back(scaling * max_penalty_);
    }
    return out;
  }

 private:
  int64_t n_;
  double max_penalty_;
};

class CosineReward : public NamedReward {
 public:
  explicit CosineReward(const RewardSettings& s) : NamedReward("cosine"), s_(s) {}
  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::vector<double> out;
    const double T = static_cast<double>(s_.cosine_max_len > 0 ? s_.cosine_max_len : s_.max_completion_length);
    for (const auto& s : samples) {
      const bool correct = gsm8k_accuracy(s.completion, solution_of(s, "cosine")) >= 1.0;
      // From the value at length 0 (hi) to the value at length T (lo), along half a cosine period.
      const double hi = correct ? s_.cosine_min_len_value_correct : s_.cosine_min_len_value_wrong;
      const double lo = correct ? s_.cosine_max_len_value_correct : s_.cosine_max_len_value_wrong;
      const double t = static_cast<double>(s.completion_tokens);
      out.push_back(hi - (hi - lo) * (1.0 - std::cos(t * M_PI / T)) / 2.0);
    }
    return out;
  }

 private:
  RewardSettings s_;
};

class ExternalReward : public NamedReward {
 public:
  ExternalReward(std::string command, double timeout_s)
      : NamedReward(external_name(command)), command_(std::move(command)), timeout_s_(timeout_s) {}

  std::vector<double> score(const std::vector<RewardSample>& samples) override {
    std::string input;
    for (const auto& s : samples) {
      Json line = Json::object();
      line["prompt"] = s.prompt;
      line["messages"] = s.messages;
      line["completion"] = s.completion;
      line["completion_tokens"] = s.completion_tokens;
      line["truncated"] = s.truncated;
      for (const auto& [key, value] : s.fields.items()) {
        if (!line.contains(key)) line[key] = value;
      }
      input += line.dump() + "\n";
    }
    // One number a line is all it may print: a runaway command is stopped before its output fills the memory.
    const int64_t limit = std::max<int64_t>(kMinRewardOutputBytes, kRewardOutputBytesPerSample *
                                                                      static_cast<int64_t>(samples.size()));
    const ProcessResult r = run_command(command_, input, timeout_s_, limit);
    const std::string err = r.err.empty() ? "" : fmt::format("; its stderr:\n{}", tail(r.err, 2000));
    if (r.output_exceeded) {
      fail<Error>("reward command '{}' printed more than {} bytes for {} completions (killed): one number per line is "
                  "expected{}", command_, limit, samples.size(), err);
    }
    if (r.timed_out) {
      fail<Error>("reward command '{}' did not finish within reward_timeout {} s for {} completions (killed){}",
                  command_, timeout_s_, samples.size(), err);
    }
    if (r.exit_code != 0) {
      fail<Error>("reward command '{}' failed ({}){}", command_,
                  r.exit_code > 128 ? fmt::format("killed by signal {}", r.exit_code - 128)
                                    : fmt::format("exit status {}", r.exit_code),
                  err);
    }
    std::vector<std::string> lines;
    std::istringstream stream(r.out);
    for (std::string line; std::getline(stream, line);) {
      while (!line.empty() && is_space(line.back())) line.pop_back();
      size_t start = 0;
      while (start < line.size() && is_space(line[start])) ++start;
      line = line.substr(start);
      if (!line.empty()) lines.push_back(line);
    }
    if (lines.size() != samples.size()) {
      fail<Error>("reward command '{}' printed {} non-empty lines for {} completions: one number per line, in "
                  "order, is expected{}", command_, lines.size(), samples.size(), err);
    }
    std::vector<double> out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l == "nan" || l == "NaN" || l == "null" || l == "None") {
        out.push_back(kNaN);
        continue;
      }
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(l.c_str(), &end);
      if (end == l.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
        fail<Error>("reward command '{}': line {} of its output is '{}', not a finite number (or nan/null)", command_,
                    i + 1, tail(l, 80));
      }
      out.push_back(v);
    }
    return out;
  }

 private:
  static std::string external_name(const std::string& command) {
    // The command's program name without folders: "external:python3 r.py" logs rewards/external_python3/mean.
    size_t start = 0;
    while (start < command.size() && is_space(command[start])) ++start;
    size_t end = start;
    while (end < command.size() && !is_space(command[end])) ++end;
    std::string word = command.substr(start, end - start);
    const size_t slash = word.rfind('/');
    if (slash != std::string::npos) word = word.substr(slash + 1);
    return word.empty() ? "external" : "external_" + word;
  }

  std::string command_;
  double timeout_s_;
};

}  // namespace

double gsm8k_accuracy(const std::string& completion, const std::string& solution) {
  const eval::GenerationSpec spec = eval::gsm8k_spec();
  std::string answer = eval::extract_answer(completion, spec.filters[0]);  // "#### N"
  if (answer == spec.filters[0].fallback) answer = eval::extract_answer(completion, spec.filters[1]);  // the last number
  if (answer == spec.filters[1].fallback) return 0.0;
  const std::string gold = eval::normalize_answer(solution, spec.ignore_regexes, spec.ignore_case);
  const std::string got = eval::normalize_answer(answer, spec.ignore_regexes, spec.ignore_case);
  return !gold.empty() && got == gold ? 1.0 : 0.0;
}

bool think_answer_format(const std::string& s) {
  // ^<think>.*?</think>\s*<answer>.*?</answer>$ with "." matching newlines: the text starts with <think>, ends
  // with </answer>, and some </think> after the opening tag is followed by whitespace and an <answer> that opens
  // before the final </answer>.
  static const std::string open_think = "<think>", close_think = "</think>", open_answer = "<answer>",
                           close_answer = "</answer>";
  if (s.size() < open_think.size() + close_think.size() + open_answer.size() + close_answer.size()) return false;
  if (s.compare(0, open_think.size(), open_think) != 0) return false;
  if (s.compare(s.size() - close_answer.size(), close_answer.size(), close_answer) != 0) return false;
  const size_t answer_end = s.size() - close_answer.size();  // where the final </answer> starts
  for (size_t at = s.find(close_think, open_think.size()); at != std::string::npos; at = s.find(close_think, at + 1)) {
    size_t j = at + close_think.size();
    while (j < s.size() && is_space(s[j])) ++j;
    if (s.compare(j, open_answer.size(), open_answer) == 0 && j + open_answer.size() <= answer_end) return true;
  }
  return false;
}

std::unique_ptr<RewardFunction> make_reward_function(const std::string& spec, const RewardSettings& s) {
  const std::string external = "external:";
  if (spec.compare(0, external.size(), external) == 0) {
    const std::string command = spec.substr(external.size());
    if (command.find_first_not_of(" \t") == std::string::npos) {
      fail<ConfigError>("'reward_funcs': '{}' names no command (external:COMMAND)", spec);
    }
    return std::make_unique<ExternalReward>(command, s.timeout_s);
  }
  if (spec == "accuracy") return std::make_unique<AccuracyReward>();
  if (spec == "format") return std::make_unique<FormatReward>();
  if (spec == "soft_overlong") {
    const int64_t max_length = s.soft_max_length > 0 ? s.soft_max_length : s.max_completion_length;
    if (s.soft_cache_length <= 0 || s.soft_cache_length >= max_length) {
      fail<ConfigError>("reward soft_overlong needs 'soft_cache_length' in [1, {}) (soft_max_length {}), got {}",
                        max_length, max_length, s.soft_cache_length);
    }
    return std::make_unique<SoftOverlongReward>(max_length, s.soft_cache_length);
  }
  if (spec == "repetition") return std::make_unique<RepetitionReward>(s.repetition_n_grams, s.repetition_max_penalty);
  if (spec == "cosine") return std::make_unique<CosineReward>(s);
  fail<ConfigError>("'reward_funcs': unknown reward '{}': choose accuracy, format, soft_overlong, repetition, cosine "
                    "or external:COMMAND", spec);
}

}  // namespace swiftcpp
