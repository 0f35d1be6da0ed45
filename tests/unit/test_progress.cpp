// Progress reporter tests: the exact text of durations, ETAs and both line formats, and the terminal bar's
// behaviour (redraw in place, throttling, messages, finish) driven by a fake clock.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/progress.h"

namespace swiftcpp {
namespace {

const std::string kClear = "\r\x1b[K";

// A clock the test moves by hand.
struct FakeClock {
  double now = 100.0;
  ProgressClock fn() {
    return [this] { return now; };
  }
};

ProgressStats stats(double loss) {
  ProgressStats s;
  s.loss = loss;
  s.learning_rate = 1e-4;
  s.tokens_per_s = 1234;
  return s;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(format_duration(0), "0:00:00");
  EXPECT_EQ(format_duration(12), "0:00:12");
  EXPECT_EQ(format_duration(88), "0:01:28");
  EXPECT_EQ(format_duration(3599.4), "0:59:59");
  EXPECT_EQ(format_duration(3599.5), "1:00:00");  // rounds to the nearest second
  EXPECT_EQ(format_duration(27 * 3600 + 3 * 60 + 9), "27:03:09");
  EXPECT_EQ(format_duration(-5), "0:00:00");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(format_duration(1e300), "?");
}

TEST(Progress, EstimateEta) {
  // 11 steps in 11 s, 88 left: 88 s.
  EXPECT_DOUBLE_EQ(*estimate_eta(11, 11.0, 88), 88.0);
  EXPECT_DOUBLE_EQ(*estimate_eta(4, 2.0, 10), 5.0);
  EXPECT_DOUBLE_EQ(*estimate_eta(4, 2.0, 0), 0.0);
  EXPECT_DOUBLE_EQ(*estimate_eta(4, 2.0, -3), 0.0);
  EXPECT_FALSE(estimate_eta(0, 0.0, 10).has_value());
  EXPECT_FALSE(estimate_eta(-1, 1.0, 10).has_value());
  EXPECT_FALSE(estimate_eta(3, -1.0, 10).has_value());
  EXPECT_FALSE(estimate_eta(3, std::numeric_limits<double>::quiet_NaN(), 10).has_value());
}

TEST(Progress, PlainLineFormat) {
  EXPECT_EQ(format_progress_line(12, 100, stats(2.345), 12, 88.0),
            "step 12/100 | loss 2.345 | lr 1.00e-04 | 1234 tok/s | elapsed 0:00:12 | eta 0:01:28");
  // 4 significant digits, an unknown ETA, and the optional fields in their places.
  ProgressStats s = stats(2.34567);
  s.learning_rate = 3e-5;
  s.tokens_per_s = 987.6;
  s.eval_loss = 2.5;
  s.grad_norm = 0.812345;
  EXPECT_EQ(format_progress_line(1, 10, s, 0.4, std::nullopt),
            "step 1/10 | loss 2.346 | eval_loss 2.5 | lr 3.00e-05 | grad_norm 0.8123 | 988 tok/s | "
            "elapsed 0:00:00 | eta ?");
  // A diverged loss is shown, not hidden.
  EXPECT_NE(format_progress_line(1, 10, stats(std::nan("")), 0, 0.0).find("loss nan |"), std::string::npos);
}

TEST(Progress, BarLineFormat) {
  EXPECT_EQ(format_progress_bar(12, 100, stats(2.345), 12, 88.0),
            "[##..................] 12/100  12% | loss 2.345 | lr 1.00e-04 | 1234 tok/s | 0:00:12 eta 0:01:28");
  EXPECT_EQ(format_progress_bar(0, 8, stats(1), 0, std::nullopt).substr(0, 33), "[....................] 0/8   0% |");
  EXPECT_EQ(format_progress_bar(8, 8, stats(1), 0, 0.0).substr(0, 33), "[####################] 8/8 100% |");
  // Past the end it stays full.
  EXPECT_EQ(format_progress_bar(9, 8, stats(1), 0, 0.0).substr(0, 33), "[####################] 9/8 100% |");
}

TEST(Progress, PlainLogEveryAndLastStep) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, /*tty=*/false, /*log_every=*/5, clock.fn());
  for (int step = 1; step <= 100; ++step) {
    clock.now += 1.0;
    ProgressStats s = stats(2.345);
    s.elapsed_s = step;
    bar.update(step, s);
  }
  bar.finish();
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 20u);
  // The first update (step 1) starts the pace: at step 5, 4 steps took 4 s, 95 are left.
  EXPECT_EQ(got[0], "step 5/100 | loss 2.345 | lr 1.00e-04 | 1234 tok/s | elapsed 0:00:05 | eta 0:01:35");
  EXPECT_EQ(got[19], "step 100/100 | loss 2.345 | lr 1.00e-04 | 1234 tok/s | elapsed 0:01:40 | eta 0:00:00");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
  EXPECT_EQ(out.str().find('\x1b'), std::string::npos);
}

