// SVG chart tests without an XML parser: nice ticks for hand-checked ranges, tick labels, escaping, and structural
// checks of the document (nesting of tags, polylines and their point counts, the no-data case, bar widths).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/plot.h"

namespace swiftcpp {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

// Checks that every tag is closed in order ("<a><b/></a>"), that no '<' or '&' appears outside a tag or an
// entity, and that the document is one <svg> element. Returns "" when well formed, else what is wrong.
std::string check_well_formed(const std::string& svg) {
  if (svg.rfind("<svg", 0) != 0) return "does not start with <svg";
  if (svg.size() < 7 || svg.compare(svg.size() - 7, 7, "</svg>\n") != 0) return "does not end with </svg>\\n";
  std::vector<std::string> open;
  size_t i = 0;
  while (i < svg.size()) {
    if (svg[i] == '&') {
      const size_t semi = svg.find(';', i);
      const std::string entity = svg.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" && entity != "&apos;") {
        return "bad entity at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (svg[i] != '<') {
      if (svg[i] == '>') return "stray '>' at " + std::to_string(i);
      ++i;
      continue;
    }
    // Find the end of the tag, skipping quoted attribute values.
    size_t j = i + 1;
    char quote = 0;
    for (; j < svg.size(); ++j) {
      if (quote != 0) {
        if (svg[j] == quote) quote = 0;
        else if (svg[j] == '<') return "'<' inside an attribute at " + std::to_string(j);
      } else if (svg[j] == '"' || svg[j] == '\'') {
        quote = svg[j];
      } else if (svg[j] == '>') {
        break;
      }
    }
    if (j >= svg.size()) return "unterminated tag at " + std::to_string(i);
    const std::string tag = svg.substr(i + 1, j - i - 1);
    const bool closing = tag[0] == '/';
    const bool self_closing = tag.back() == '/';
    const size_t name_start = closing ? 1 : 0;
    const std::string name = tag.substr(name_start, tag.find_first_of(" /\n", name_start) - name_start);
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> does not close the open element";
      open.pop_back();
      if (open.empty() && j + 1 != svg.size() - 1) return "content after </svg>";
    } else if (!self_closing) {
      if (open.empty() && name != "svg") return "root element is " + name;
      open.push_back(name);
    }
    i = j + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

// The `points` attributes of the polylines, in order.
std::vector<std::string> polylines(const std::string& svg) {
  std::vector<std::string> out;
  for (size_t pos = svg.find("<polyline"); pos != std::string::npos; pos = svg.find("<polyline", pos + 1)) {
    const size_t start = svg.find("points=\"", pos) + 8;
    out.push_back(svg.substr(start, svg.find('"', start) - start));
  }
  return out;
}

int point_count(const std::string& points) { return count(points, ","); }

void expect_ticks(double lo, double hi, const std::vector<double>& expected, double step) {
  SCOPED_TRACE(testing::Message() << "range [" << lo << ", " << hi << "]");
  const NiceAxis axis = nice_axis(lo, hi);
  EXPECT_DOUBLE_EQ(axis.step, step);
  ASSERT_EQ(axis.ticks.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(axis.ticks[i], expected[i]) << "tick " << i;
  EXPECT_DOUBLE_EQ(axis.lo, expected.front());
  EXPECT_DOUBLE_EQ(axis.hi, expected.back());
  EXPECT_LE(axis.lo, std::min(lo, hi));
  EXPECT_GE(axis.hi, std::max(lo, hi));
}

Series series(std::string name, std::vector<double> x, std::vector<double> y, std::string color = "") {
  return Series{std::move(name), std::move(x), std::move(y), std::move(color)};
}

ChartOptions options(std::string title = "loss") {
  ChartOptions o;
  o.title = std::move(title);
  o.x_label = "step";
  o.y_label = "loss";
  return o;
}

TEST(Plot, NiceTicksHandChecked) {
  expect_ticks(0.0013, 0.0077, {0, 0.002, 0.004, 0.006, 0.008}, 0.002);
  expect_ticks(3.2, 3.9, {3.2, 3.4, 3.6, 3.8, 4.0}, 0.2);
  expect_ticks(0, 1000, {0, 200, 400, 600, 800, 1000}, 200);  // 6 ticks are nearer 5 than 3 (step 500)
  expect_ticks(1, 100, {0, 20, 40, 60, 80, 100}, 20);
  expect_ticks(-3.7, 12.1, {-5, 0, 5, 10, 15}, 5);
  expect_ticks(-0.5, -0.1, {-0.5, -0.4, -0.3, -0.2, -0.1}, 0.1);
  expect_ticks(2.1e9, 2.9e9, {2.0e9, 2.2e9, 2.4e9, 2.6e9, 2.8e9, 3.0e9}, 2e8);
  expect_ticks(1.5e-12, 3.5e-12, {1.5e-12, 2e-12, 2.5e-12, 3e-12, 3.5e-12}, 5e-13);
  // Reversed bounds are swapped.
  expect_ticks(3.9, 3.2, {3.2, 3.4, 3.6, 3.8, 4.0}, 0.2);
}

TEST(Plot, NiceTicksPadConstantRange) {
  expect_ticks(3.5, 3.5, {3.3, 3.4, 3.5, 3.6, 3.7}, 0.1);  // padded to [3.325, 3.675]
  expect_ticks(0, 0, {-1, -0.5, 0, 0.5, 1}, 0.5);          // padded to [-1, 1]
  const NiceAxis tiny = nice_axis(5e-324, 5e-324);          // 5% of a subnormal rounds to 0
  EXPECT_LT(tiny.lo, tiny.hi);
}

TEST(Plot, NiceTicksExtremeRanges) {
  // A span that overflows a double, and ranges a few ulps wide: finite, increasing ticks covering the range.
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{
           {-1.7e308, 1.7e308}, {1e308, 1.79e308}, {1e10, std::nextafter(1e10, 2e10)}, {1.0, 1.0 + 1e-15}}) {
    SCOPED_TRACE(testing::Message() << "range [" << lo << ", " << hi << "]");
    const NiceAxis axis = nice_axis(lo, hi);
    ASSERT_GE(axis.ticks.size(), 2u);
    EXPECT_LE(axis.ticks.size(), 12u);
    EXPECT_LE(axis.lo, lo);
    EXPECT_GE(axis.hi, hi);
    for (size_t i = 0; i < axis.ticks.size(); ++i) {
      EXPECT_TRUE(std::isfinite(axis.ticks[i]));
      if (i > 0) {
        EXPECT_LE(axis.ticks[i - 1], axis.ticks[i]);
      }
    }
  }
  EXPECT_THROW(nice_axis(kNaN, 1), Error);
  EXPECT_THROW(nice_axis(0, kInf), Error);
  EXPECT_THROW(nice_axis(0, 1, 1), Error);
}

TEST(Plot, TickLabels) {
  EXPECT_EQ(format_tick(0, 0.002), "0");
  EXPECT_EQ(format_tick(0.004, 0.002), "0.004");
  EXPECT_EQ(format_tick(3.2, 0.2), "3.2");
  EXPECT_EQ(format_tick(1000, 200), "1000");
  EXPECT_EQ(format_tick(2.4e9, 2e8), "2.4e+09");
  EXPECT_EQ(format_tick(2.5e-12, 5e-13), "2.5e-12");
  EXPECT_EQ(format_tick(-0.3, 0.1), "-0.3");
  // Six digits cannot tell 1000000000.0002 from 1000000000.0004: more are used.
  EXPECT_EQ(format_tick(1000000000.0002, 0.0002), "1000000000.0002");
}

TEST(Plot, XmlEscape) {
  EXPECT_EQ(xml_escape("a<b & c>d \"q\" 'r'"), "a&lt;b &amp; c&gt;d &quot;q&quot; &apos;r&apos;");
  EXPECT_EQ(xml_escape(std::string("x\x01y\tz\n", 6)), "xy\tz\n");
  EXPECT_EQ(xml_escape("größe"), "größe");
}

TEST(Plot, ChartIsWellFormedWithOnePolylinePerSeries) {
  std::vector<double> x, train, eval_x, eval;
  for (int i = 1; i <= 50; ++i) {
    x.push_back(i);
    train.push_back(4.0 / std::sqrt(i));
    if (i % 10 == 0) {
      eval_x.push_back(i);
      eval.push_back(4.2 / std::sqrt(i));
    }
  }
  const std::string svg =
      line_chart_svg({series("train", x, train), series("eval", eval_x, eval, "#ff0000")}, options());
  EXPECT_EQ(check_well_formed(svg), "");
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("version=\"1.1\""), std::string::npos);
  EXPECT_NE(svg.find("width=\"800\" height=\"480\""), std::string::npos);
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(point_count(lines[0]), 50);
  EXPECT_EQ(point_count(lines[1]), 5);
  EXPECT_NE(svg.find("stroke=\"#ff0000\" points="), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#1f77b4\" points="), std::string::npos);  // first palette colour
  // Title, axis labels, legend entries.
  EXPECT_NE(svg.find(">loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">60</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">0.5</text>"), std::string::npos);
  EXPECT_NE(svg.find(">train</text>"), std::string::npos);
  EXPECT_NE(svg.find(">eval</text>"), std::string::npos);
  // x ticks 0..50 by 10 (0..60 by 20 misses the target by as much, but is looser), y ticks 0..4 by 1.
  for (const char* label : {">0</text>", ">10</text>", ">50</text>", ">1</text>", ">4</text>"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
}

TEST(Plot, PolylineCoordinatesStayInsideThePlotArea) {
  const std::string svg = line_chart_svg({series("a", {0, 5, 10}, {1, 3, 2})}, options());
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 1u);
  // Data x 0..10 maps onto [left, 780], y 1..3 onto [bottom, 40]: each coordinate within the drawing.
  std::string points = lines[0];
  for (size_t pos = 0; pos < points.size();) {
    const size_t comma = points.find(',', pos);
    const size_t space = points.find(' ', comma);
    const double px = std::stod(points.substr(pos, comma - pos));
    const double py = std::stod(points.substr(comma + 1, space - comma - 1));
    EXPECT_GE(px, 0);
    EXPECT_LE(px, 780.0 + 1e-9);
    EXPECT_GE(py, 40.0 - 1e-9);
    EXPECT_LE(py, 480);
    pos = space == std::string::npos ? points.size() : space + 1;
  }
  EXPECT_EQ(points.substr(points.rfind(' ') + 1, 6), "780.00");  // the last x is the axis end, 10
}

TEST(Plot, NonFinitePointsBreakTheLine) {
  const std::string svg = line_chart_svg(
      {series("loss", {1, 2, 3, 4, 5, 6, 7, 8, 9}, {1.0, 0.9, kNaN, 0.8, 0.7, 0.6, kInf, 0.5, 0.4})}, options());
  EXPECT_EQ(check_well_formed(svg), "");
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(point_count(lines[0]), 2);
  EXPECT_EQ(point_count(lines[1]), 3);
  EXPECT_EQ(point_count(lines[2]), 2);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // An isolated finite point between gaps becomes a dot.
  const std::string dotted = line_chart_svg({series("s", {1, 2, 3}, {kNaN, 2.0, kNaN})}, options());
  EXPECT_EQ(check_well_formed(dotted), "");
  EXPECT_EQ(polylines(dotted).size(), 0u);
  EXPECT_EQ(count(dotted, "<circle"), 1);
}

TEST(Plot, EmptyInputIsAValidNoDataChart) {
  for (const auto& input : std::vector<std::vector<Series>>{
           {}, {series("train", {}, {})}, {series("train", {1, 2}, {kNaN, kNaN})}}) {
    const std::string svg = line_chart_svg(input, options());
    EXPECT_EQ(check_well_formed(svg), "");
    EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
    EXPECT_EQ(svg.find("<polyline"), std::string::npos);
  }
}

TEST(Plot, SinglePointIsADot) {
  const std::string svg = line_chart_svg({series("train", {100}, {2.5})}, options());
  EXPECT_EQ(check_well_formed(svg), "");
  EXPECT_EQ(polylines(svg).size(), 0u);
  EXPECT_EQ(count(svg, "<circle"), 1);
  EXPECT_EQ(svg.find("no data"), std::string::npos);
  // Both ranges were padded around the point: 95..105 and 2.375..2.625.
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);
  EXPECT_NE(svg.find(">2.5</text>"), std::string::npos);
}

TEST(Plot, ConstantYIsPadded) {
  const std::string svg = line_chart_svg({series("flat", {0, 1, 2, 3}, {7, 7, 7, 7})}, options());
  EXPECT_EQ(check_well_formed(svg), "");
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(point_count(lines[0]), 4);
  EXPECT_NE(svg.find(">7</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(Plot, HugeAndTinyMagnitudes) {
  const std::string huge = line_chart_svg({series("h", {0, 1, 2}, {1e30, 5e30, 3e30})}, options());
  EXPECT_EQ(check_well_formed(huge), "");
  EXPECT_NE(huge.find(">5e+30</text>"), std::string::npos);
  const std::string tiny = line_chart_svg({series("t", {1e-9, 2e-9}, {1e-8, 3e-8})}, options());
  EXPECT_EQ(check_well_formed(tiny), "");
  EXPECT_NE(tiny.find(">2e-09</text>"), std::string::npos);
  const std::string extreme = line_chart_svg({series("e", {0, 1}, {-1.7e308, 1.7e308})}, options());
  EXPECT_EQ(check_well_formed(extreme), "");
  EXPECT_EQ(point_count(polylines(extreme).at(0)), 2);
  EXPECT_EQ(extreme.find("nan"), std::string::npos);
  EXPECT_EQ(extreme.find("inf"), std::string::npos);
}

TEST(Plot, EscapesAllText) {
  ChartOptions o = options("loss <run&1> \"q\"");
  o.x_label = "a<b";
  o.y_label = "c&d";
  const std::string svg = line_chart_svg({series("x<y&z", {0, 1}, {0, 1}, "red\"/><script")}, o);
  EXPECT_EQ(check_well_formed(svg), "");
  EXPECT_NE(svg.find("loss &lt;run&amp;1&gt; &quot;q&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">a&lt;b</text>"), std::string::npos);
  EXPECT_NE(svg.find(">c&amp;d</text>"), std::string::npos);
  EXPECT_NE(svg.find(">x&lt;y&amp;z</text>"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("<run"), std::string::npos);
}

TEST(Plot, SizeAndLegendOptions) {
  ChartOptions o = options("");
  o.width = 300;
  o.height = 200;
  const std::string svg = line_chart_svg({series("", {0, 1}, {0, 1})}, o);
  EXPECT_EQ(check_well_formed(svg), "");
  EXPECT_NE(svg.find("width=\"300\" height=\"200\" viewBox=\"0 0 300 200\""), std::string::npos);
  EXPECT_EQ(svg.find("<title>"), std::string::npos);  // no title
  EXPECT_EQ(count(svg, "<g font-size=\"12\">"), 0);    // no named series, no legend
}

TEST(Plot, RejectsBadInput) {
  ChartOptions small = options();
  small.width = 100;
  EXPECT_THROW(line_chart_svg({}, small), ConfigError);
  try {
    line_chart_svg({series("train", {1, 2, 3}, {1, 2})}, options());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'train' has 3 x values but 2 y values"), std::string::npos) << e.what();
  }
}

// The width attributes of the bars (<rect class="bar">), in order.
std::vector<double> bar_widths(const std::string& svg) {
  std::vector<double> out;
  for (size_t pos = svg.find("<rect class=\"bar\""); pos != std::string::npos;
       pos = svg.find("<rect class=\"bar\"", pos + 1)) {
    const size_t start = svg.find("width=\"", pos) + 7;
    out.push_back(std::stod(svg.substr(start, svg.find('"', start) - start)));
  }
  return out;
}

TEST(Plot, BarChartDrawsABarPerFiniteValue) {
  ChartOptions o;
  o.title = "bench <1>";
  const std::string svg = bar_chart_svg({"lora", "full <x>", "qlora"},
                                        {{"tokens/s", {100, 250, kNaN}, ""}, {"peak RSS (MiB)", {10, 20, kNaN}, "red"}}, o);
  EXPECT_EQ(check_well_formed(svg), "");
  const std::vector<double> widths = bar_widths(svg);
  ASSERT_EQ(widths.size(), 4u);  // two panels, two finite values each
  EXPECT_NEAR(widths[1] / widths[0], 2.5, 1e-3);  // bars from 0, proportional to the values
  EXPECT_NEAR(widths[3] / widths[2], 2.0, 1e-3);
  EXPECT_EQ(count(svg, ">n/a</text>"), 2);
  EXPECT_NE(svg.find(">full &lt;x&gt;</text>"), std::string::npos);
  EXPECT_NE(svg.find("bench &lt;1&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">tokens/s</text>"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"red\""), std::string::npos);
  EXPECT_NE(svg.find(">250</text>"), std::string::npos);  // the value beside its bar
  // Every value missing: the frame, labels and n/a marks, no bar.
  const std::string empty = bar_chart_svg({"a"}, {{"x", {kNaN}, ""}}, o);
  EXPECT_EQ(check_well_formed(empty), "");
  EXPECT_TRUE(bar_widths(empty).empty());
}

TEST(Plot, BarChartRejectsBadInput) {
  ChartOptions o;
  EXPECT_THROW(bar_chart_svg({"a"}, {}, o), ConfigError);
  EXPECT_THROW(bar_chart_svg({}, {{"x", {}, ""}}, o), ConfigError);
  EXPECT_THROW(bar_chart_svg({"a", "b"}, {{"x", {1}, ""}}, o), ConfigError);
  EXPECT_THROW(bar_chart_svg({"a"}, {{"x", {-1}, ""}}, o), ConfigError);
  EXPECT_THROW(bar_chart_svg({"a"}, {{"x", {kInf}, ""}}, o), ConfigError);
  o.height = 50;
  EXPECT_THROW(bar_chart_svg({"a"}, {{"x", {1}, ""}}, o), ConfigError);
}

TEST(Plot, WriteLossCurveSvg) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "swiftcpp_plot";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto file = dir / "loss.svg";
  write_loss_curve_svg(file, series("", {1, 2, 3}, {3, 2, 1}), series("", {}, {}), "run <1>");
  const std::string svg = read_text_file(file);
  EXPECT_EQ(check_well_formed(svg), "");
  EXPECT_EQ(polylines(svg).size(), 1u);
  EXPECT_NE(svg.find(">train</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">eval</text>"), std::string::npos);  // empty eval series left out
  EXPECT_NE(svg.find("run &lt;1&gt;"), std::string::npos);
  // Overwrites atomically, leaving no temporary file behind.
  write_loss_curve_svg(file, series("", {1, 2}, {3, 2}), series("", {2}, {2.5}), "again");
  const std::string second = read_text_file(file);
  EXPECT_NE(second.find(">eval</text>"), std::string::npos);
  EXPECT_EQ(count(second, "<circle"), 1);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_loss_curve_svg(dir / "missing" / "loss.svg", series("", {1}, {1}), series("", {}, {}), ""),
               IoError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace swiftcpp
