#include "core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace swiftcpp {

namespace {

constexpr int kBarWidth = 20;
constexpr const char* kClearLine = "\r\x1b[K";

// "loss 2.345 | eval_loss 2.1 | lr 1.00e-04 | grad_norm 0.8 | 1234 tok/s"
std::string format_fields(const ProgressStats& stats) {
  if (stats.fields) return *stats.fields;
  std::string s = fmt::format("loss {:.4g}", stats.loss);
  if (stats.eval_loss) s += fmt::format(" | eval_loss {:.4g}", *stats.eval_loss);
  s += fmt::format(" | lr {:.2e}", stats.learning_rate);
  if (stats.grad_norm) s += fmt::format(" | grad_norm {:.4g}", *stats.grad_norm);
  s += fmt::format(" | {:.0f} tok/s", stats.tokens_per_s);
  return s;
}

std::string format_eta(std::optional<double> eta_s) { return eta_s ? format_duration(*eta_s) : "?"; }

}  // namespace

double steady_clock_seconds() {
  using Seconds = std::chrono::duration<double>;
  return std::chrono::duration_cast<Seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool stream_is_tty(std::FILE* stream) { return stream != nullptr && ::isatty(::fileno(stream)) == 1; }

int terminal_columns(std::FILE* stream) {
  if (!stream_is_tty(stream)) return 0;
  struct winsize size {};
  if (::ioctl(::fileno(stream), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds > 1e12) return "?";
  const int64_t total = seconds <= 0 ? 0 : static_cast<int64_t>(std::llround(seconds));
  return fmt::format("{}:{:02d}:{:02d}", total / 3600, (total / 60) % 60, total % 60);
}

std::optional<double> estimate_eta(int64_t steps_so_far, double seconds_so_far, int64_t steps_left) {
  if (steps_so_far <= 0 || !std::isfinite(seconds_so_far) || seconds_so_far < 0) return std::nullopt;
  if (steps_left <= 0) return 0.0;
  return seconds_so_far / static_cast<double>(steps_so_far) * static_cast<double>(steps_left);
}

std::string format_progress_line(int64_t step, int64_t total_steps, const ProgressStats& stats, double elapsed_s,
                                 std::optional<double> eta_s) {
  return fmt::format("{} {}/{} | {} | elapsed {} | eta {}", stats.unit, step, total_steps, format_fields(stats),
                     format_duration(elapsed_s), format_eta(eta_s));
}

std::string format_progress_bar(int64_t step, int64_t total_steps, const ProgressStats& stats, double elapsed_s,
                                std::optional<double> eta_s) {
  const double fraction =
      total_steps > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_steps), 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  const int percent = static_cast<int>(fraction * 100);
  return fmt::format("[{}{}] {}/{} {:3d}% | {} | {} eta {}", std::string(filled, '#'),
                     std::string(kBarWidth - filled, '.'), step, total_steps, percent, format_fields(stats),
                     format_duration(elapsed_s), format_eta(eta_s));
}

ProgressBar::ProgressBar(int64_t total_steps, std::ostream& out, bool tty, int64_t log_every, ProgressClock clock)
    : total_steps_(total_steps), out_(out), tty_(tty), log_every_(log_every), clock_(std::move(clock)) {
  if (total_steps_ <= 0) fail<ConfigError>("progress bar: total_steps must be positive, got {}", total_steps_);
  if (log_every_ <= 0) fail<ConfigError>("progress bar: log_every must be positive, got {}", log_every_);
  if (!clock_) fail<ConfigError>("progress bar: the clock is empty");
  start_time_ = clock_();
}

ProgressBar::~ProgressBar() {
  if (!bar_on_screen_) return;
  try {
    out_ << '\n';
    out_.flush();
  } catch (...) {
    // A stream set to throw must not escape a destructor.
  }
}

void ProgressBar::update(int64_t step, const ProgressStats& stats) {
  const double now = clock_();
  const int64_t previous = last_ ? last_->step : step - 1;
  last_ = Snapshot{step, stats, now};
  if (!first_) first_ = last_;
  last_shown_ = false;
  const bool last_step = step >= total_steps_;
  bool show;
  if (tty_) {
    show = !bar_on_screen_ || last_step || now - last_draw_time_ >= kRedrawInterval;
  } else {
    // Steps may advance by more than one (a batch of items): print when a multiple of log_every is reached or
    // passed since the previous update.
    show = last_step || step / log_every_ > previous / log_every_;
  }
  if (show) draw(*last_);
}

void ProgressBar::draw(const Snapshot& snapshot) {
  const double elapsed = snapshot.stats.elapsed_s ? *snapshot.stats.elapsed_s : snapshot.now - start_time_;
  const auto eta = estimate_eta(snapshot.step - first_->step, snapshot.now - first_->now, total_steps_ - snapshot.step);
  if (tty_) {
    std::string line = format_progress_bar(snapshot.step, total_steps_, snapshot.stats, elapsed, eta);
    if (line_width_ > 1 && line.size() >= static_cast<size_t>(line_width_)) line.resize(line_width_ - 1);
    out_ << kClearLine << line;
    bar_on_screen_ = true;
    last_draw_time_ = snapshot.now;
  } else {
    out_ << format_progress_line(snapshot.step, total_steps_, snapshot.stats, elapsed, eta) << '\n';
  }
  out_.flush();
  last_shown_ = true;
}

void ProgressBar::message(const std::string& text) {
  if (bar_on_screen_) out_ << kClearLine;
  out_ << text << '\n';
  out_.flush();
  bar_on_screen_ = false;
}

void ProgressBar::finish() {
  if (last_ && !last_shown_) draw(*last_);
  if (bar_on_screen_) {
    out_ << '\n';
    out_.flush();
    bar_on_screen_ = false;
  }
}

}  // namespace swiftcpp
