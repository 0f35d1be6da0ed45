#include "core/plot.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace swiftcpp {

namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr int kMinWidth = 160;
constexpr int kMinHeight = 120;
// Tick multiples (index times 1, 2 or 5) beyond 2^53 are not exact in a double; such ranges fall back to
// plain spacing.
constexpr double kMaxTickMultiple = 9007199254740992.0;  // 2^53

// Evenly spaced ticks for ranges the nice-number search cannot handle (overflowing spans, spans of a few ulps).
NiceAxis linear_axis(double lo, double hi, int count) {
  NiceAxis axis;
  axis.lo = lo;
  axis.hi = hi;
  axis.step = hi / (count - 1) - lo / (count - 1);
  for (int i = 0; i < count; ++i) {
    const double f = static_cast<double>(i) / (count - 1);
    axis.ticks.push_back(i == count - 1 ? hi : lo * (1 - f) + hi * f);  // no lo + i * step: it may overflow
  }
  return axis;
}

// floor/ceil of a quotient that may carry rounding error: 16.000000000000004 floors to 16, 15.999999999999998
// ceils to 16. Misjudging by one only costs an extra tick: nice_axis() widens a range that falls short.
double tolerant_floor(double q) { return std::floor(q + 1e-9); }
double tolerant_ceil(double q) { return std::ceil(q - 1e-9); }

// i * m * 10^k, rounded once: for k < 0 the division by an exact power of ten gives the double nearest the
// decimal value (16 * 2 / 10 is 3.2, where 16 * 0.2 is 3.2000000000000002).
double tick_value(double i, int m, int k) {
  const double p = std::pow(10.0, std::abs(k));
  return k < 0 ? (i * m) / p : (i * m) * p;
}

// Position of v in [lo, hi] as a fraction, without overflow when hi - lo exceeds the double range.
double fraction(double v, double lo, double hi) {
  const double span = hi - lo;
  if (std::isfinite(span)) return (v - lo) / span;
  return (v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5);
}

std::string num(double v) { return fmt::format("{:.2f}", v); }

struct Point {
  double x, y;
};

void check_chart_size(const ChartOptions& options) {
  if (options.width < kMinWidth || options.height < kMinHeight) {
    fail<ConfigError>("chart size {}x{} is below the minimum {}x{}", options.width, options.height, kMinWidth,
                      kMinHeight);
  }
}

// The document's opening: the svg element, its <title>, a white background and the title drawn on top.
std::string svg_head(const ChartOptions& options) {
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\">\n",
      options.width, options.height);
  if (!options.title.empty()) svg += fmt::format("<title>{}</title>\n", xml_escape(options.title));
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", options.width,
                     options.height);
  if (!options.title.empty()) {
    svg += fmt::format(
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        num(options.width / 2.0), xml_escape(options.title));
  }
  return svg;
}

}  // namespace

