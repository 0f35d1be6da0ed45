// Multimodal benchmark scoring against the real toolkits: every fixture of ../shared/assets/reference/mm_eval
// (VLMEvalKit and lmms-eval scoring code run on hand-written predictions) read from its VLMEvalKit TSV or its
// lmms-eval rows and scored by each toolkit's rules here, item by item exactly and aggregate by aggregate to 1e-12
// relative (the README's comparison rule). Python semantics the rules lean on are checked against CPython.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>

#include "core/error.h"
#include "eval/mm_bench.h"
#include "eval/metrics.h"
#include "eval/mm_rules.h"
#include "eval/regex.h"
#include "eval/pycompat.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

namespace mm = eval::mm;
namespace py = eval::py;

std::filesystem::path fixtures() { return test::assets() / "reference" / "mm_eval"; }

Json load_fixture(const std::string& name) { return load_json_file(fixtures() / (name + ".json")); }

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A TSV cell as pandas' to_csv writes it: quoted when it holds a tab, newline or quote.
std::string tsv_cell(const std::string& s) {
  if (s.find_first_of("\t\n\r\"") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The benchmark TSV with a `prediction` column from the fixture (VLMEvalKit's prediction file), written under dir.
std::filesystem::path predictions_tsv(const std::string& tsv, const Json& fixture, const std::filesystem::path& dir) {
  std::map<int64_t, std::string> predictions;
  for (const Json& item : fixture.at("items")) {
    const int64_t index = item.contains("vlmevalkit_index") ? item.at("vlmevalkit_index").get<int64_t>() : item.at("index").get<int64_t>();
    predictions[index] = item.at("prediction").get<std::string>();
  }
  std::istringstream in(read_all(fixtures() / tsv));
  std::string line, out;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      out += line + "\tprediction\n";
      header = false;
      continue;
    }
    const int64_t index = std::stoll(line.substr(0, line.find('\t')));
    out += line + "\t" + tsv_cell(predictions.at(index)) + "\n";
  }
  const auto path = dir / ("pred_" + tsv);
  std::ofstream(path, std::ios::binary) << out;
  return path;
}

// lmms-eval --log_samples records: {"doc": doc, "resps": [[prediction]]} per document.
std::filesystem::path lmms_samples(const Json& fixture, const std::string& doc_field, const std::filesystem::path& dir,
                                   const std::string& name) {
  std::string out;
  for (const Json& item : fixture.at("items")) {
    const Json docs = item.at(doc_field).is_array() ? item.at(doc_field) : Json::array({item.at(doc_field)});
    for (const Json& doc : docs) {
      out += Json({{"doc", doc}, {"resps", Json::array({Json::array({item.at("prediction")})})}}).dump() + "\n";
    }
  }
  const auto path = dir / (name + "_samples.jsonl");
  std::ofstream(path, std::ios::binary) << out;
  return path;
}

// Every number of `expected` is in `actual` under the same keys, to 1e-12 relative; strings and booleans equal.
void expect_matches(const Json& actual, const Json& expected, const std::string& where) {
  if (expected.is_object()) {
    ASSERT_TRUE(actual.is_object()) << where << ": expected an object, got " << actual.dump();
    for (const auto& [key, value] : expected.items()) {
      ASSERT_TRUE(actual.contains(key)) << where << ": no key '" << key << "' in " << actual.dump();
      expect_matches(actual.at(key), value, where + "." + key);
    }
  } else if (expected.is_number()) {
    ASSERT_TRUE(actual.is_number()) << where << ": expected " << expected.dump() << ", got " << actual.dump();
    const double e = expected.get<double>(), a = actual.get<double>();
    EXPECT_LE(std::fabs(a - e), 1e-12 * std::max(1.0, std::fabs(e))) << where << ": " << a << " vs " << e;
  } else {
    EXPECT_EQ(actual, expected) << where;
  }
}

class MmEvalScoring : public ::testing::Test {
 protected:
  void SetUp() override {
    SWIFTCPP_REQUIRE_SHARED(fixtures() / "README.md");
    dir_ = test::temp_dir(std::string("mm_eval_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

mm::BenchResult score(const std::filesystem::path& file, mm::Benchmark b, mm::Rules rules, bool strip = true,
                      bool official_open = true) {
  mm::ScoreOptions options;
  options.rules = rules;
  options.strip_reasoning = strip;
  options.mmmu_official_open = official_open;
  return mm::score_benchmark(mm::read_benchmark(file, b), options);
}

TEST(PyCompat, MatchesCPython) {
  // random.seed(0); [random.choice("ABCD") for _ in range(8)] and getrandbits(32) under CPython 3.11.
  py::Random rng(0);
  std::string letters;
  for (int i = 0; i < 8; ++i) letters += "ABCD"[rng.randbelow(4)];
  EXPECT_EQ(letters, "DDACDDCD");
  py::Random bits(0);
  EXPECT_EQ(bits.getrandbits(32), 3626764237u);
  EXPECT_EQ(bits.getrandbits(32), 1654615998u);
  // float(): what Python accepts and refuses.
  EXPECT_EQ(py::to_float(" 1_000 "), 1000.0);
  EXPECT_EQ(py::to_float("1e3"), 1000.0);
  EXPECT_EQ(py::to_float(".5"), 0.5);
  EXPECT_EQ(py::to_float("5."), 5.0);
  EXPECT_EQ(py::to_float("+12"), 12.0);
  EXPECT_EQ(py::to_float("\xd9\xa1\xd9\xa2"), 12.0);  // Arabic-Indic digits
  EXPECT_TRUE(std::isinf(*py::to_float("-Infinity")));
  EXPECT_TRUE(std::isnan(*py::to_float("NaN")));
  for (const char* bad : {"1,000", "$12", "0x10", "1__0", "_1", "1_", "1 0", "\xe2\x88\x92" "5", "", "e5", "."}) {
    EXPECT_FALSE(py::to_float(bad).has_value()) << bad;
  }
  // round(x, 2), repr(float), statistics.mean and numpy.mean.
  EXPECT_EQ(py::round_to(0.333, 2), 0.33);
  EXPECT_EQ(py::round_to(2.675, 2), 2.67);  // 2.675 is 2.67499999... in binary
  EXPECT_EQ(py::float_repr(1000.0), "1000.0");
  EXPECT_EQ(py::float_repr(0.1), "0.1");
  EXPECT_EQ(py::float_repr(1e16), "1e+16");
  EXPECT_EQ(py::float_repr(1e-5), "1e-05");
  EXPECT_EQ(py::exact_mean({0.1, 0.2, 0.3}), 0.2);           // statistics.mean([0.1, 0.2, 0.3])
  EXPECT_EQ(py::sequential_mean({0.1, 0.2, 0.3}), 0.20000000000000004);
  // numpy's pairwise sum and Python's left-to-right sum differ in the last bit here (values from CPython).
  const std::vector<double> vqa = {2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  EXPECT_EQ(py::numpy_mean(vqa), 0.5666666666666667);
  EXPECT_EQ(py::sequential_mean(vqa), 0.5666666666666665);
  EXPECT_EQ(py::exact_mean(vqa), 0.5666666666666667);
  const auto list = py::list_literal("['a', \"it's\", 'x\\'y', '\\u00e9']");
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(*list, (std::vector<std::string>{"a", "it's", "x'y", "\xc3\xa9"}));
  EXPECT_FALSE(py::list_literal("12").has_value());
  EXPECT_FALSE(py::list_literal("['a' 'b']").has_value());
}

TEST_F(MmEvalScoring, PopeScoresAsBothToolkits) {
  const Json fx = load_fixture("pope");
  const auto tsv = predictions_tsv("pope_style.tsv", fx, dir_);
  const auto vlm = score(tsv, mm::Benchmark::kPope, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), fx.at("items").size());
  for (size_t i = 0; i < vlm.items.size(); ++i) {
    const Json& e = fx.at("items")[i].at("vlmevalkit");
    EXPECT_EQ(vlm.items[i].parsed, e.at("extracted").get<std::string>()) << vlm.items[i].source;
    EXPECT_EQ(vlm.items[i].score, e.at("score").get<bool>() ? 1.0 : 0.0) << vlm.items[i].source;
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit_POPE_rating"), "pope.vlmevalkit");
  EXPECT_DOUBLE_EQ(vlm.headline, 86.8421052631579);

  // lmms-eval's own rows (one per question and split), and the same questions from the TSV, exploded.
  std::map<std::string, std::string> by_id;
  for (const Json& item : fx.at("items")) {
    for (const Json& doc : item.at("docs_lmms_eval")) by_id[doc.at("question_id").get<std::string>()] = item.at("prediction");
  }
  std::string rows;
  std::istringstream in(read_all(fixtures() / "pope_lmms_eval_style.jsonl"));
  for (std::string line; std::getline(in, line);) {
    Json row = Json::parse(line);
    row["prediction"] = by_id.at(row.at("question_id").get<std::string>());
    rows += row.dump() + "\n";
  }
  const auto jsonl = dir_ / "pope_rows.jsonl";
  std::ofstream(jsonl) << rows;
  Json expected = fx.at("aggregate").at("lmms_eval");
  expected["pope"] = expected.at("pope (all rows)");
  expected.erase("pope (all rows)");
  for (const auto& file : {jsonl, tsv}) {
    const auto lmms = score(file, mm::Benchmark::kPope, mm::Rules::kLmmsEval);
    EXPECT_EQ(lmms.items.size(), 73u);
    expect_matches(lmms.aggregate, expected, "pope.lmms_eval " + file.filename().string());
  }
  const auto raw = score(jsonl, mm::Benchmark::kPope, mm::Rules::kLmmsEval, false);
  expect_matches(raw.aggregate.at("pope"), fx.at("aggregate").at("lmms_eval_no_reasoning_strip").at("pope (all rows)"),
                 "pope.lmms_eval_no_reasoning_strip");
}

TEST_F(MmEvalScoring, MmbenchCircularScoresAsBothToolkits) {
  const Json fx = load_fixture("mmbench");
  const auto tsv = predictions_tsv("mmbench_dev_en_style.tsv", fx, dir_);
  std::map<int64_t, const Json*> expected_rows;
  for (const Json& item : fx.at("items")) expected_rows[item.at("index").get<int64_t>()] = &item;
  std::map<int64_t, const Json*> groups;
  for (const Json& g : fx.at("groups")) groups[g.at("group").get<int64_t>()] = &g;

  const auto vlm = score(tsv, mm::Benchmark::kMMBench, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), expected_rows.size());
  for (const auto& r : vlm.items) {
    const Json& e = *expected_rows.at(r.index);
    EXPECT_EQ(r.detail.at("can_infer"), e.at("vlmevalkit").at("can_infer")) << r.source << " " << r.prediction;
    EXPECT_EQ(r.score, groups.at(r.index % 1000000)->at("vlmevalkit_hit").get<double>()) << r.source;
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit_report_acc"), "mmbench.vlmevalkit");

  for (const auto& file : {tsv, lmms_samples(fx, "doc_lmms_eval", dir_, "mmbench")}) {
    const auto lmms = score(file, mm::Benchmark::kMMBench, mm::Rules::kLmmsEval);
    ASSERT_EQ(lmms.items.size(), expected_rows.size());
    for (const auto& r : lmms.items) {
      const Json& e = expected_rows.at(r.index)->at("lmms_eval");
      EXPECT_EQ(r.detail.at("prefetch_can_infer"), e.at("prefetch_can_infer")) << r.source << " " << r.prediction;
      EXPECT_EQ(r.detail.at("static_extract_mcq_answer"), e.at("static_extract_mcq_answer")) << r.source << " " << r.prediction;
      EXPECT_EQ(r.score, groups.at(r.index % 1000000)->at("lmms_eval_static_hit").get<double>()) << r.source;
    }
    expect_matches(lmms.aggregate, fx.at("aggregate").at("lmms_eval_mmbench_en_dev_static"), "mmbench.lmms_eval");
  }
}

TEST_F(MmEvalScoring, ScienceQaScoresAsBothToolkits) {
  const Json fx = load_fixture("scienceqa_img");
  const auto tsv = predictions_tsv("scienceqa_img_style.tsv", fx, dir_);
  const auto vlm = score(tsv, mm::Benchmark::kScienceQA, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), fx.at("items").size());
  for (size_t i = 0; i < vlm.items.size(); ++i) {
    EXPECT_EQ(vlm.items[i].score, fx.at("items")[i].at("vlmevalkit").at("hit").get<double>())
        << vlm.items[i].source << " " << vlm.items[i].prediction;
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit_report_acc"), "sqa.vlmevalkit");
  const auto samples = lmms_samples(fx, "doc_lmms_eval", dir_, "sqa");
  for (const auto& file : {tsv, samples}) {
    const auto lmms = score(file, mm::Benchmark::kScienceQA, mm::Rules::kLmmsEval);
    for (size_t i = 0; i < lmms.items.size(); ++i) {
      EXPECT_EQ(lmms.items[i].score, fx.at("items")[i].at("lmms_eval").at("exact_match").get<double>())
          << lmms.items[i].source << " " << lmms.items[i].prediction;
    }
    expect_matches(lmms.aggregate, fx.at("aggregate").at("lmms_eval_scienceqa_img"), "sqa.lmms_eval");
  }
  const auto raw = score(samples, mm::Benchmark::kScienceQA, mm::Rules::kLmmsEval, false);
  expect_matches(raw.aggregate, fx.at("aggregate").at("lmms_eval_no_reasoning_strip"), "sqa.no_strip");
}

TEST_F(MmEvalScoring, MmmuScoresAsBothToolkitsAndBothOpenContracts) {
  const Json fx = load_fixture("mmmu");
  const auto tsv = predictions_tsv("mmmu_style.tsv", fx, dir_);
  const auto vlm = score(tsv, mm::Benchmark::kMMMU, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), fx.at("items").size());
  for (size_t i = 0; i < vlm.items.size(); ++i) {
    EXPECT_EQ(vlm.items[i].score, fx.at("items")[i].at("vlmevalkit").at("hit").get<double>())
        << vlm.items[i].source << " " << vlm.items[i].prediction;
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit_report_acc"), "mmmu.vlmevalkit");
  const auto samples = lmms_samples(fx, "doc_lmms_eval", dir_, "mmmu");
  for (bool official : {false, true}) {
    const std::string variant = official ? "lmms_eval_official_contract_pre724" : "lmms_eval";
    for (const auto& file : {tsv, samples}) {
      const auto lmms = score(file, mm::Benchmark::kMMMU, mm::Rules::kLmmsEval, true, official);
      ASSERT_EQ(lmms.items.size(), fx.at("items").size());
      for (size_t i = 0; i < lmms.items.size(); ++i) {
        const Json& item = fx.at("items")[i];
        const Json& e = item.at(variant);
        const auto& r = lmms.items[i];
        EXPECT_EQ(r.detail.at("correct").get<bool>(), e.at("correct").get<bool>()) << variant << " " << r.source << " " << r.prediction;
        EXPECT_EQ(r.detail.at("random_fallback").get<bool>(), e.at("random_fallback").get<bool>()) << r.source;
        if (item.at("question_type") == "multiple-choice") {
          EXPECT_EQ(r.detail.at("parsed_pred"), e.at("parsed_pred")) << r.source << " " << r.prediction;
        } else if (official && !item.at("prediction").get<std::string>().empty()) {
          // (An empty prediction cell reads back as NaN, "nan" as VLMEvalKit's str() gives; the fixture scored
          // the empty string. The score is the same.)
          // A Python set: compare the candidates without their order.
          std::multiset<std::string> want, got;
          for (const Json& v : e.at("parsed_pred")) want.insert(v.dump());
          for (const Json& v : r.detail.at("parsed_pred")) got.insert(v.dump());
          EXPECT_EQ(got, want) << r.source << " " << r.prediction;
        }
      }
      expect_matches(lmms.aggregate, fx.at("aggregate").at(variant), "mmmu." + variant);
    }
  }
}

TEST_F(MmEvalScoring, TextVqaScoresAsBothToolkits) {
  const Json fx = load_fixture("textvqa");
  const auto tsv = predictions_tsv("textvqa_style.tsv", fx, dir_);
  const auto vlm = score(tsv, mm::Benchmark::kTextVQA, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), fx.at("items").size());
  for (size_t i = 0; i < vlm.items.size(); ++i) {
    const Json& e = fx.at("items")[i].at("vlmevalkit");
    const auto& r = vlm.items[i];
    if (!fx.at("items")[i].at("prediction").get<std::string>().empty()) {  // an empty cell reads back as "nan"
      EXPECT_EQ(r.parsed, e.at("pred_normalised").get<std::string>()) << r.source << " " << r.prediction;
    }
    EXPECT_EQ(r.detail.at("answers_normalised"), e.at("answers_normalised")) << r.source;
    EXPECT_EQ(r.score, e.at("score").get<double>()) << r.source << " " << r.prediction;  // np.mean, exactly
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit"), "textvqa.vlmevalkit");
  const auto samples = lmms_samples(fx, "doc_lmms_eval", dir_, "textvqa");
  for (const auto& file : {tsv, samples}) {
    const auto lmms = score(file, mm::Benchmark::kTextVQA, mm::Rules::kLmmsEval);
    for (size_t i = 0; i < lmms.items.size(); ++i) {
      const Json& e = fx.at("items")[i].at("lmms_eval");
      const auto& r = lmms.items[i];
      if (!fx.at("items")[i].at("prediction").get<std::string>().empty() || file == samples) {
        EXPECT_EQ(r.parsed, e.at("pred_normalised").get<std::string>()) << r.source << " " << r.prediction;
      }
      EXPECT_EQ(r.detail.at("answers_normalised"), e.at("answers_normalised")) << r.source;
      EXPECT_EQ(r.score, e.at("exact_match").get<double>()) << r.source << " " << r.prediction;  // statistics.mean
    }
    expect_matches(lmms.aggregate, fx.at("aggregate").at("lmms_eval_textvqa_val"), "textvqa.lmms_eval");
  }
  const auto raw = score(samples, mm::Benchmark::kTextVQA, mm::Rules::kLmmsEval, false);
  expect_matches(raw.aggregate, fx.at("aggregate").at("lmms_eval_no_reasoning_strip"), "textvqa.no_strip");
}

TEST_F(MmEvalScoring, ChartQaScoresAsBothToolkits) {
  const Json fx = load_fixture("chartqa");
  const auto tsv = predictions_tsv("chartqa_style.tsv", fx, dir_);
  const auto vlm = score(tsv, mm::Benchmark::kChartQA, mm::Rules::kVLMEvalKit);
  ASSERT_EQ(vlm.items.size(), fx.at("items").size());
  for (size_t i = 0; i < vlm.items.size(); ++i) {
    EXPECT_EQ(vlm.items[i].score, fx.at("items")[i].at("vlmevalkit").at("hit").get<double>())
        << vlm.items[i].source << " " << vlm.items[i].prediction;
  }
  expect_matches(vlm.aggregate, fx.at("aggregate").at("vlmevalkit"), "chartqa.vlmevalkit");
  const auto samples = lmms_samples(fx, "doc_lmms_eval", dir_, "chartqa");
  for (const auto& file : {tsv, samples}) {
    const auto lmms = score(file, mm::Benchmark::kChartQA, mm::Rules::kLmmsEval);
    for (size_t i = 0; i < lmms.items.size(); ++i) {
      EXPECT_EQ(lmms.items[i].score, fx.at("items")[i].at("lmms_eval").at("relaxed_overall").get<double>())
          << lmms.items[i].source << " " << lmms.items[i].prediction;
    }
    expect_matches(lmms.aggregate, fx.at("aggregate").at("lmms_eval_chartqa"), "chartqa.lmms_eval");
  }
  const auto raw = score(samples, mm::Benchmark::kChartQA, mm::Rules::kLmmsEval, false);
  expect_matches(raw.aggregate, fx.at("aggregate").at("lmms_eval_no_reasoning_strip"), "chartqa.no_strip");
}

TEST_F(MmEvalScoring, BadBenchmarkFilesNameTheRowAndField) {
  auto write = [&](const std::string& name, const std::string& text) {
    const auto p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  };
  auto expect_error = [&](const std::filesystem::path& file, mm::Benchmark b, const std::string& part) {
    try {
      (void)mm::read_benchmark(file, b);
      ADD_FAILURE() << "no error for " << file << " (" << part << ")";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error(write("a.tsv", "index\tquestion\nx\ty\n"), mm::Benchmark::kPope, "a.tsv:1: no column 'answer'");
  expect_error(write("b.tsv", "index\tquestion\tanswer\tcategory\n1\tq\tmaybe\trandom\n"), mm::Benchmark::kPope,
               "b.tsv:2: column 'answer': answer must be yes or no");
  expect_error(write("c.tsv", "index\tquestion\tanswer\tcategory\n1\tq\tYes\n"), mm::Benchmark::kPope,
               "c.tsv:2: 3 fields where the header has 4");
  expect_error(write("d.tsv", "index\tquestion\tanswer\tA\tB\n1\tq\tC\tx\ty\n"), mm::Benchmark::kMMBench,
               "d.tsv:2: answer 'C' is not one of the options' letters");
  expect_error(write("e.tsv", "index\tquestion\tanswer\tA\tB\n1.5\tq\tA\tx\ty\n"), mm::Benchmark::kMMBench,
               "e.tsv:2: column 'index' is '1.5', not an integer");
  expect_error(write("f.tsv", "index\tquestion\tanswer\tA\tB\n1\t\"q\tA\tx\ty\n"), mm::Benchmark::kMMBench,
               "f.tsv:2: a quoted field is not closed");
  expect_error(write("g.jsonl", "{\"question\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 2}\n"),
               mm::Benchmark::kScienceQA, "g.jsonl:1: answer 2 is out of range for 2 choices");
  expect_error(write("h.xlsx", "x"), mm::Benchmark::kPope, "xlsx is not read");
  // A rotation without its question row, and a row without a prediction, are refused when scoring.
  const auto orphan = write("i.tsv", "index\tquestion\tanswer\tA\tB\tprediction\n1000002\tq\tA\tx\ty\tA\n");
  EXPECT_THROW(mm::score_benchmark(mm::read_benchmark(orphan, mm::Benchmark::kMMBench), {}), FormatError);
  const auto unpredicted = write("j.tsv", "index\tquestion\tanswer\tcategory\n1\tq\tYes\trandom\n");
  try {
    (void)mm::score_benchmark(mm::read_benchmark(unpredicted, mm::Benchmark::kPope), {});
    ADD_FAILURE() << "no error for a row without a prediction";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("j.tsv:2: no prediction"), std::string::npos) << e.what();
  }
}

// The prompts each toolkit poses by default equal the ones its code built for every fixture item, and the TSV's
// base64 images (or references to another row) decode to the photos' bytes.
TEST_F(MmEvalScoring, PromptsAndImagesAreTheToolkitsOwn) {
  const std::vector<std::tuple<std::string, std::string, mm::Benchmark>> benchmarks = {
      {"pope", "pope_style.tsv", mm::Benchmark::kPope},
      {"mmbench", "mmbench_dev_en_style.tsv", mm::Benchmark::kMMBench},
      {"scienceqa_img", "scienceqa_img_style.tsv", mm::Benchmark::kScienceQA},
      {"mmmu", "mmmu_style.tsv", mm::Benchmark::kMMMU},
      {"textvqa", "textvqa_style.tsv", mm::Benchmark::kTextVQA},
      {"chartqa", "chartqa_style.tsv", mm::Benchmark::kChartQA}};
  for (const auto& [name, tsv, benchmark] : benchmarks) {
    const Json fx = load_fixture(name);
    const mm::BenchData data = mm::read_benchmark(fixtures() / tsv, benchmark);
    const auto images = mm::benchmark_images(data);
    std::map<int64_t, size_t> row_of;
    for (size_t i = 0; i < data.items.size(); ++i) row_of[data.items[i].index] = i;
    for (const Json& item : fx.at("items")) {
      const int64_t index = item.contains("vlmevalkit_index") ? item.at("vlmevalkit_index").get<int64_t>() : item.at("index").get<int64_t>();
      const mm::BenchItem& row = data.items.at(row_of.at(index));
      std::vector<mm::PromptPart> want;
      for (const Json& part : item.at("prompt_vlmevalkit")) {
        want.push_back(part.at("type") == "image" ? mm::PromptPart{true, ""} : mm::PromptPart{false, part.at("value")});
      }
      const auto got = mm::benchmark_prompt(row, benchmark, mm::Rules::kVLMEvalKit);
      ASSERT_EQ(got.size(), want.size()) << row.source;
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].image, want[k].image) << row.source;
        EXPECT_EQ(got[k].text, want[k].text) << row.source;
      }
      const auto lmms = mm::benchmark_prompt(row, benchmark, mm::Rules::kLmmsEval);
      ASSERT_EQ(lmms.size(), 2u) << row.source;
      EXPECT_TRUE(lmms[0].image);
      EXPECT_EQ(lmms[1].text, item.at("prompt_lmms_eval").get<std::string>()) << row.source;
      const auto& image = images.at(row_of.at(index));
      ASSERT_EQ(image.size(), 1u) << row.source;
      EXPECT_EQ(*image[0].bytes, read_all(fixtures() / "images" / (item.at("image").get<std::string>() + ".jpg"))) << row.source;
    }
  }
  // A VLMEvalKit image cell naming no row, and undecodable base64, are errors naming file:line.
  const auto bad = dir_ / "bad.tsv";
  std::ofstream(bad) << "index\tquestion\tanswer\tcategory\timage\n1\tq\tYes\trandom\t7\n";
  EXPECT_THROW(mm::benchmark_images(mm::read_benchmark(bad, mm::Benchmark::kPope)), FormatError);
  std::ofstream(bad) << "index\tquestion\tanswer\tcategory\timage\n1\tq\tYes\trandom\t" << std::string(80, '*') << "\n";
  try {
    (void)mm::benchmark_images(mm::read_benchmark(bad, mm::Benchmark::kPope));
    ADD_FAILURE() << "no error for bad base64";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tsv:2: column 'image' is not valid base64"), std::string::npos) << e.what();
  }
}

// A model's answer may hold any bytes: every rule scores it (invalid UTF-8 read as Python's errors="replace" reads
// it) instead of failing in the regex engine. Found by fuzz_mm_bench: "matching the regex ... failed (code -22)".
TEST(MmRules, AnswersThatAreNotUtf8AreScored) {
  const mm::Options options = {{'A', "a cup"}, {'B', "a cat"}};
  const std::string bad = "The answer is \xb9 B \xff\xfe";
  EXPECT_EQ(mm::vlmeval_can_infer(bad, options), "B");
  EXPECT_EQ(mm::vlmeval_can_infer("the answer is b \xc0\xaf", options), "B");  // an overlong form is invalid too
  EXPECT_EQ(mm::vlmeval_yes_no("\xe0\x80 yes"), "Yes");
  EXPECT_EQ(mm::lmms_extract_mcq_answer(bad, {'A', 'B'}), "B");
  EXPECT_EQ(mm::lmms_vqa_normalize("caf\xe9 1.5"), "caf\xef\xbf\xbd 1.5");
  py::Random rng(0);
  EXPECT_EQ(mm::lmms_mmmu_choice("(B) \xed\xa0\x80", options, rng).letter, "B");  // a surrogate
  EXPECT_NO_THROW((void)mm::mmmu_parse_open("so it is \xf5 12"));
  EXPECT_EQ(py::repair_utf8("ok \xe2\x82\xac"), "ok \xe2\x82\xac");
  EXPECT_EQ(py::repair_utf8("a\x80" "b"), "a\xef\xbf\xbd" "b");
  eval::AnswerFilter filter{"strict", "#### (\\-?[0-9\\.\\,]+)", 0, "[invalid]"};
  EXPECT_EQ(eval::extract_answer("\xff so #### 42", filter), "42");
}

using MmEvalCli = MmEvalScoring;

// `eval --predictions`: VLMEvalKit's prediction TSV and lmms-eval's samples re-scored without a model, under either
// toolkit's rules, with results.json and per-item samples; misuse refused before any work.
TEST_F(MmEvalCli, RescoresPredictionsUnderEitherToolkitsRules) {
  const Json fx = load_fixture("mmbench");
  const auto tsv = predictions_tsv("mmbench_dev_en_style.tsv", fx, dir_);
  const auto out = dir_ / "out";
  auto run = test::run_cli(fmt::format("eval --predictions {} --tasks mmbench --output-dir {} --log-samples", tsv.string(),
                                       out.string()));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("| dev | 0.4118 |"), std::string::npos) << run.out;  // VLMEvalKit's report row
  const Json results = load_json_file(out / "results.json");
  const Json& r = results.at("mm_results").at(0);
  EXPECT_EQ(r.at("rules"), "vlmevalkit");
  EXPECT_DOUBLE_EQ(r.at("headline").get<double>(), 0.4117647058823529);
  expect_matches(r.at("aggregate"), fx.at("aggregate").at("vlmevalkit_report_acc"), "cli.vlmevalkit");
  EXPECT_EQ(read_json_lines(out / "samples_mmbench.jsonl").size(), fx.at("items").size());
  // The same file under lmms-eval's rules; an existing results.json needs --overwrite.
  run = test::run_cli(fmt::format("eval --predictions {} --tasks MMBench_DEV_EN --rules lmms-eval --output-dir {}", tsv.string(),
                                  out.string()));
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_NE(run.out.find("--overwrite"), std::string::npos) << run.out;
  run = test::run_cli(fmt::format("eval --predictions {} --tasks MMBench_DEV_EN --rules lmms-eval --output-dir {} --overwrite",
                                  tsv.string(), out.string()));
  ASSERT_EQ(run.code, 0) << run.out;
  expect_matches(load_json_file(out / "results.json").at("mm_results").at(0).at("aggregate"),
                 fx.at("aggregate").at("lmms_eval_mmbench_en_dev_static"), "cli.lmms_eval");
  // Misuse.
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--tasks mmbench --rules vlmeval", "scoring rules must be vlmevalkit or lmms-eval"},
           {"--tasks mmlu", "'mmlu' is not a multimodal benchmark"},
           {"--tasks mmbench,pope", "takes one benchmark name"},
           {"--tasks mmbench --reasoning-tags off", "--reasoning-tags must be default or none"},
           {"--tasks mmbench --model " + test::stories_dir().string(), "drop --model"},
           {"--tasks pope", "pred_mmbench_dev_en_style.tsv:2: column 'answer': answer must be yes or no"}}) {
    run = test::run_cli(fmt::format("eval --predictions {} {}", tsv.string(), args));
    EXPECT_NE(run.code, 0) << args;
    EXPECT_NE(run.out.find(message), std::string::npos) << args << ": " << run.out;
  }
}

// `eval --model --tasks NAME=FILE`: a vision-language model answers a benchmark's rows (VLMEvalKit TSV with
// base64 images, lmms-eval rows with image paths) with each toolkit's prompt; the answer of a row equals `infer
// --image` on the same prompt and photo, the predictions file it writes re-scores to the same result, and --limit
// keeps whole MMBench questions.
TEST_F(MmEvalCli, AVisionModelAnswersBenchmarksAsInferDoes) {
  const fs::path model = test::assets() / "reference/llava/tiny-llava";
  SWIFTCPP_REQUIRE_SHARED(model / "config.json");
  const auto out = dir_ / "run";
  auto run = test::run_cli(fmt::format(
      "--threads 2 eval --model {} --tasks mmbench={},pope={} --limit 3 --max-new-tokens 6 --output-dir {} --log-samples",
      model.string(), (fixtures() / "mmbench_dev_en_style.tsv").string(),
      (fixtures() / "pope_lmms_eval_style.jsonl").string(), out.string()));
  ASSERT_EQ(run.code, 0) << run.out;
  const Json results = load_json_file(out / "results.json");
  ASSERT_EQ(results.at("mm_results").size(), 2u);
  const Json& mmbench = results.at("mm_results").at(0);
  EXPECT_EQ(mmbench.at("rows"), 9);  // questions 1-3 with their rotations (4 + 3 + 2)
  const auto samples = read_json_lines(out / "samples_mmbench.jsonl");
  ASSERT_EQ(samples.size(), 9u);
  // Row index 1 asked alone through infer: the same greedy answer.
  const std::string prompt =
      "Question: What is the main object in the image?\nOptions:\nA. a coffee cup\nB. a rocket\nC. a cat\nD. a camera\n"
      "Please select the correct answer from the options above. \n";
  const auto prompts = dir_ / "prompts.jsonl";
  std::ofstream(prompts) << Json({{"prompt", "<image>\n" + prompt}, {"images", {(fixtures() / "images/coffee.jpg").string()}}}).dump()
                         << "\n";
  const auto infer = test::run_cli(fmt::format("infer --model {} --prompts-file {} --output {} --temperature 0 --max-new-tokens 6",
                                               model.string(), prompts.string(), (dir_ / "infer.jsonl").string()));
  ASSERT_EQ(infer.code, 0) << infer.out;
  std::string row1;
  for (const Json& sample : samples) {
    if (sample.at("index") == 1) row1 = sample.at("prediction").get<std::string>();
  }
  EXPECT_EQ(read_json_lines(dir_ / "infer.jsonl").at(0).at("response").get<std::string>(), row1);
  // One prompt at a time (each image through the tower per prompt batch, or kept from the last ones): the same
  // answers as eight at a time.
  const auto single = dir_ / "single";
  run = test::run_cli(fmt::format("--threads 2 eval --model {} --tasks mmbench={} --limit 3 --max-new-tokens 6 "
                                  "--batch-size 1 --output-dir {}",
                                  model.string(), (fixtures() / "mmbench_dev_en_style.tsv").string(), single.string()));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_EQ(read_all(single / "predictions_mmbench.tsv"), read_all(out / "predictions_mmbench.tsv"));
  // The predictions files re-score to the results the run reported.
  for (const auto& [task, file, index] : std::vector<std::tuple<std::string, std::string, int>>{
           {"mmbench", "predictions_mmbench.tsv", 0}, {"pope", "predictions_pope.jsonl", 1}}) {
    const auto again = dir_ / ("again_" + task);
    run = test::run_cli(fmt::format("eval --predictions {} --tasks {} --output-dir {}", (out / file).string(), task,
                                    again.string()));
    ASSERT_EQ(run.code, 0) << run.out;
    EXPECT_EQ(load_json_file(again / "results.json").at("mm_results").at(0).at("aggregate"),
              results.at("mm_results").at(index).at("aggregate"))
        << task;
  }
  // A text model cannot take a benchmark with images.
  run = test::run_cli(fmt::format("eval --model {} --tasks pope={}", test::stories_dir().string(),
                                  (fixtures() / "pope_lmms_eval_style.jsonl").string()));
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_NE(run.out.find("text model"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace swiftcpp
