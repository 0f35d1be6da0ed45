#include "eval/mm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/base64.h"
#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "eval/regex.h"

namespace swiftcpp::eval::mm {

namespace {

constexpr int64_t kRotation = 1000000;  // MMBench: rotation k of question g has index g + k * 1e6

struct NamedBenchmark {
  Benchmark benchmark;
  const char* name;
  const char* vlmeval_name;
};
constexpr NamedBenchmark kBenchmarks[] = {
    {Benchmark::kPope, "pope", "POPE"},
    {Benchmark::kMMBench, "mmbench", "MMBench_DEV_EN"},
    {Benchmark::kScienceQA, "scienceqa_img", "ScienceQA_TEST"},
    {Benchmark::kMMMU, "mmmu", "MMMU_DEV_VAL"},
    {Benchmark::kTextVQA, "textvqa", "TextVQA_VAL"},
    {Benchmark::kChartQA, "chartqa", "ChartQA_TEST"},
};

// ---- reading ----

// pandas 1.5's default na_values: cells that read as missing.
bool is_missing(const std::string& cell) {
  static const std::set<std::string> kMissing = {"",     "#N/A", "#N/A N/A", "#NA",  "-1.#IND", "-1.#QNAN", "-NaN",
                                                 "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",     "NA",       "NULL",
                                                 "NaN",  "n/a",  "nan",      "null"};
  return kMissing.count(cell) > 0;
}

struct Tsv {
  std::vector<std::string> header;
  std::vector<size_t> lines;  // the line each record starts on
  std::vector<std::vector<std::optional<std::string>>> rows;
};

Tsv parse_tsv(const std::string& text, const std::string& origin) {
  Tsv out;
  std::vector<std::vector<std::optional<std::string>>> records;
  std::vector<size_t> lines;
  size_t i = 0, line = 1;
  while (i < text.size()) {
    // One record; blank lines are skipped (pandas' skip_blank_lines).
    if (text[i] == '\n' || (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
      i += text[i] == '\r' ? 2 : 1;
      ++line;
      continue;
    }
    const size_t start_line = line;
    std::vector<std::optional<std::string>> record;
    while (true) {
      std::string cell;
      bool quoted = false;
      if (i < text.size() && text[i] == '"') {
        quoted = true;
        ++i;
        bool closed = false;
        while (i < text.size()) {
          if (text[i] == '"') {
            if (i + 1 < text.size() && text[i + 1] == '"') {
              cell += '"';
              i += 2;
              continue;
            }
            ++i;
            closed = true;
            break;
          }
          if (text[i] == '\n') ++line;
          cell += text[i++];
        }
        if (!closed) fail<FormatError>("{}:{}: a quoted field is not closed", origin, start_line);
        if (i < text.size() && text[i] != '\t' && text[i] != '\n' && text[i] != '\r') {
          fail<FormatError>("{}:{}: text after a quoted field's closing quote", origin, line);
        }
      } else {
        while (i < text.size() && text[i] != '\t' && text[i] != '\n' &&
               !(text[i] == '\r' && (i + 1 == text.size() || text[i + 1] == '\n'))) {
          cell += text[i++];
        }
      }
      record.push_back(!quoted && is_missing(cell) ? std::nullopt : std::optional<std::string>(cell));
      if (quoted && is_missing(cell)) record.back() = std::nullopt;
      if (i < text.size() && text[i] == '\t') {
        ++i;
        continue;
      }
      break;
    }
    if (i < text.size() && text[i] == '\r') ++i;
    if (i < text.size() && text[i] == '\n') {
      ++i;
      ++line;
    }
    records.push_back(std::move(record));
    lines.push_back(start_line);
  }
  if (records.empty()) fail<FormatError>("{}: no header row (an empty file)", origin);
  for (const auto& h : records.front()) out.header.push_back(h.value_or(""));
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != out.header.size()) {
      fail<FormatError>("{}:{}: {} fields where the header has {}", origin, lines[r], records[r].size(),
                        out.header.size());
    }
    out.rows.push_back(std::move(records[r]));
    out.lines.push_back(lines[r]);
  }
  return out;
}

// The gold of a yes/no question: "Yes" or "No" (either case, surrounding whitespace ignored).
std::string yes_no_gold(const std::string& answer, const std::string& where) {
  const std::string a = py::lower(py::strip(answer));
  if (a == "yes") return "Yes";
  if (a == "no") return "No";
  fail<FormatError>("{}: answer must be yes or no, got '{}'", where, answer);
}

bool is_option_letter(const std::string& s) { return s.size() == 1 && s[0] >= 'A' && s[0] <= 'Z'; }

void check_item(BenchItem& item, Benchmark benchmark) {
  const std::string& where = item.source;
  switch (benchmark) {
    case Benchmark::kPope:
      item.answer = yes_no_gold(item.answer, where + ": column 'answer'");
      if (item.categories.empty()) fail<FormatError>("{}: column 'category' is empty (POPE's splits)", where);
      break;
    case Benchmark::kMMBench:
    case Benchmark::kScienceQA:
      if (item.options.size() < 2) fail<FormatError>("{}: {} options; a question needs at least 2", where, item.options.size());
      if (!is_option_letter(item.answer) ||
          std::none_of(item.options.begin(), item.options.end(), [&](const auto& o) { return o.first == item.answer[0]; })) {
        fail<FormatError>("{}: answer '{}' is not one of the options' letters", where, item.answer);
      }
      break;
    case Benchmark::kMMMU:
      if (!item.options.empty() && item.question_type != "open") {
        if (!is_option_letter(item.answer)) {
          fail<FormatError>("{}: answer '{}' of a multiple-choice question is not a letter", where, item.answer);
        }
      }
      break;
    case Benchmark::kTextVQA:
      if (item.answers.empty()) {
        if (auto list = py::list_literal(item.answer)) {
          item.answers = *list;
        } else {
          item.answers = {item.answer};
        }
      }
      if (item.answers.empty()) fail<FormatError>("{}: no reference answers", where);
      break;
    case Benchmark::kChartQA:
      break;
  }
}

}  // namespace

const char* benchmark_name(Benchmark benchmark) {
  for (const auto& b : kBenchmarks) {
    if (b.benchmark == benchmark) return b.name;
  }
  return "?";
}

std::vector<std::string> benchmark_names() {
  std::vector<std::string> out;
  for (const auto& b : kBenchmarks) out.emplace_back(b.name);
  return out;
}

std::optional<Benchmark> parse_benchmark(const std::string& name) {
  const std::string lowered = py::lower(name);
  for (const auto& b : kBenchmarks) {
    if (lowered == b.name || lowered == py::lower(b.vlmeval_name)) return b.benchmark;
  }
  if (lowered == "scienceqa" || lowered == "scienceqa_img" || lowered == "scienceqa_test") return Benchmark::kScienceQA;
  if (lowered == "mmbench_dev_en" || lowered == "mmbench_en_dev") return Benchmark::kMMBench;
  return std::nullopt;
}