NiceAxis nice_axis(double lo, double hi, int target_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) fail<Error>("nice_axis: range [{}, {}] is not finite", lo, hi);
  if (target_ticks < 2) fail<Error>("nice_axis: target_ticks must be at least 2, got {}", target_ticks);
  if (lo > hi) std::swap(lo, hi);
  if (lo == hi) {
    double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.05;
    if (!(lo - pad < lo + pad)) pad = 1.0;  // subnormal values: 5% of them rounds to nothing
    lo = std::max(lo - pad, -DBL_MAX);
    hi = std::min(hi + pad, DBL_MAX);
  }
  const double span = hi - lo;
  if (!std::isfinite(span)) return linear_axis(lo, hi, target_ticks);

  // Candidate steps 1/2/5 x 10^k around span / (target_ticks - 1): the fewest ticks missed, then the tightest
  // axis, then the larger step.
  const int base = static_cast<int>(std::floor(std::log10(span / (target_ticks - 1))));
  bool found = false;
  double best_first = 0, best_last = 0, best_extent = 0;
  int best_m = 1, best_k = 0;
  int64_t best_miss = 0;
  for (int k = base - 1; k <= base + 1; ++k) {
    for (int m : {1, 2, 5}) {
      const double step = m * std::pow(10.0, k);
      if (!std::isfinite(step) || step <= 0) continue;
      const double first = tolerant_floor(lo / step);
      const double last = tolerant_ceil(hi / step);
      if (!std::isfinite(first) || !std::isfinite(last) || std::fabs(first) * m > kMaxTickMultiple - 10 * m ||
          std::fabs(last) * m > kMaxTickMultiple - 10 * m) {
        continue;
      }
      const auto count = static_cast<int64_t>(last - first) + 1;
      const int64_t miss = std::abs(count - target_ticks);
      const double extent = (last - first) * step;
      if (!found || miss < best_miss || (miss == best_miss && extent <= best_extent)) {
        found = true;
        best_miss = miss;
        best_extent = extent;
        best_first = first;
        best_last = last;
        best_m = m;
        best_k = k;
      }
    }
  }
  if (!found) return linear_axis(lo, hi, target_ticks);
  // Widen by a tick where rounding in the quotients left data outside (bounded: each test moves by one step).
  for (int i = 0; i < 2 && tick_value(best_first, best_m, best_k) > lo; ++i) --best_first;
  for (int i = 0; i < 2 && tick_value(best_last, best_m, best_k) < hi; ++i) ++best_last;

  NiceAxis axis;
  axis.step = tick_value(1, best_m, best_k);
  for (double i = best_first; i <= best_last; ++i) axis.ticks.push_back(tick_value(i, best_m, best_k));
  if (!std::isfinite(axis.ticks.front()) || !std::isfinite(axis.ticks.back()) || axis.ticks.front() > lo ||
      axis.ticks.back() < hi) {
    return linear_axis(lo, hi, target_ticks);  // the nice end overflowed the double range
  }
  axis.lo = axis.ticks.front();
  axis.hi = axis.ticks.back();
  return axis;
}

