#include "train/rewards.h"

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "eval/metrics.h"
#include "eval/tasks.h"

namespace swiftcpp {

namespace {

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
    const CommandOutput r = run_command(command_, input, timeout_s_);
    const std::string err = r.err.empty() ? "" : fmt::format("; its stderr:\n{}", tail(r.err, 2000));
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

CommandOutput run_command(const std::string& command, const std::string& input, double timeout_s) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) fail<IoError>("cannot run '{}': pipe: {}", command, std::strerror(errno));
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    fail<IoError>("cannot run '{}': pipe: {}", command, std::strerror(errno));
  }
  // A command that exits without reading all its input makes our writes fail with EPIPE; SIGPIPE stays blocked in
  // this thread meanwhile (and a pending one is consumed) so that it cannot end the process.
  sigset_t pipe_signal, old_mask;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
  const pid_t pid = fork();
  if (pid < 0) {
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    fail<IoError>("cannot run '{}': fork: {}", command, std::strerror(errno));
  }
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    setpgid(0, 0);  // its own process group, so a timeout kills what it started too
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    signal(SIGPIPE, SIG_DFL);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  int to_child = in_pipe[1];
  fcntl(to_child, F_SETFL, fcntl(to_child, F_GETFL) | O_NONBLOCK);
  CommandOutput result;
  size_t written = 0;
  if (input.empty()) {
    close(to_child);
    to_child = -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int open_outputs = 2;
  bool out_open = true, err_open = true;
  char buffer[65536];
  while (open_outputs > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd fds[3];
    int n = 0;
    int out_i = -1, err_i = -1, in_i = -1;
    if (out_open) fds[out_i = n++] = {out_pipe[0], POLLIN, 0};
    if (err_open) fds[err_i = n++] = {err_pipe[0], POLLIN, 0};
    if (to_child >= 0) fds[in_i = n++] = {to_child, POLLOUT, 0};
    const int ready = poll(fds, static_cast<nfds_t>(n), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const auto drain = [&](int index, int fd, std::string& into, bool& open) {
      if (index < 0 || (fds[index].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
      const ssize_t got = read(fd, buffer, sizeof(buffer));
      if (got > 0) {
        into.append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        open = false;
        --open_outputs;
      }
    };
    drain(out_i, out_pipe[0], result.out, out_open);
    drain(err_i, err_pipe[0], result.err, err_open);
    if (in_i >= 0 && (fds[in_i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t put = write(to_child, input.data() + written, input.size() - written);
      if (put > 0) written += static_cast<size_t>(put);
      if ((put < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        close(to_child);  // all given (or the command stopped reading): it sees the end of its input
        to_child = -1;
      }
    }
  }
  if (to_child >= 0) close(to_child);
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  while (!result.timed_out) {  // outputs closed: the command has until the deadline to exit
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = true;
      break;
    }
    usleep(1000);
  }
  if (result.timed_out) {
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  const timespec no_wait{0, 0};
  while (sigtimedwait(&pipe_signal, nullptr, &no_wait) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
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