const char* rules_name(Rules rules) { return rules == Rules::kVLMEvalKit ? "vlmevalkit" : "lmms-eval"; }

Rules parse_rules(const std::string& name) {
  const std::string lowered = py::lower(name);
  if (lowered == "vlmevalkit") return Rules::kVLMEvalKit;
  if (lowered == "lmms-eval" || lowered == "lmms_eval") return Rules::kLmmsEval;
  fail<ConfigError>("scoring rules must be vlmevalkit or lmms-eval, got '{}'", name);
}

BenchData read_vlmeval_tsv(const fs::path& file, Benchmark benchmark, bool keep_images) {
  const std::string origin = file.string();
  const Tsv tsv = parse_tsv(read_text_file(file), origin);
  std::map<std::string, size_t> column;
  for (size_t c = 0; c < tsv.header.size(); ++c) {
    if (!column.emplace(tsv.header[c], c).second) fail<FormatError>("{}:1: column '{}' appears twice", origin, tsv.header[c]);
  }
  auto need = [&](const char* name) {
    if (!column.count(name)) {
      fail<FormatError>("{}:1: no column '{}' (a {} TSV has {})", origin, name, benchmark_name(benchmark),
                        benchmark == Benchmark::kPope ? "index, question, answer, category" : "index, question, answer");
    }
  };
  need("index");
  need("question");
  need("answer");
  if (benchmark == Benchmark::kPope) need("category");
  if (benchmark == Benchmark::kMMBench || benchmark == Benchmark::kScienceQA) need("A");
  BenchData data;
  data.benchmark = benchmark;
  data.layout = "vlmevalkit";
  data.file = origin;
  std::vector<size_t> kept;  // the columns written back with predictions
  for (size_t c = 0; c < tsv.header.size(); ++c) {
    if (tsv.header[c] != "image" && tsv.header[c] != "prediction") {
      kept.push_back(c);
      data.columns.push_back(tsv.header[c]);
    }
  }
  std::set<int64_t> seen;
  for (size_t r = 0; r < tsv.rows.size(); ++r) {
    const auto& row = tsv.rows[r];
    BenchItem item;
    item.source = fmt::format("{}:{}", origin, tsv.lines[r]);
    auto cell = [&](const char* name) -> std::optional<std::string> {
      const auto it = column.find(name);
      return it == column.end() ? std::nullopt : row[it->second];
    };
    const auto index = cell("index");
    if (!index) fail<FormatError>("{}: column 'index' is empty", item.source);
    char* end = nullptr;
    const long long value = std::strtoll(index->c_str(), &end, 10);
    if (index->empty() || *end != '\0') fail<FormatError>("{}: column 'index' is '{}', not an integer", item.source, *index);
    item.index = value;
    if (!seen.insert(item.index).second) fail<FormatError>("{}: index {} appears twice", item.source, item.index);
    item.question = cell("question").value_or("");
    item.hint = cell("hint").value_or("");
    const auto answer = cell("answer");
    if (!answer) fail<FormatError>("{}: column 'answer' is empty", item.source);
    item.answer = *answer;
    for (char c = 'A'; c <= 'Z'; ++c) {
      if (const auto o = cell(std::string(1, c).c_str())) item.options.emplace_back(c, *o);
    }
    item.id = cell("id").value_or("");
    item.category = cell("category").value_or("");
    item.l2_category = cell("l2-category").value_or("");
    item.split = cell("split").value_or("");
    item.question_type = cell("question_type").value_or("");
    if (benchmark == Benchmark::kPope) item.categories = split_list(item.category);
    if (keep_images) {
      if (const auto image = cell("image")) {
        const auto list = py::list_literal(*image);
        item.images = list ? *list : std::vector<std::string>{*image};
      }
    }
    if (column.count("prediction")) item.prediction = cell("prediction").value_or("nan");  // str(NaN), as VLMEvalKit reads it
    check_item(item, benchmark);
    data.items.push_back(std::move(item));
    std::vector<std::optional<std::string>> cells;
    for (size_t c : kept) cells.push_back(row[c]);
    data.cells.push_back(std::move(cells));
  }
  if (data.items.empty()) fail<FormatError>("{}: no rows after the header", origin);
  return data;
}

namespace {

std::string json_text(const Json& v, const std::string& where, const char* field, bool required = true) {
  if (!v.contains(field) || v.at(field).is_null()) {
    if (required) fail<FormatError>("{}: field '{}' is missing", where, field);
    return "";
  }
  const Json& f = v.at(field);
  if (f.is_string()) return f.get<std::string>();
  if (f.is_number_integer()) return std::to_string(f.get<int64_t>());
  if (f.is_number()) return py::float_repr(f.get<double>());
  fail<FormatError>("{}: field '{}' must be a string, got {}", where, field, describe_json(f));
}

}  // namespace

