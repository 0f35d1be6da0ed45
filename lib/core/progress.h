// Training progress reporting: a bar redrawn in place on a terminal, plain log lines everywhere else.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <string>

namespace swiftcpp {

/// What one training step reports. The core fields are always shown (NaN prints as "nan", so a value the
/// caller forgot to fill is visible); the optional ones only when set.
struct ProgressStats {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double learning_rate = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  /// Training time so far; unset: the time since the ProgressBar was constructed, by its clock.
  std::optional<double> elapsed_s;
  std::optional<double> eval_loss;
  std::optional<double> grad_norm;
  /// When set, replaces the training fields (loss, lr, tok/s), e.g. "arc_easy | 12.5 items/s" for evaluation.
  std::optional<std::string> fields;
  /// What one step counts in the plain log line ("step 12/100", "item 12/100").
  std::string unit = "step";
};

/// A clock in seconds from any fixed origin; only differences are used.
using ProgressClock = std::function<double()>;

/// std::chrono::steady_clock in seconds: the default ProgressClock.
double steady_clock_seconds();

/// Whether `stream` is a terminal (isatty on its descriptor); false for nullptr.
bool stream_is_tty(std::FILE* stream);

/// The terminal's width in columns, or 0 when `stream` is not a terminal or the width is unknown.
int terminal_columns(std::FILE* stream);

/// Formats a duration as "h:mm:ss" (hours unbounded: "27:03:09"), rounded to the nearest second; negative
/// durations print as "0:00:00", non-finite or absurd ones (over 10^12 s) as "?".
std::string format_duration(double seconds);

/// Time left at the average pace so far: `seconds_so_far / steps_so_far * steps_left`. nullopt when the pace is
/// unknown (`steps_so_far <= 0`, or `seconds_so_far` negative or non-finite); 0 when `steps_left <= 0`.
std::optional<double> estimate_eta(int64_t steps_so_far, double seconds_so_far, int64_t steps_left);

/// The plain log line, e.g.
/// "step 12/100 | loss 2.345 | lr 1.00e-04 | 1234 tok/s | elapsed 0:00:12 | eta 0:01:28".
/// Loss values show 4 significant digits, the learning rate 3 in scientific notation; eval_loss and
/// grad_norm follow loss and lr when set; an unknown ETA prints as "?".
std::string format_progress_line(int64_t step, int64_t total_steps, const ProgressStats& stats, double elapsed_s,
                                 std::optional<double> eta_s);

/// The terminal bar line without control codes, e.g.
/// "[##..................] 12/100  12% | loss 2.345 | lr 1.00e-04 | 1234 tok/s | 0:00:12 eta 0:01:28".
std::string format_progress_bar(int64_t step, int64_t total_steps, const ProgressStats& stats, double elapsed_s,
                                std::optional<double> eta_s);

/// Reports training progress to a stream. On a terminal it redraws one line in place ("\r" + clear to end of
/// line), at most every kRedrawInterval seconds except for the first update, the last step and the first update
/// after message(); elsewhere it prints format_progress_line() on the last step and whenever an update reaches or
/// passes a multiple of `log_every` (updates may advance by several steps, e.g. a batch of evaluation items).
/// The ETA is the average time per step since the first update times the steps left ("?" until two updates).
/// The stream must outlive the bar.
class ProgressBar {
 public:
  /// Minimum seconds between two redraws on a terminal.
  static constexpr double kRedrawInterval = 0.2;

  /// Throws ConfigError when `total_steps` or `log_every` is not positive, or `clock` is empty.
  ProgressBar(int64_t total_steps, std::ostream& out, bool tty, int64_t log_every = 1,
              ProgressClock clock = steady_clock_seconds);
  /// Ends the bar's line if it is still on screen (without redrawing a throttled update).
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Reports that `step` (1-based, up to total_steps) is done. Steps past total_steps show as 100%.
  void update(int64_t step, const ProgressStats& stats);

  /// Prints `text` on a line of its own: on a terminal it clears the bar first and the next update redraws it.
  void message(const std::string& text);

  /// Shows the last update if it was throttled or skipped by log_every, and ends the bar's line on a
  /// terminal. Later updates start a new bar line.
  void finish();

  /// Truncates terminal lines to `columns - 1` characters so a narrow terminal does not wrap them (a wrapped
  /// line cannot be redrawn in place); 0 (the default) means no limit. See terminal_columns().
  void set_line_width(int columns) { line_width_ = columns; }

 private:
  struct Snapshot {
    int64_t step = 0;
    ProgressStats stats;
    double now = 0;
  };
  void draw(const Snapshot& snapshot);

  int64_t total_steps_;
  std::ostream& out_;
  bool tty_;
  int64_t log_every_;
  ProgressClock clock_;
  int line_width_ = 0;
  double start_time_;
  std::optional<Snapshot> first_;   // the first update: origin of the ETA's pace
  std::optional<Snapshot> last_;    // the latest update
  bool last_shown_ = false;         // whether the latest update has been drawn or printed
  bool bar_on_screen_ = false;      // terminal: the cursor is on the bar's line
  double last_draw_time_ = 0;
};

}  // namespace swiftcpp