// Updates that advance by several steps (batches of evaluation items) print when they pass a multiple of
// log_every, not only when they land on one; custom fields and unit replace the training ones.
TEST(Progress, PlainLogEveryWithJumpingSteps) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, /*tty=*/false, /*log_every=*/10, clock.fn());
  ProgressStats s;
  s.unit = "item";
  s.fields = "arc_easy | 8.00 items/s";
  for (int step = 8; step <= 100; step += 8) {
    clock.now += 1.0;
    bar.update(step, s);
  }
  bar.update(100, s);
  bar.finish();
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 10u);  // passing 10, 20, ..., 90 and the last step
  EXPECT_EQ(got[0].rfind("item 16/100 | arc_easy | 8.00 items/s | elapsed", 0), 0u) << got[0];
  EXPECT_EQ(got[1].rfind("item 24/100 |", 0), 0u) << got[1];
  EXPECT_EQ(got[9].rfind("item 100/100 |", 0), 0u) << got[9];
}

TEST(Progress, PlainExampleLineAndLastStepOffGrid) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(13, out, false, 4, clock.fn());
  for (int step = 1; step <= 13; ++step) {
    clock.now += 1.0;
    bar.update(step, stats(2.345));  // elapsed from the clock: 1 s per step since construction
  }
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 4u);  // steps 4, 8, 12 and the last one, 13
  EXPECT_EQ(got[2], "step 12/13 | loss 2.345 | lr 1.00e-04 | 1234 tok/s | elapsed 0:00:12 | eta 0:00:01");
  EXPECT_EQ(got[3].substr(0, 11), "step 13/13 ");
  bar.finish();  // nothing pending
  EXPECT_EQ(lines(out.str()).size(), 4u);
}

TEST(Progress, PlainFinishPrintsSkippedUpdate) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, false, 10, clock.fn());
  for (int step = 1; step <= 17; ++step) bar.update(step, stats(1.5));  // stopped early
  bar.finish();
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].substr(0, 12), "step 10/100 ");
  EXPECT_EQ(got[1].substr(0, 12), "step 17/100 ");
  bar.finish();
  EXPECT_EQ(lines(out.str()).size(), 2u);
}

TEST(Progress, PlainMessage) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(3, out, false, 1, clock.fn());
  bar.update(1, stats(1));
  bar.message("saved checkpoint-1");
  bar.update(2, stats(1));
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1], "saved checkpoint-1");
}

TEST(Progress, TtyRedrawsInPlaceWithEta) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, /*tty=*/true, 1, clock.fn());
  clock.now += 1.0;
  bar.update(1, stats(3.0));
  // One update: the pace is unknown.
  EXPECT_EQ(out.str(),
            kClear + "[....................] 1/100   1% | loss 3 | lr 1.00e-04 | 1234 tok/s | 0:00:01 eta ?");
  clock.now += 11.0;
  bar.update(12, stats(2.345));
  EXPECT_EQ(out.str().substr(out.str().rfind(kClear)),
            kClear +
                "[##..................] 12/100  12% | loss 2.345 | lr 1.00e-04 | 1234 tok/s | 0:00:12 eta 0:01:28");
  EXPECT_EQ(out.str().find('\n'), std::string::npos);  // still on one line
  bar.finish();
  EXPECT_EQ(out.str().back(), '\n');
  EXPECT_EQ(count(out.str(), "\n"), 1);
}