BenchData read_lmms_rows(const fs::path& file, Benchmark benchmark) {
  const Json rows = read_json_lines(file, "lmms-eval rows");
  BenchData data;
  data.benchmark = benchmark;
  data.layout = "lmms-eval";
  data.file = file.string();
  int64_t line = 0;
  for (const Json& record : rows) {
    ++line;
    BenchItem item;
    item.source = fmt::format("{}:{}", file.string(), line);
    if (!record.is_object()) fail<FormatError>("{}: a row must be a JSON object", item.source);
    // A --log_samples record holds the document under "doc" and the model's outputs under "resps".
    const bool sample = record.contains("doc") && record.at("doc").is_object();
    const Json& doc = sample ? record.at("doc") : record;
    if (sample) {
      const Json* r = record.contains("resps") ? &record.at("resps") : nullptr;
      while (r && r->is_array() && !r->empty()) r = &r->front();
      if (r && r->is_string()) item.prediction = r->get<std::string>();
      if (!item.prediction) fail<FormatError>("{}: field 'resps' holds no response text", item.source);
    } else if (record.contains("prediction") || record.contains("response")) {
      item.prediction = json_text(record, item.source, record.contains("prediction") ? "prediction" : "response");
    }
    item.index = line;
    item.question = json_text(doc, item.source, "question");
    switch (benchmark) {
      case Benchmark::kPope:
        item.id = json_text(doc, item.source, "question_id", false);
        item.answer = json_text(doc, item.source, "answer");
        item.categories = {json_text(doc, item.source, "category")};
        item.category = item.categories.front();
        break;
      case Benchmark::kMMBench: {
        item.index = std::stoll(json_text(doc, item.source, "index"));
        item.hint = json_text(doc, item.source, "hint", false);
        item.answer = json_text(doc, item.source, "answer");
        for (char c = 'A'; c <= 'D'; ++c) {
          const std::string o = json_text(doc, item.source, std::string(1, c).c_str(), false);
          if (!o.empty() && o != "nan") item.options.emplace_back(c, o);
        }
        item.category = json_text(doc, item.source, "category", false);
        item.l2_category = json_text(doc, item.source, doc.contains("L2-category") ? "L2-category" : "l2-category", false);
        item.split = json_text(doc, item.source, "split", false);
        break;
      }
      case Benchmark::kScienceQA: {
        item.hint = json_text(doc, item.source, "hint", false);
        if (!doc.contains("choices") || !doc.at("choices").is_array()) {
          fail<FormatError>("{}: field 'choices' must be a list of strings", item.source);
        }
        char c = 'A';
        for (const Json& choice : doc.at("choices")) {
          if (!choice.is_string()) fail<FormatError>("{}: field 'choices' must be a list of strings", item.source);
          item.options.emplace_back(c++, choice.get<std::string>());
        }
        if (!doc.contains("answer") || !doc.at("answer").is_number_integer()) {
          fail<FormatError>("{}: field 'answer' must be the index of the right choice", item.source);
        }
        const int64_t a = doc.at("answer").get<int64_t>();
        if (a < 0 || a >= static_cast<int64_t>(item.options.size())) {
          fail<FormatError>("{}: answer {} is out of range for {} choices", item.source, a, item.options.size());
        }
        item.answer = std::string(1, static_cast<char>('A' + a));
        item.category = json_text(doc, item.source, "subject", false);
        break;
      }
      case Benchmark::kMMMU: {
        item.id = json_text(doc, item.source, "id");
        item.answer = json_text(doc, item.source, "answer");
        item.question_type = json_text(doc, item.source, "question_type", false);
        const std::string options = json_text(doc, item.source, "options", false);
        if (!options.empty()) {
          const auto list = py::list_literal(options);
          if (!list) fail<FormatError>("{}: field 'options' is not a Python list of strings: {}", item.source, options);
          char c = 'A';
          for (const auto& o : *list) item.options.emplace_back(c++, o);
        }
        break;
      }
      case Benchmark::kTextVQA: {
        item.id = json_text(doc, item.source, "question_id", false);
        if (!doc.contains("answers") || !doc.at("answers").is_array()) {
          fail<FormatError>("{}: field 'answers' must be a list of strings", item.source);
        }
        for (const Json& a : doc.at("answers")) {
          if (!a.is_string()) fail<FormatError>("{}: field 'answers' must be a list of strings", item.source);
          item.answers.push_back(a.get<std::string>());
        }
        break;
      }
      case Benchmark::kChartQA:
        item.answer = json_text(doc, item.source, "answer");
        item.split = json_text(doc, item.source, "type", false);
        break;
    }
    // The images: `image` (a path or a list of paths), else MMMU's image_1..image_7.
    if (doc.contains("image") && doc.at("image").is_array()) {
      for (const Json& v : doc.at("image")) {
        if (!v.is_string()) fail<FormatError>("{}: field 'image' must be a path or a list of paths", item.source);
        item.images.push_back(v.get<std::string>());
      }
    } else if (doc.contains("image") && !doc.at("image").is_null()) {
      item.images.push_back(json_text(doc, item.source, "image"));
    } else {
      for (int k = 1; k <= 7; ++k) {
        const std::string field = "image_" + std::to_string(k);
        if (doc.contains(field) && doc.at(field).is_string()) item.images.push_back(doc.at(field).get<std::string>());
      }
    }
    check_item(item, benchmark);
    data.items.push_back(std::move(item));
    data.docs.push_back(doc);
  }
  if (data.items.empty()) fail<FormatError>("{}: no rows", file.string());
  return data;
}

BenchData read_benchmark(const fs::path& file, Benchmark benchmark, bool keep_images) {
  const std::string ext = py::lower(file.extension().string());
  if (ext == ".tsv") return read_vlmeval_tsv(file, benchmark, keep_images);
  if (ext == ".jsonl" || ext == ".json") return read_lmms_rows(file, benchmark);
  if (ext == ".xlsx") {
    fail<FormatError>("{}: xlsx is not read; save VLMEvalKit's predictions as TSV (PRED_FORMAT=tsv)", file.string());
  }
  fail<FormatError>("{}: unknown layout: .tsv (VLMEvalKit) or .jsonl (lmms-eval rows) expected", file.string());
}

// ---- scoring ----