std::string format_tick(double value, double step) {
  int precision = 6;
  if (value != 0 && step > 0 && std::isfinite(value) && std::isfinite(step)) {
    const int needed = static_cast<int>(std::floor(std::log10(std::fabs(value)))) -
                       static_cast<int>(std::floor(std::log10(step))) + 1;
    precision = std::clamp(needed, 6, 17);
  }
  return fmt::format("{:.{}g}", value, precision);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') break;
        out += c;
    }
  }
  return out;
}

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options) {
  const int width = options.width;
  const int height = options.height;
  check_chart_size(options);
  for (const auto& s : series) {
    if (s.x.size() != s.y.size()) {
      fail<ConfigError>("chart series '{}' has {} x values but {} y values", s.name, s.x.size(), s.y.size());
    }
  }

  // Data ranges over the finite points.
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const auto& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]);
      x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]);
      y_max = std::max(y_max, s.y[i]);
    }
  }
  const bool has_data = x_min <= x_max;

  std::string svg = svg_head(options);

  NiceAxis x_axis, y_axis;
  std::vector<std::string> y_labels;
  size_t y_label_chars = 1;
  if (has_data) {
    x_axis = nice_axis(x_min, x_max);
    y_axis = nice_axis(y_min, y_max);
    for (double t : y_axis.ticks) {
      y_labels.push_back(format_tick(t, y_axis.step));
      y_label_chars = std::max(y_label_chars, y_labels.back().size());
    }
  }

  // Plot area: room for the title above, tick labels and axis labels below and to the left.
  const double top = options.title.empty() ? 16 : 40;
  const double bottom = height - 26 - (options.x_label.empty() ? 0 : 20);
  const double left =
      std::min(width / 3.0, 14 + 6.5 * static_cast<double>(y_label_chars) + (options.y_label.empty() ? 0 : 20));
  const double right = width - 20;
  const double plot_w = right - left;
  const double plot_h = bottom - top;
  auto px = [&](double x) { return left + fraction(x, x_axis.lo, x_axis.hi) * plot_w; };
  auto py = [&](double y) { return bottom - fraction(y, y_axis.lo, y_axis.hi) * plot_h; };

  if (!options.x_label.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
                       num((left + right) / 2), height - 8, xml_escape(options.x_label));
  }
  if (!options.y_label.empty()) {
    svg += fmt::format(
        "<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
        num((top + bottom) / 2), xml_escape(options.y_label));
  }

  if (!has_data) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n",
                       num(left), num(top), num(plot_w), num(plot_h));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"14\" fill=\"#666\">no data</text>\n",
                       num((left + right) / 2), num((top + bottom) / 2));
    svg += "</svg>\n";
    return svg;
  }

  // Grid lines, frame, tick marks and tick labels.
  svg += "<g stroke=\"#e5e5e5\" stroke-width=\"1\">\n";
  for (double t : x_axis.ticks) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", num(px(t)), num(top), num(bottom));
  }
  for (double t : y_axis.ticks) {
    svg += fmt::format("<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", num(py(t)), num(left), num(right));
  }
  svg += "</g>\n";
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n",
                     num(left), num(top), num(plot_w), num(plot_h));
  svg += "<g stroke=\"#444\">\n";
  for (double t : x_axis.ticks) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", num(px(t)), num(bottom),
                       num(bottom + 4));
  }
  for (double t : y_axis.ticks) {
    svg += fmt::format("<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", num(py(t)), num(left - 4),
                       num(left));
  }
  svg += "</g>\n";
  svg += "<g font-size=\"11\" fill=\"#333\">\n";
  for (double t : x_axis.ticks) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", num(px(t)), num(bottom + 16),
                       xml_escape(format_tick(t, x_axis.step)));
  }
  for (size_t i = 0; i < y_axis.ticks.size(); ++i) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(left - 6),
                       num(py(y_axis.ticks[i]) + 4), xml_escape(y_labels[i]));
  }
  svg += "</g>\n";

  // One polyline per run of finite points; an isolated finite point becomes a dot.
  std::vector<std::string> colors;
  int next_color = 0;
  for (const auto& s : series) {
    colors.push_back(xml_escape(s.color.empty() ? kPalette[next_color++ % kPaletteSize] : s.color));
  }
  svg += "<g fill=\"none\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n";
  for (size_t si = 0; si < series.size(); ++si) {
    const auto& s = series[si];
    std::vector<Point> run;
    auto flush = [&] {
      if (run.size() == 1) {
        svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"2.5\" fill=\"{}\" stroke=\"none\"/>\n", num(run[0].x),
                           num(run[0].y), colors[si]);
      } else if (run.size() > 1) {
        std::string points;
        for (const auto& p : run) {
          if (!points.empty()) points += ' ';
          points += num(p.x) + ',' + num(p.y);
        }
        svg += fmt::format("<polyline stroke=\"{}\" points=\"{}\"/>\n", colors[si], points);
      }
      run.clear();
    };
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        run.push_back({px(s.x[i]), py(s.y[i])});
      } else {
        flush();
      }
    }
    flush();
  }
  svg += "</g>\n";

  // Legend in the top-right corner of the plot area, for the named series.
  size_t named = 0, name_chars = 0;
  for (const auto& s : series) {
    if (s.name.empty()) continue;
    ++named;
    name_chars = std::max(name_chars, s.name.size());
  }
  if (named > 0) {
    const double row = 18;
    const double box_w = 40 + 7 * static_cast<double>(name_chars);
    const double box_h = 8 + row * static_cast<double>(named);
    const double box_x = right - 8 - box_w;
    const double box_y = top + 8;
    svg += "<g font-size=\"12\">\n";
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n",
        num(box_x), num(box_y), num(box_w), num(box_h));
    double y = box_y + 4 + row / 2;
    for (size_t si = 0; si < series.size(); ++si) {
      if (series[si].name.empty()) continue;
      svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                         num(box_x + 8), num(y), num(box_x + 28), num(y), colors[si]);
      svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", num(box_x + 34), num(y + 4),
                         xml_escape(series[si].name));
      y += row;
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::string bar_chart_svg(const std::vector<std::string>& categories, const std::vector<BarPanel>& panels,
                          const ChartOptions& options) {
  check_chart_size(options);
  if (panels.empty() || categories.empty()) fail<ConfigError>("a bar chart needs at least one panel and one category");
  for (const auto& p : panels) {
    if (p.values.size() != categories.size()) {
      fail<ConfigError>("bar chart panel '{}' has {} values for {} categories", p.title, p.values.size(),
                        categories.size());
    }
    for (const double v : p.values) {
      if (!std::isnan(v) && !(v >= 0 && std::isfinite(v))) {
        fail<ConfigError>("bar chart panel '{}': value {} is not a finite number >= 0", p.title, v);
      }
    }
  }
  const double width = options.width, height = options.height;
  std::string svg = svg_head(options);
  size_t label_chars = 1;
  for (const auto& c : categories) label_chars = std::max(label_chars, c.size());
  // Category labels down the left; panels side by side, each with its title above and tick labels below.
  const double label_w = std::min(width / 3, 12 + 7 * static_cast<double>(label_chars));
  const double top = (options.title.empty() ? 8 : 36) + 22, bottom = height - 26;
  const double gap = 28, first_left = label_w + 10, right = width - 20;
  const double n = static_cast<double>(panels.size());
  const double panel_w = std::max(10.0, (right - first_left - gap * (n - 1)) / n);
  const double row = (bottom - top) / static_cast<double>(categories.size());
  const double bar_h = std::max(1.0, row * 0.6);
  svg += "<g font-size=\"12\" fill=\"#333\">\n";
  for (size_t c = 0; c < categories.size(); ++c) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", num(label_w),
                       num(top + row * (static_cast<double>(c) + 0.5) + 4), xml_escape(categories[c]));
  }
  svg += "</g>\n";
  for (size_t pi = 0; pi < panels.size(); ++pi) {
    const BarPanel& p = panels[pi];
    const double left = first_left + static_cast<double>(pi) * (panel_w + gap);
    double max_value = 0;
    for (const double v : p.values) {
      if (!std::isnan(v)) max_value = std::max(max_value, v);
    }
    const NiceAxis axis = nice_axis(0, max_value > 0 ? max_value : 1);
    const auto px = [&](double v) { return left + fraction(v, axis.lo, axis.hi) * panel_w; };
    const std::string color = xml_escape(p.color.empty() ? kPalette[pi % kPaletteSize] : p.color);
    svg += fmt::format("<g class=\"panel\">\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\" "
                       "font-weight=\"bold\">{}</text>\n",
                       num(left + panel_w / 2), num(top - 8), xml_escape(p.title));
    for (const double t : axis.ticks) {
      svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#e5e5e5\"/>\n", num(px(t)),
                         num(top), num(bottom));
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" fill=\"#333\">{}</text>\n",
                         num(px(t)), num(bottom + 16), xml_escape(format_tick(t, axis.step)));
    }
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#444\"/>\n", num(left), num(top),
                       num(bottom));
    for (size_t c = 0; c < categories.size(); ++c) {
      const double v = p.values[c];
      const double y = top + row * static_cast<double>(c) + (row - bar_h) / 2;
      const double text_y = top + row * (static_cast<double>(c) + 0.5) + 4;
      if (std::isnan(v)) {
        svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#888\">n/a</text>\n", num(left + 4),
                           num(text_y));
        continue;
      }
      const double w = px(v) - left;
      const std::string value = v >= 100 ? fmt::format("{:.0f}", v) : v >= 1 ? fmt::format("{:.1f}", v)
                                                                             : fmt::format("{:.3g}", v);
      svg += fmt::format("<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: "
                         "{} {}</title></rect>\n",
                         num(left), num(y), num(w), num(bar_h), color, xml_escape(categories[c]), value,
                         xml_escape(p.title));
      // The value after the bar, or inside its end when the bar leaves no room for it.
      const bool inside = w > panel_w - 7 * static_cast<double>(value.size()) - 8;
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"{}\" font-size=\"11\" fill=\"{}\">{}</text>\n",
                         num(inside ? left + w - 4 : left + w + 4), num(text_y), inside ? "end" : "start",
                         inside ? "white" : "#333", value);
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

void write_loss_curve_svg(const fs::path& file, const Series& train, const Series& eval, const std::string& title) {
  std::vector<Series> series;
  auto add = [&](const Series& s, const char* name, const char* color) {
    if (s.x.empty() && s.y.empty()) return;
    Series copy = s;
    if (copy.name.empty()) copy.name = name;
    if (copy.color.empty()) copy.color = color;
    series.push_back(std::move(copy));
  };
  add(train, "train", kPalette[0]);
  add(eval, "eval", kPalette[1]);
  ChartOptions options;
  options.title = title;
  options.x_label = "step";
  options.y_label = "loss";
  write_file_atomic(file, line_chart_svg(series, options));
}

}  // namespace swiftcpp