TEST(Progress, TtyThrottlesRedrawsButAlwaysDrawsLastStep) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(1000, out, true, 1, clock.fn());
  // 1000 steps of 10 ms: 10 s, so about 5 redraws per second.
  for (int step = 1; step <= 1000; ++step) {
    clock.now += 0.01;
    bar.update(step, stats(1.0));
  }
  const int draws = count(out.str(), kClear);
  EXPECT_GE(draws, 45);
  EXPECT_LE(draws, 52);
  const std::string tail = out.str().substr(out.str().rfind(kClear));
  EXPECT_NE(tail.find("1000/1000 100%"), std::string::npos);
  EXPECT_NE(tail.find("eta 0:00:00"), std::string::npos);
  bar.finish();
  EXPECT_EQ(count(out.str(), kClear), draws);  // the last step was already shown
  EXPECT_EQ(count(out.str(), "\n"), 1);
}

TEST(Progress, TtyFinishShowsThrottledUpdate) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, true, 1, clock.fn());
  bar.update(1, stats(1.0));
  clock.now += 0.05;
  bar.update(2, stats(0.5));  // throttled
  EXPECT_EQ(count(out.str(), kClear), 1);
  bar.finish();
  EXPECT_EQ(count(out.str(), kClear), 2);
  const std::string tail = out.str().substr(out.str().rfind(kClear));
  EXPECT_NE(tail.find("2/100"), std::string::npos);
  EXPECT_NE(tail.find("loss 0.5"), std::string::npos);
  EXPECT_EQ(tail.back(), '\n');
}

TEST(Progress, TtyMessageClearsBarAndNextUpdateRedraws) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, true, 1, clock.fn());
  bar.update(1, stats(1.0));
  bar.message("eval loss 0.9");
  const std::string after_message = out.str();
  EXPECT_EQ(after_message.substr(after_message.size() - (kClear.size() + 14)), kClear + "eval loss 0.9\n");
  clock.now += 0.01;  // well inside the throttle interval, but the bar is not on screen
  bar.update(2, stats(1.0));
  const std::string redraw = kClear + "[....................] 2/";
  EXPECT_EQ(out.str().substr(after_message.size(), redraw.size()), redraw);
  // A message with no bar on screen prints no control codes.
  bar.finish();
  const size_t before = out.str().size();
  bar.message("done");
  EXPECT_EQ(out.str().substr(before), "done\n");
}

TEST(Progress, TtyLineWidthTruncates) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(100, out, true, 1, clock.fn());
  bar.set_line_width(40);
  bar.update(1, stats(1.0));
  EXPECT_EQ(out.str(), kClear + format_progress_bar(1, 100, stats(1.0), 0, std::nullopt).substr(0, 39));
}

TEST(Progress, DestructorEndsTheBarLine) {
  std::ostringstream out;
  {
    FakeClock clock;
    ProgressBar bar(10, out, true, 1, clock.fn());
    bar.update(3, stats(1.0));
  }
  EXPECT_EQ(out.str().back(), '\n');
  EXPECT_EQ(count(out.str(), "\n"), 1);
}

TEST(Progress, ElapsedFromStatsOrClock) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(10, out, false, 1, clock.fn());
  clock.now += 65;
  bar.update(1, stats(1.0));
  ProgressStats s = stats(1.0);
  s.elapsed_s = 3725;
  bar.update(2, s);
  const auto got = lines(out.str());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0].find("elapsed 0:01:05 | eta ?"), std::string::npos);
  EXPECT_NE(got[1].find("elapsed 1:02:05 | eta 0:00:00"), std::string::npos);  // no time passed since step 1
}

TEST(Progress, RejectsBadArguments) {
  std::ostringstream out;
  EXPECT_THROW(ProgressBar(0, out, false), ConfigError);
  EXPECT_THROW(ProgressBar(-3, out, true), ConfigError);
  EXPECT_THROW(ProgressBar(10, out, false, 0), ConfigError);
  EXPECT_THROW(ProgressBar(10, out, false, 1, ProgressClock()), ConfigError);
}

TEST(Progress, StreamIsTty) {
  EXPECT_FALSE(stream_is_tty(nullptr));
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  EXPECT_FALSE(stream_is_tty(file));
  EXPECT_EQ(terminal_columns(file), 0);
  std::fclose(file);
}

TEST(Progress, SteadyClockAdvances) {
  const double a = steady_clock_seconds();
  const double b = steady_clock_seconds();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace swiftcpp