namespace {

const std::string& prediction_of(const BenchItem& item) {
  if (!item.prediction) fail<FormatError>("{}: no prediction for this row", item.source);
  return *item.prediction;
}

std::string lmms_response(const BenchItem& item, const ScoreOptions& options) {
  const std::string& raw = prediction_of(item);
  return options.strip_reasoning ? lmms_strip_reasoning(raw) : raw;
}

double nan() { return std::nan(""); }

ItemResult base_result(const BenchItem& item) {
  ItemResult r;
  r.source = item.source;
  r.index = item.index;
  r.id = item.id;
  return r;
}

// VLMEvalKit's report_acc: one row per split, columns Overall, then each l2-category (abbreviated) and category.
struct HitRow {
  std::string split, l2, category;
  double hit;
};

void report_acc(const std::vector<HitRow>& rows, bool has_split, bool has_l2, bool has_category, BenchResult& out) {
  static const std::map<std::string, std::string> kAbbreviations = {
      {"coarse_perception", "CP"}, {"finegrained_perception (instance-level)", "FP-S"},
      {"finegrained_perception (cross-instance)", "FP-C"}, {"logic_reasoning", "LR"},
      {"relation_reasoning", "RR"}, {"attribute_reasoning", "AR"}};
  std::vector<std::string> splits;
  for (const auto& r : rows) {
    const std::string s = has_split ? r.split : "none";
    if (std::find(splits.begin(), splits.end(), s) == splits.end()) splits.push_back(s);
  }
  std::sort(splits.begin(), splits.end());
  ReportTable table;
  table.title = "VLMEvalKit report_acc";
  table.columns.push_back("Overall");
  std::vector<std::pair<int, std::string>> groups;  // (0 l2, 1 category), value
  if (has_l2) {
    std::set<std::string> values;
    for (const auto& r : rows) values.insert(r.l2);
    for (const auto& v : values) {
      groups.emplace_back(0, v);
      table.columns.push_back(kAbbreviations.count(v) ? kAbbreviations.at(v) : v);
    }
  }
  if (has_category) {
    std::set<std::string> values;
    for (const auto& r : rows) values.insert(r.category);
    for (const auto& v : values) {
      groups.emplace_back(1, v);
      table.columns.push_back(v);
    }
  }
  Json report = Json::object();
  for (const auto& s : splits) {
    auto mean_of = [&](const std::function<bool(const HitRow&)>& keep) {
      std::vector<double> hits;
      for (const auto& r : rows) {
        if ((has_split ? r.split : "none") == s && keep(r)) hits.push_back(r.hit);
      }
      return hits.empty() ? nan() : py::numpy_mean(hits);
    };
    std::vector<double> values = {mean_of([](const HitRow&) { return true; })};
    for (const auto& [kind, v] : groups) {
      values.push_back(mean_of([&, kind = kind, v = v](const HitRow& r) { return (kind == 0 ? r.l2 : r.category) == v; }));
    }
    Json row = Json::object();
    for (size_t c = 0; c < values.size(); ++c) row[table.columns[c]] = std::isnan(values[c]) ? Json() : Json(values[c]);
    report[s] = row;
    table.rows.emplace_back(s, values);
  }
  out.aggregate = report;
  out.tables.push_back(table);
  out.headline_metric = "Overall";
  out.headline = table.rows.empty() ? nan() : table.rows.front().second.front();
}

// ---- POPE ----

struct YesNoCounts {
  int64_t tp = 0, fp = 0, fn_vlm = 0, fn_lmms = 0, rows = 0, gold_yes = 0;
  std::vector<double> scores;
};

void pope_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<std::string> splits;
  std::map<std::string, YesNoCounts> by_split;
  YesNoCounts all;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = prediction_of(item);
    r.parsed = vlmeval_yes_no(r.prediction);
    const bool score = r.parsed == item.answer;
    r.score = score;
    r.detail = {{"extracted", r.parsed}, {"score", score}};
    out.items.push_back(r);
    // POPE_rating explodes the comma-joined category: a question counts once per split it belongs to.
    for (const auto& s : item.categories) {
      if (!by_split.count(s)) splits.push_back(s);
      for (YesNoCounts* c : {&all, &by_split[s]}) {
        const bool gold_yes = item.answer == "Yes", pred_yes = r.parsed == "Yes";
        c->tp += gold_yes && pred_yes;
        c->fp += !gold_yes && pred_yes;
        c->fn_vlm += gold_yes && !pred_yes;  // Unknown counts as a "no"
        c->scores.push_back(score ? 1.0 : 0.0);
      }
    }
  }
  ReportTable table;
  table.title = "VLMEvalKit POPE_rating";
  table.columns = {"Overall", "acc", "precision", "recall"};
  Json report = Json::object();
  auto add = [&](const std::string& name, const YesNoCounts& c) {
    const double precision = c.tp + c.fp ? static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fp) : 0.0;
    const double recall = c.tp + c.fn_vlm ? static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fn_vlm) : 0.0;
    const double f1 = precision + recall != 0 ? 2 * precision * recall / (precision + recall) : 0.0;
    const std::vector<double> values = {f1 * 100, py::numpy_mean(c.scores) * 100, precision * 100, recall * 100};
    report[name] = {{"Overall", values[0]}, {"acc", values[1]}, {"precision", values[2]}, {"recall", values[3]}};
    table.rows.emplace_back(name, values);
  };
  add("Overall", all);
  for (const auto& s : splits) add(s, by_split.at(s));
  out.aggregate = report;
  out.tables.push_back(table);
  out.headline_metric = "F1 (Overall)";
  out.headline = table.rows.front().second.front();
}

void pope_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  static const std::map<std::string, std::string> kTasks = {
      {"random", "pope_random"}, {"popular", "pope_pop"}, {"adversarial", "pope_adv"}};
  std::map<std::string, YesNoCounts> by_task;
  std::vector<std::string> tasks = {"pope"};
  for (const auto& item : data.items) {
    const std::string response = lmms_response(item, options);
    const std::string pred = py::lower(py::strip(response));
    const std::string gold = py::lower(item.answer);
    const bool score = pred == gold;
    // lmms-eval's rows are one per (question, split): a VLMEvalKit row in k splits gives k rows.
    for (const auto& s : item.categories) {
      ItemResult r = base_result(item);
      r.prediction = response;
      r.parsed = pred;
      r.score = score;
      r.detail = {{"response_after_reasoning_strip", response}, {"prediction_compared", pred}, {"score", score ? 1.0 : 0.0},
                  {"split", s}};
      out.items.push_back(r);
      std::vector<std::string> names = {"pope"};
      const auto t = kTasks.find(s);
      if (t != kTasks.end()) names.push_back(t->second);
      for (const auto& n : names) {
        if (!by_task.count(n) && n != "pope") tasks.push_back(n);
        YesNoCounts& c = by_task[n];
        c.rows += 1;
        c.gold_yes += gold == "yes";
        c.tp += gold == "yes" && pred == "yes";
        c.fp += gold == "no" && pred == "yes";
        c.fn_lmms += gold == "yes" && pred == "no";  // a response that is neither is in no count
        c.scores.push_back(score ? 1.0 : 0.0);
      }
    }
  }
  ReportTable table;
  table.title = "lmms-eval pope";
  table.columns = {"pope_accuracy", "pope_precision", "pope_recall", "pope_f1_score", "pope_yes_ratio"};
  Json report = Json::object();
  for (const auto& name : tasks) {
    const YesNoCounts& c = by_task.at(name);
    const double precision = c.tp + c.fp > 0 ? static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fp) : 0.0;
    const double recall = c.tp + c.fn_lmms > 0 ? static_cast<double>(c.tp) / static_cast<double>(c.tp + c.fn_lmms) : 0.0;
    const double f1 = precision + recall > 0 ? 2 * (precision * recall) / (precision + recall) : 0.0;
    const double yes_ratio = static_cast<double>(c.gold_yes) / static_cast<double>(c.rows);
    const std::vector<double> values = {py::sequential_mean(c.scores), precision, recall, f1, yes_ratio};
    report[name] = {{"n_rows", c.rows},          {"pope_accuracy", values[0]}, {"pope_precision", values[1]},
                    {"pope_recall", values[2]}, {"pope_f1_score", values[3]}, {"pope_yes_ratio", values[4]}};
    table.rows.emplace_back(name, values);
  }
  out.aggregate = report;
  out.tables.push_back(table);
  out.headline_metric = "pope_accuracy";
  out.headline = table.rows.front().second.front();
}

// ---- MMBench ----

struct Group {
  const BenchItem* main = nullptr;
  std::vector<const BenchItem*> rows;  // in index order
};

std::vector<Group> mmbench_groups(const BenchData& data) {
  std::map<int64_t, Group> groups;
  for (const auto& item : data.items) {
    Group& g = groups[item.index % kRotation];
    g.rows.push_back(&item);
    if (item.index < kRotation) g.main = &item;
  }
  std::vector<Group> out;
  for (auto& [g, group] : groups) {
    if (!group.main) {
      fail<FormatError>("{}: rotation of question {} whose own row (index {}) is missing", group.rows.front()->source, g, g);
    }
    std::sort(group.rows.begin(), group.rows.end(), [](const BenchItem* a, const BenchItem* b) { return a->index < b->index; });
    out.push_back(std::move(group));
  }
  return out;
}

