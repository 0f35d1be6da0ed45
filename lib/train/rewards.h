// Reward functions of online RL (GRPO): ms-swift's built-in rule-based rewards (accuracy, format, soft_overlong,
// repetition, cosine) and external commands that score a batch of completions given as JSON lines. Each scores a
// whole batch at once and returns one number per completion; NaN means "does not apply" (weighted sums skip it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"

namespace swiftcpp {

/// One completion to score, with what its prompt row carried.
struct RewardSample {
  std::string prompt;       // the prompt's last user turn
  Json messages;            // the prompt conversation: [{"role", "content"}, ...]
  std::string completion;   // the generated text (an ending EOS not included)
  int64_t completion_tokens = 0;  // generated tokens (an ending EOS not included)
  bool truncated = false;   // stopped at max_completion_length without EOS
  Json fields;              // the row's other columns (e.g. "solution"), an object
  std::string where;        // the row's "file:line", for messages
};

/// The settings of the built-in rewards, named as ms-swift names them.
struct RewardSettings {
  int64_t max_completion_length = 512;
  int64_t soft_max_length = 0;    // 0: max_completion_length
  int64_t soft_cache_length = 0;  // required by soft_overlong: in [1, soft_max_length)
  int64_t repetition_n_grams = 3;
  double repetition_max_penalty = -1.0;
  double cosine_min_len_value_wrong = -0.5;
  double cosine_max_len_value_wrong = 0.0;
  double cosine_min_len_value_correct = 1.0;
  double cosine_max_len_value_correct = 0.5;
  int64_t cosine_max_len = 0;     // 0: max_completion_length
  double timeout_s = 300;         // external commands, per batch
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  /// The name logged as rewards/<name>/mean ("accuracy", ..., or "external" plus the command's first word).
  virtual const std::string& name() const = 0;
  /// One reward per sample, in order. Throws ConfigError / Error naming the row or the command on bad input.
  virtual std::vector<double> score(const std::vector<RewardSample>& samples) = 0;
};

/// The reward function a `reward_funcs` entry names:
///  - accuracy: 1 when the completion's answer equals the row's `solution` (GSM8K's "... #### N" or a bare answer)
///    after lm-eval's GSM8K extraction and normalisation as `swiftcpp eval` applies them (the "#### N" answer,
///    else the last number; commas, "$" and a final "." dropped), else 0. A row without a string `solution` is an
///    error naming the row.
///  - format: 1 when the completion is "<think>...</think>", optional whitespace, "<answer>...</answer>" and nothing
///    after (ms-swift's pattern, anchored at the start), else 0.
///  - soft_overlong: DAPO's overlong penalty, min(0, -(tokens - (soft_max_length - soft_cache_length)) /
///    soft_cache_length).
///  - repetition: repetition_max_penalty x (1 - distinct / total word n-grams) over the lower-cased,
///    whitespace-split completion (0 when it has fewer words than n).
///  - cosine: the accuracy reward shaped by length: with t = tokens, T = cosine_max_len,
///    v = hi - (hi - lo)(1 - cos(pi t / T)) / 2, going from the *_min_len_value to the *_max_len_value of correct
///    or wrong answers.
///  - external:COMMAND: `/bin/sh -c COMMAND` once per batch; stdin gets one JSON object per completion
///    ({"prompt", "messages", "completion", "completion_tokens", "truncated", ...the row's other fields}) and stdout
///    must give exactly one number per line in the same order ("nan" or "null": does not apply). A non-zero exit,
///    a signal, a timeout, a wrong number of lines or a line that is not a number throws Error quoting the
///    command and its stderr.
/// Throws ConfigError for an unknown name (listing the choices) or settings out of range for the function.
std::unique_ptr<RewardFunction> make_reward_function(const std::string& spec, const RewardSettings& settings);

/// GSM8K accuracy of one completion against a solution: 1 or 0 (the `accuracy` reward).
double gsm8k_accuracy(const std::string& completion, const std::string& solution);

/// ms-swift's format check (see make_reward_function), exposed for tests.
bool think_answer_format(const std::string& completion);

}  // namespace swiftcpp
