// Line charts (loss curves) and bar charts (benchmark results) as self-contained SVG files, with no dependency beyond
// the standard library.
#pragma once

#include <string>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// One line of a chart: points (x[i], y[i]). Non-finite points are skipped and break the line there.
struct Series {
  std::string name;
  std::vector<double> x, y;
  /// Any SVG colour ("#1f77b4", "red"); empty: the next colour of the default palette.
  std::string color;
};

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  int width = 800;
  int height = 480;
};

/// An axis range widened to "nice" tick values (1, 2 or 5 times a power of ten).
struct NiceAxis {
  double lo = 0;   // the first tick, <= the data's minimum
  double hi = 1;   // the last tick, >= the data's maximum
  double step = 1;
  std::vector<double> ticks;  // lo, lo + step, ..., hi (each the double nearest an integer multiple of step)
};

/// Nice ticks covering [lo, hi], the step chosen among 1/2/5 x 10^k to give the tick count nearest
/// `target_ticks` (ties go to the tighter axis, then the larger step). lo > hi are swapped; an empty range
/// (lo == hi) is padded by 5% of |lo| (or 1 when lo is 0) on each side. Ranges where no nice step is exact in a
/// double (spans that overflow, spans of a few ulps) get `target_ticks` evenly spaced ticks from lo to hi.
/// Throws Error when lo or hi is not finite or target_ticks < 2.
NiceAxis nice_axis(double lo, double hi, int target_ticks = 5);

/// The label of a tick value: %g, with more significant digits when 6 cannot tell ticks `step` apart.
std::string format_tick(double value, double step);

/// Escapes text for XML content and attribute values (& < > " '), dropping the control characters XML 1.0
/// forbids (all below 0x20 except tab, newline and carriage return).
std::string xml_escape(const std::string& text);

/// A self-contained SVG 1.1 document (starting "<svg", ending "</svg>\n") drawing each series as a polyline
/// (a dot for an isolated finite point) over axes with about five nice ticks each, grid lines, tick labels,
/// axis labels, a legend of the named series (top right) and the title. With no finite point at all it draws the frame and "no data". All text
/// is XML-escaped. Throws ConfigError when the size is below 160x120 or a series' x and y differ in length.
std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options);

/// One panel of a bar chart: a value per category (NaN: no bar, marked "n/a").
struct BarPanel {
  std::string title;           // what the bars measure, with the unit ("tokens/s")
  std::vector<double> values;  // one per category: >= 0, or NaN
  std::string color;           // any SVG colour; empty: the default palette's colour of the panel's index
};

/// A self-contained SVG 1.1 document of horizontal bar panels side by side that share the category labels down the
/// left (options.title on top; the axis labels are not used): each panel has its title, an axis from 0 with about
/// five nice ticks, one bar per category with a finite value (a `<rect class="bar">` with the value printed beside
/// it: no decimals from 100, one from 1, else three significant digits) and "n/a" where the value is NaN. All text is XML-escaped. Throws ConfigError when the size is below
/// 160x120, there is no panel or no category, a panel's value count differs from the categories' or a value is
/// negative or infinite.
std::string bar_chart_svg(const std::vector<std::string>& categories, const std::vector<BarPanel>& panels,
                          const ChartOptions& options);

/// Writes a loss chart (x "step", y "loss") of the train and eval series to `file` atomically. Empty names
/// become "train" and "eval", and a series without points is left out. Throws IoError when the file cannot be
/// written, ConfigError as line_chart_svg.
void write_loss_curve_svg(const fs::path& file, const Series& train, const Series& eval,
                          const std::string& title);

}  // namespace swiftcpp