void mmbench_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<HitRow> rows;
  bool has_split = false, has_l2 = false, has_category = false;
  for (const Group& g : mmbench_groups(data)) {
    // mcq_circular_eval: a question scores only when every rotation is inferred and right ("Z" is wrong; under
    // exact matching an uninferred rotation also fails it).
    bool hit = true;
    std::vector<ItemResult> results;
    for (const BenchItem* item : g.rows) {
      ItemResult r = base_result(*item);
      r.prediction = prediction_of(*item);
      r.parsed = vlmeval_can_infer(r.prediction, item->options);
      r.detail = {{"can_infer", r.parsed.empty() ? Json(false) : Json(r.parsed)}};
      hit = hit && r.parsed == item->answer;
      results.push_back(r);
    }
    for (auto& r : results) {
      r.score = hit;
      out.items.push_back(std::move(r));
    }
    rows.push_back({g.main->split, g.main->l2_category, g.main->category, hit ? 1.0 : 0.0});
    has_split = has_split || !g.main->split.empty();
    has_l2 = has_l2 || !g.main->l2_category.empty();
    has_category = has_category || !g.main->category.empty();
  }
  report_acc(rows, has_split, has_l2, has_category, out);
}

// lmms-eval's MMBench prompt lists the options among A-E that have text.
Options options_a_to_e(const Options& options) {
  Options out;
  for (const auto& o : options) {
    if (o.first <= 'E' && !o.second.empty()) out.push_back(o);
  }
  return out;
}

Options options_a_to_d(const Options& options) {
  Options out;
  for (const auto& o : options) {
    if (o.first <= 'D') out.push_back(o);
  }
  return out;
}

void mmbench_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  std::vector<double> hits;
  std::map<std::string, std::vector<double>> by_category, by_l2;
  for (const Group& g : mmbench_groups(data)) {
    // eval_sub_data: any prefetched letter that is wrong fails the question; the rest go to the static task's
    // extract_mcq_answer, and an empty or wrong letter fails it.
    std::vector<ItemResult> results;
    bool prefetch_wrong = false, extract_wrong = false;
    for (const BenchItem* item : g.rows) {
      ItemResult r = base_result(*item);
      r.prediction = lmms_response(*item, options);
      const Options abcd = options_a_to_d(item->options);
      const std::string prefetched = lmms_mmbench_prefetch(r.prediction, abcd);
      std::vector<char> letters;
      for (const auto& o : abcd) letters.push_back(o.first);
      const std::string extracted = lmms_extract_mcq_answer(r.prediction, letters);
      if (!prefetched.empty()) prefetch_wrong = prefetch_wrong || prefetched != item->answer;
      else extract_wrong = extract_wrong || extracted != item->answer;
      r.parsed = prefetched.empty() ? extracted : prefetched;
      r.detail = {{"response_after_reasoning_strip", r.prediction},
                  {"prefetch_can_infer", prefetched.empty() ? Json(false) : Json(prefetched)},
                  {"static_extract_mcq_answer", extracted}};
      results.push_back(r);
    }
    const int hit = prefetch_wrong || extract_wrong ? 0 : 1;
    for (auto& r : results) {
      r.score = hit;
      out.items.push_back(std::move(r));
    }
    hits.push_back(hit);
    by_category[g.main->category].push_back(hit);
    by_l2[g.main->l2_category].push_back(hit);
  }
  Json category = Json::object(), l2 = Json::object();
  for (const auto& [k, v] : by_category) category[k] = py::numpy_mean(v);
  for (const auto& [k, v] : by_l2) l2[k] = py::numpy_mean(v);
  const double overall = py::numpy_mean(hits);
  out.aggregate = {{"score", overall * 100},
                   {"details", {{"overall_acc", overall}, {"category_acc", category}, {"l2_category_acc", l2}}}};
  ReportTable table;
  table.title = "lmms-eval mmbench_en_dev_static";
  table.columns = {"score"};
  table.rows.emplace_back("overall", std::vector<double>{overall * 100});
  for (const auto& [k, v] : by_l2) table.rows.emplace_back("l2: " + k, std::vector<double>{py::numpy_mean(v) * 100});
  for (const auto& [k, v] : by_category) table.rows.emplace_back(k, std::vector<double>{py::numpy_mean(v) * 100});
  out.tables.push_back(table);
  out.headline_metric = "score";
  out.headline = overall * 100;
}

// ---- ScienceQA ----

void scienceqa_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<HitRow> rows;
  bool has_split = false, has_category = false;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = prediction_of(item);
    r.parsed = vlmeval_can_infer(r.prediction, item.options);
    if (r.parsed.empty()) r.parsed = "Z";  // no judge: nothing inferred is "Z"
    r.score = r.parsed == item.answer;
    r.detail = {{"hit", static_cast<int>(r.score)}};
    out.items.push_back(r);
    rows.push_back({item.split, "", item.category, r.score});
    has_split = has_split || !item.split.empty();
    has_category = has_category || !item.category.empty();
  }
  report_acc(rows, has_split, false, has_category, out);
}

void scienceqa_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  std::vector<double> scores;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = lmms_response(item, options);
    const std::string target = py::lower(item.answer);
    const std::string p = py::strip(r.prediction);
    bool right = py::lower(p) == target;
    if (!right && p.size() >= 2 && p[0] >= 'A' && p[0] <= 'Z' && p[1] == '.') right = py::lower(p.substr(0, 1)) == target;
    r.parsed = right ? item.answer : "";
    r.score = right;
    r.detail = {{"response_after_reasoning_strip", r.prediction}, {"target", item.answer}, {"exact_match", r.score}};
    out.items.push_back(r);
    scores.push_back(r.score);
  }
  const double em = py::sequential_mean(scores);
  out.aggregate = {{"exact_match", em}, {"n", static_cast<int64_t>(scores.size())}};
  out.tables.push_back({"lmms-eval scienceqa_img", {"exact_match"}, {{"scienceqa_img", {em}}}});
  out.headline_metric = "exact_match";
  out.headline = em;
}

// ---- MMMU ----

std::string mmmu_subject(const BenchItem& item) {
  // "validation_<Subject>_<n>": the words between the first and the last.
  const auto first = item.id.find('_'), last = item.id.rfind('_');
  if (first == std::string::npos || last <= first) return item.category;
  return item.id.substr(first + 1, last - first - 1);
}

bool mmmu_is_open(const BenchItem& item) { return item.options.empty() || item.question_type == "open"; }

void mmmu_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<HitRow> rows;
  bool has_split = false, has_category = false;
  for (const auto& item : data.items) {
    // MMMU_preproc: an open question becomes A = the gold answer, B = "Other Answers", gold A.
    Options options = item.options;
    std::string gold = item.answer;
    if (item.options.empty()) {
      options = {{'A', item.answer}, {'B', "Other Answers"}};
      gold = "A";
    } else if (!is_option_letter(gold)) {
      gold = "A";
    }
    ItemResult r = base_result(item);
    r.prediction = prediction_of(item);
    r.parsed = vlmeval_can_infer(r.prediction, options);
    if (r.parsed.empty()) r.parsed = "Z";
    r.score = r.parsed == gold;
    r.detail = {{"hit", static_cast<int>(r.score)}};
    out.items.push_back(r);
    const std::string category = item.category.empty() ? mmmu_subject(item) : item.category;
    rows.push_back({item.split, "", category, r.score});
    has_split = has_split || !item.split.empty();
    has_category = has_category || !category.empty();
  }
  report_acc(rows, has_split, false, has_category, out);
}

void mmmu_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kDomains = {
      {"Art and Design", {"Art", "Art_Theory", "Design", "Music"}},
      {"Business", {"Accounting", "Economics", "Finance", "Manage", "Marketing"}},
      {"Science", {"Biology", "Chemistry", "Geography", "Math", "Physics"}},
      {"Health and Medicine",
       {"Basic_Medical_Science", "Clinical_Medicine", "Diagnostics_and_Laboratory_Medicine", "Pharmacy", "Public_Health"}},
      {"Humanities and Social Science", {"History", "Literature", "Sociology", "Psychology"}},
      {"Tech and Engineering",
       {"Agriculture", "Architecture_and_Engineering", "Computer_Science", "Electronics", "Energy_and_Power",
        "Materials", "Mechanical_Engineering"}}};
  py::Random rng(options.seed);
  std::vector<std::string> subjects;  // first-seen order
  std::map<std::string, std::pair<int64_t, int64_t>> counts;  // subject -> (correct, n)
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = lmms_response(item, options);
    bool correct = false;
    if (!mmmu_is_open(item)) {
      const MmmuChoice choice = lmms_mmmu_choice(r.prediction, item.options, rng);
      r.parsed = choice.letter;
      correct = choice.letter == item.answer;
      r.detail = {{"parsed_pred", {choice.letter}}, {"random_fallback", choice.random_fallback}};
    } else {
      const std::vector<OpenValue> values = mmmu_parse_open(r.prediction);
      Json parsed = Json::array();
      for (const auto& v : values) parsed.push_back(v.is_number ? Json(v.number) : Json(v.text));
      if (options.mmmu_official_open) {
        correct = mmmu_eval_open(item.answer, values);
      } else {
        // At the pinned commit one candidate's str() is kept and eval_open walks its characters: only a gold
        // that normalises to "" can be found in one.
        const auto gold = mmmu_normalize(item.answer);
        const bool empty_gold = std::any_of(gold.begin(), gold.end(), [](const OpenValue& v) { return !v.is_number && v.text.empty(); });
        correct = empty_gold && std::any_of(values.begin(), values.end(), [](const OpenValue& v) { return !v.repr().empty(); });
      }
      r.parsed = values.empty() ? "" : values.front().repr();
      r.detail = {{"parsed_pred", parsed}, {"random_fallback", false}};
    }
    r.score = correct;
    r.detail["correct"] = correct;
    out.items.push_back(r);
    const std::string subject = mmmu_subject(item);
    if (!counts.count(subject)) subjects.push_back(subject);
    auto& c = counts[subject];
    c.first += correct;
    c.second += 1;
  }
  auto acc_of = [&](const std::string& s) {
    const auto& c = counts.at(s);
    return c.second ? static_cast<double>(c.first) / static_cast<double>(c.second) : 0.0;
  };
  // calculate_ins_level_acc: sum(acc * n) / sum(n), in the given order.
  auto ins_level = [&](const std::vector<std::string>& list) {
    double acc = 0;
    int64_t n = 0;
    for (const auto& s : list) {
      acc += acc_of(s) * static_cast<double>(counts.at(s).second);
      n += counts.at(s).second;
    }
    return std::make_pair(n ? acc / static_cast<double>(n) : 0.0, n);
  };
  Json printable = Json::object();
  ReportTable table;
  table.title = "lmms-eval mmmu";
  table.columns = {"num", "acc"};
  for (const auto& [domain, members] : kDomains) {
    std::vector<std::string> present;
    for (const auto& m : members) {
      if (counts.count(m)) present.push_back(m);
    }
    const auto [acc, n] = ins_level(present);
    printable["Overall-" + domain] = {{"num", n}, {"acc", py::round_to(acc, 5)}};
    table.rows.emplace_back("Overall-" + domain, std::vector<double>{static_cast<double>(n), py::round_to(acc, 5)});
    for (const auto& m : present) {
      printable[m] = {{"num", counts.at(m).second}, {"acc", py::round_to(acc_of(m), 5)}};
      table.rows.emplace_back("  " + m, std::vector<double>{static_cast<double>(counts.at(m).second), py::round_to(acc_of(m), 5)});
    }
  }
  const auto [overall, total] = ins_level(subjects);
  const double rounded = py::round_to(overall, 5);
  printable["Overall"] = {{"num", total}, {"acc", rounded}};
  table.rows.emplace_back("Overall", std::vector<double>{static_cast<double>(total), rounded});
  out.aggregate = {{"mmmu_acc", rounded}, {"printable_results", printable}};
  out.tables.push_back(table);
  out.headline_metric = "mmmu_acc";
  out.headline = rounded;
}

// ---- TextVQA ----

void textvqa_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<double> hits;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = prediction_of(item);
    std::vector<std::string> refs;
    for (const auto& a : item.answers) refs.push_back(vlmeval_process_answer(a));
    r.parsed = vlmeval_process_answer(r.prediction);
    const std::vector<double> match = vqa_matches(r.parsed, refs);
    r.score = py::numpy_mean(match);
    r.detail = {{"pred_normalised", r.parsed}, {"answers_normalised", refs}, {"match", match}, {"score", r.score}};
    out.items.push_back(r);
    hits.push_back(r.score);
  }
  const double overall = py::numpy_mean(hits) * 100;
  out.aggregate = {{"Overall", overall}};
  out.tables.push_back({"VLMEvalKit TextVQA", {"Overall"}, {{"Overall", {overall}}}});
  out.headline_metric = "Overall";
  out.headline = overall;
}

void textvqa_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  std::vector<double> scores;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = lmms_response(item, options);
    std::vector<std::string> refs;
    for (const auto& a : item.answers) refs.push_back(lmms_vqa_normalize(a));
    r.parsed = lmms_vqa_normalize(r.prediction);
    r.score = py::exact_mean(vqa_matches(r.parsed, refs));
    r.detail = {{"response_after_reasoning_strip", r.prediction}, {"pred_normalised", r.parsed},
                {"answers_normalised", refs}, {"exact_match", r.score}};
    out.items.push_back(r);
    scores.push_back(r.score);
  }
  const double em = py::sequential_mean(scores);
  out.aggregate = {{"exact_match", em}, {"n", static_cast<int64_t>(scores.size())}};
  out.tables.push_back({"lmms-eval textvqa_val", {"exact_match"}, {{"textvqa_val", {em}}}});
  out.headline_metric = "exact_match";
  out.headline = em;
}

// ---- ChartQA ----

void chartqa_vlmeval(const BenchData& data, BenchResult& out) {
  std::vector<double> hits;
  std::map<std::string, std::vector<double>> by_split;
  bool has_split = false;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = py::strip(prediction_of(item));
    const auto list = py::list_literal(item.answer);
    const std::vector<std::string> refs = list ? *list : std::vector<std::string>{item.answer};
    std::vector<bool> match;
    bool hit = false;
    for (const auto& ref : refs) {
      match.push_back(relaxed_correctness(ref, r.prediction));
      hit = hit || match.back();
    }
    r.parsed = r.prediction;
    r.score = hit;
    r.detail = {{"references", refs}, {"pred_compared", r.prediction}, {"match", match}, {"hit", r.score}};
    out.items.push_back(r);
    hits.push_back(r.score);
    by_split[item.split].push_back(r.score);
    has_split = has_split || !item.split.empty();
  }
  Json report = Json::object();
  ReportTable table;
  table.title = "VLMEvalKit ChartQA";
  std::vector<double> row;
  if (has_split) {
    for (const auto& [s, v] : by_split) {
      report[s] = py::numpy_mean(v) * 100;
      table.columns.push_back(s);
      row.push_back(py::numpy_mean(v) * 100);
    }
  }
  const double overall = py::numpy_mean(hits) * 100;
  report["Overall"] = overall;
  table.columns.push_back("Overall");
  row.push_back(overall);
  table.rows.emplace_back("ChartQA", row);
  out.aggregate = report;
  out.tables.push_back(table);
  out.headline_metric = "Overall";
  out.headline = overall;
}

void chartqa_lmms(const BenchData& data, const ScoreOptions& options, BenchResult& out) {
  std::vector<double> all, human, augmented;
  for (const auto& item : data.items) {
    ItemResult r = base_result(item);
    r.prediction = lmms_response(item, options);
    r.parsed = r.prediction;
    r.score = relaxed_correctness(item.answer, r.prediction);
    r.detail = {{"response_after_reasoning_strip", r.prediction}, {"relaxed_overall", r.score}};
    out.items.push_back(r);
    all.push_back(r.score);
    if (item.split == "human_test") human.push_back(r.score);
    if (item.split == "augmented_test") augmented.push_back(r.score);
  }
  Json report = {{"relaxed_overall", py::sequential_mean(all)}, {"n_relaxed_overall", static_cast<int64_t>(all.size())}};
  ReportTable table;
  table.title = "lmms-eval chartqa";
  table.columns = {"relaxed_overall"};
  table.rows.emplace_back("relaxed_overall", std::vector<double>{py::sequential_mean(all)});
  if (!human.empty()) {
    report["relaxed_human_split"] = py::sequential_mean(human);
    report["n_relaxed_human_split"] = static_cast<int64_t>(human.size());
    table.rows.emplace_back("relaxed_human_split", std::vector<double>{py::sequential_mean(human)});
  }
  if (!augmented.empty()) {
    report["relaxed_augmented_split"] = py::sequential_mean(augmented);
    report["n_relaxed_augmented_split"] = static_cast<int64_t>(augmented.size());
    table.rows.emplace_back("relaxed_augmented_split", std::vector<double>{py::sequential_mean(augmented)});
  }
  out.aggregate = report;
  out.tables.push_back(table);
  out.headline_metric = "relaxed_overall";
  out.headline = py::sequential_mean(all);
}

}  // namespace

BenchResult score_benchmark(const BenchData& data, const ScoreOptions& options) {
  BenchResult out;
  out.benchmark = data.benchmark;
  out.rules = options.rules;
  const bool vlm = options.rules == Rules::kVLMEvalKit;
  switch (data.benchmark) {
    case Benchmark::kPope: vlm ? pope_vlmeval(data, out) : pope_lmms(data, options, out); break;
    case Benchmark::kMMBench: vlm ? mmbench_vlmeval(data, out) : mmbench_lmms(data, options, out); break;
    case Benchmark::kScienceQA: vlm ? scienceqa_vlmeval(data, out) : scienceqa_lmms(data, options, out); break;
    case Benchmark::kMMMU: vlm ? mmmu_vlmeval(data, out) : mmmu_lmms(data, options, out); break;
    case Benchmark::kTextVQA: vlm ? textvqa_vlmeval(data, out) : textvqa_lmms(data, options, out); break;
    case Benchmark::kChartQA: vlm ? chartqa_vlmeval(data, out) : chartqa_lmms(data, options, out); break;
  }
  return out;
}


// ---- prompts, images and predictions files ----

namespace {

std::string option_lines(const Options& options, const char* separator) {
  std::string out;
  for (size_t i = 0; i < options.size(); ++i) {
    out += (i ? separator : "") + std::string(1, options[i].first) + ". " + options[i].second;
  }
  return out;
}

std::vector<PromptPart> images_then(size_t images, std::string text) {
  std::vector<PromptPart> parts(std::max<size_t>(images, 1), PromptPart{true, ""});
  parts.push_back({false, std::move(text)});
  return parts;
}

// VLMEvalKit's multiple-choice prompt (ImageMCQDataset.build_prompt).
std::string vlmeval_mcq_text(const BenchItem& item) {
  std::string prompt;
  if (!item.hint.empty()) prompt += "Hint: " + item.hint + "\n";
  prompt += "Question: " + item.question + "\n";
  if (!item.options.empty()) {
    prompt += "Options:\n";
    for (const auto& [letter, text] : item.options) prompt += std::string(1, letter) + ". " + text + "\n";
    prompt += "Please select the correct answer from the options above. \n";
  }
  return prompt;
}

}  // namespace

std::vector<PromptPart> benchmark_prompt(const BenchItem& item, Benchmark benchmark, Rules rules) {
  const size_t images = item.images.size();
  static const std::string kShortAnswer = "Answer the question using a single word or phrase.";
  static const std::string kLetter = "Answer with the option's letter from the given choices directly.";
  if (rules == Rules::kVLMEvalKit) {
    switch (benchmark) {
      case Benchmark::kPope: return images_then(images, item.question);
      case Benchmark::kTextVQA:
      case Benchmark::kChartQA: return images_then(images, item.question + "\n" + kShortAnswer);
      case Benchmark::kMMBench:
      case Benchmark::kScienceQA: return images_then(images, vlmeval_mcq_text(item));
      case Benchmark::kMMMU: {
        // MMMU puts its images where the text says "<image k>"; without such a mark they go first.
        const std::string text = vlmeval_mcq_text(item);
        static const Pattern kMark(R"(<image (\d+)>)");
        const auto marks = kMark.find_all(text);
        if (marks.empty()) return images_then(images, text);
        std::vector<PromptPart> parts;
        size_t from = 0;
        for (const auto& m : marks) {
          const size_t at = text.find(m[0], from);
          if (at > from) parts.push_back({false, text.substr(from, at - from)});
          parts.push_back({true, ""});
          from = at + m[0].size();
        }
        if (from < text.size()) parts.push_back({false, text.substr(from)});
        return parts;
      }
    }
  }
  switch (benchmark) {
    case Benchmark::kPope:
    case Benchmark::kTextVQA: return images_then(images, item.question + "\n" + kShortAnswer);
    case Benchmark::kChartQA: return images_then(images, item.question + "\nAnswer the question with a single word.");
    case Benchmark::kMMBench: {
      const std::string question = item.hint.empty() ? item.question : item.hint + " " + item.question;
      return images_then(images, question + " There are several options:\n" + option_lines(options_a_to_e(item.options), "\n") +
                                     "\n\n" + kLetter);
    }
    case Benchmark::kScienceQA: {
      const std::string context = item.hint.empty() ? "" : "Context: " + item.hint + "\n";
      return images_then(images, context + item.question + "\n" + option_lines(item.options, "\n") + "\n" + kLetter);
    }
    case Benchmark::kMMMU:
      if (mmmu_is_open(item)) return images_then(images, item.question + "\n\n" + kShortAnswer);
      return images_then(images, item.question + "\n" + option_lines(item.options, "\n") + "\n\n" + kLetter);
  }
  return {};
}

std::string prompt_text(const std::vector<PromptPart>& parts) {
  std::string out;
  bool leading = true;
  for (const auto& p : parts) {
    if (p.image) {
      out += std::string(kImagePlaceholder) + (leading ? "\n" : "");
    } else {
      out += p.text;
      leading = false;
    }
  }
  return out;
}

std::vector<std::vector<ImageRef>> benchmark_images(const BenchData& data) {
  std::vector<std::vector<ImageRef>> out(data.items.size());
  if (data.layout == "lmms-eval") {
    const fs::path base = fs::path(data.file).parent_path();
    for (size_t i = 0; i < data.items.size(); ++i) {
      const BenchItem& item = data.items[i];
      if (item.images.empty()) fail<FormatError>("{}: no image (field 'image')", item.source);
      for (const auto& name : item.images) {
        const fs::path path = fs::path(name).is_absolute() ? fs::path(name) : base / name;
        if (!fs::is_regular_file(path)) fail<IoError>("{}: image {} does not exist", item.source, path.string());
        out[i].push_back(path);
      }
    }
    return out;
  }
  // VLMEvalKit: a cell of at most 64 characters names the row whose image it shares.
  std::map<int64_t, size_t> row_of;
  for (size_t i = 0; i < data.items.size(); ++i) row_of[data.items[i].index] = i;
  std::map<std::pair<size_t, size_t>, std::shared_ptr<const std::string>> decoded;  // (row, image) -> bytes
  std::function<std::shared_ptr<const std::string>(size_t, size_t, int)> bytes_of = [&](size_t row, size_t k, int depth) {
    const BenchItem& item = data.items[row];
    if (k >= item.images.size()) fail<FormatError>("{}: column 'image' has no image {}", item.source, k + 1);
    const auto key = std::make_pair(row, k);
    if (const auto it = decoded.find(key); it != decoded.end()) return it->second;
    const std::string& cell = item.images[k];
    std::shared_ptr<const std::string> bytes;
    if (cell.size() <= 64) {
      char* end = nullptr;
      const long long index = std::strtoll(cell.c_str(), &end, 10);
      const auto target = row_of.find(index);
      if (cell.empty() || *end != '\0' || target == row_of.end() || depth > 0) {
        fail<FormatError>("{}: column 'image' is '{}': neither base64 nor the index of a row with an image", item.source, cell);
      }
      bytes = bytes_of(target->second, 0, depth + 1);
    } else {
      auto raw = decode_base64(cell);
      if (!raw) fail<FormatError>("{}: column 'image' is not valid base64", item.source);
      bytes = std::make_shared<const std::string>(std::move(*raw));
    }
    decoded[key] = bytes;
    return bytes;
  };
  for (size_t i = 0; i < data.items.size(); ++i) {
    const BenchItem& item = data.items[i];
    if (item.images.empty()) fail<FormatError>("{}: no image (column 'image')", item.source);
    for (size_t k = 0; k < item.images.size(); ++k) {
      out[i].emplace_back(bytes_of(i, k, 0), fmt::format("{} (index {}, image {})", item.source, item.index, k + 1));
    }
  }
  return out;
}

void write_predictions(const BenchData& data, const std::vector<std::string>& predictions, const fs::path& file) {
  if (predictions.size() != data.items.size()) {
    fail<ConfigError>("{} predictions for {} rows of {}", predictions.size(), data.items.size(), data.file);
  }
  std::string out;
  if (data.layout == "vlmevalkit") {
    // pandas' to_csv(sep="\t"): a cell holding a tab, newline or quote is quoted, quotes doubled.
    auto cell = [](const std::string& v) {
      if (v.find_first_of("\t\n\r\"") == std::string::npos) return v;
      std::string q = "\"";
      for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
      return q + "\"";
    };
    for (const auto& c : data.columns) out += cell(c) + "\t";
    out += "prediction\n";
    for (size_t r = 0; r < data.cells.size(); ++r) {
      for (const auto& v : data.cells[r]) out += cell(v.value_or("")) + "\t";
      out += cell(predictions[r]) + "\n";
    }
  } else {
    for (size_t r = 0; r < data.docs.size(); ++r) {
      out += Json({{"doc_id", r}, {"doc", data.docs[r]}, {"resps", Json::array({Json::array({predictions[r]})})},
                   {"filtered_resps", Json::array({predictions[r]})}})
                 .dump(-1, ' ', false, Json::error_handler_t::replace) +
             "\n";
    }
  }
  write_file_atomic(file, out);
}

std::string result_markdown(const BenchResult& result) {
  std::string out;
  for (const auto& t : result.tables) {
    out += fmt::format("{} ({}, {} rules)\n\n", t.title, benchmark_name(result.benchmark), rules_name(result.rules));
    out += "| |";
    for (const auto& c : t.columns) out += " " + c + " |";
    out += "\n|---|";
    for (size_t c = 0; c < t.columns.size(); ++c) out += "---:|";
    out += "\n";
    for (const auto& [label, values] : t.rows) {
      out += "| " + label + " |";
      for (double v : values) out += std::isnan(v) ? std::string(" |") : fmt::format(" {:.4f} |", v);
      out += "\n";
    }
    out += "\n";
  }
  return out;
}

}  // namespace swiftcpp::eval::mm
