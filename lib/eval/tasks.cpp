#include "eval/tasks.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "config/schema.h"
#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "eval/archive.h"

namespace swiftcpp::eval {

const char* task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::kMultipleChoice: return "multiple_choice";
    case TaskKind::kGeneration: return "generation";
    case TaskKind::kPerplexity: return "perplexity";
  }
  return "?";
}

std::vector<std::string> builtin_task_names() {
  return {"mmlu", "arc_easy", "arc_challenge", "hellaswag", "gsm8k", "perplexity"};
}

namespace {

// ---------------------------------------------------------------------------------------------------------
// Shared helpers

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Each non-blank line of a JSON Lines file with its line number.
std::vector<std::pair<std::string, Json>> read_jsonl(const fs::path& path) {
  std::istringstream in(read_maybe_compressed(path));
  std::vector<std::pair<std::string, Json>> rows;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path.string(), number);
    Json row = parse_json(line, where);
    if (!row.is_object()) fail<FormatError>("{}: expected a JSON object per line", where);
    rows.emplace_back(where, std::move(row));
  }
  if (rows.empty()) fail<FormatError>("{}: no rows", path.string());
  return rows;
}

std::string string_field(const Json& row, const std::string& key, const std::string& where) {
  if (!row.contains(key) || !row.at(key).is_string()) fail<FormatError>("{}: expected a string field '{}'", where, key);
  return row.at(key).get<std::string>();
}

std::vector<std::string> string_list(const Json& value, const std::string& key, const std::string& where) {
  if (!value.is_array() || value.empty()) fail<FormatError>("{}: '{}' must be a non-empty list of strings", where, key);
  std::vector<std::string> out;
  for (const auto& v : value) {
    if (!v.is_string()) fail<FormatError>("{}: '{}' must be a non-empty list of strings, got {}", where, key, describe_json(v));
    out.push_back(v.get<std::string>());
  }
  return out;
}

// A gold answer given as an index (number or digit string) into `count` choices.
int gold_index(const Json& value, size_t count, const std::string& key, const std::string& where) {
  int64_t gold = -1;
  if (value.is_number_integer()) {
    gold = value.get<int64_t>();
  } else if (value.is_string() && !value.get<std::string>().empty() &&
             std::all_of(value.get_ref<const std::string&>().begin(), value.get_ref<const std::string&>().end(),
                         [](unsigned char c) { return std::isdigit(c); })) {
    gold = std::stoll(value.get<std::string>());
  } else {
    fail<FormatError>("{}: '{}' must be a choice index, got {}", where, key, describe_json(value));
  }
  if (gold < 0 || gold >= static_cast<int64_t>(count)) {
    fail<FormatError>("{}: '{}' {} is out of range for {} choices", where, key, gold, count);
  }
  return static_cast<int>(gold);
}

// The first existing path of `candidates`; IoError listing them all when none exists.
fs::path first_existing(const std::string& task, const std::vector<fs::path>& candidates) {
  for (const auto& p : candidates) {
    if (fs::exists(p)) return p;
  }
  std::vector<std::string> names;
  for (const auto& p : candidates) names.push_back(p.string());
  fail<IoError>("task {}: no data found; looked for {} (give another with --data-dir, or {}=PATH)", task,
                list_names(names), task);
}

// A multiple-choice question before few-shot assembly.
struct Question {
  std::string query;  // the question's own prompt (lm-eval's doc_to_text)
  std::vector<std::string> choices;
  int gold = 0;
  std::string group;
  std::string source;
  std::vector<ImageRef> images;  // image tasks: one per "<image>" in query, in order
};

// description + shots (each "query + delimiter + gold choice") joined by the few-shot delimiter + query.
std::string assemble(const std::string& description, const std::vector<const Question*>& shots,
                     const std::string& query, const std::string& delimiter, const std::string& fewshot_delimiter) {
  std::string out = description;
  for (const Question* s : shots) out += s->query + delimiter + s->choices[s->gold] + fewshot_delimiter;
  return out + query;
}

// Few-shot examples drawn from the evaluated split itself, excluding the question (lm-eval samples the same
// way when a task has no training split): `k` distinct others, seeded by (seed, index).
std::vector<size_t> sample_others(size_t count, size_t index, int k, uint64_t seed, const std::string& task) {
  if (k <= 0) return {};
  if (static_cast<size_t>(k) >= count) {
    fail<ConfigError>("task {}: {} few-shot examples need more than {} items in the split", task, k, count);
  }
  std::mt19937_64 rng(seed * 1000003ULL + index);
  std::vector<size_t> pool(count);
  std::iota(pool.begin(), pool.end(), 0);
  pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(index));
  std::vector<size_t> picked;
  for (int i = 0; i < k; ++i) {
    const size_t j = std::uniform_int_distribution<size_t>(i, pool.size() - 1)(rng);
    std::swap(pool[i], pool[j]);
    picked.push_back(pool[i]);
  }
  return picked;
}

void apply_limit(std::vector<Question>& questions, const TaskOptions& options) {
  if (options.limit && static_cast<int64_t>(questions.size()) > *options.limit) questions.resize(*options.limit);
}

// Items from questions whose few-shot examples come from the same split.
Task choice_task_from_split(const std::string& name, const std::string& source, std::vector<Question> all,
                            int default_shots, const TaskOptions& options) {
  Task task;
  task.name = name;
  task.kind = TaskKind::kMultipleChoice;
  task.source = source;
  task.num_fewshot = options.num_fewshot.value_or(default_shots);
  if (task.num_fewshot > 0) task.fewshot_source = source + " (sampled, excluding the question)";
  const size_t count = options.limit ? std::min<size_t>(all.size(), *options.limit) : all.size();
  for (size_t i = 0; i < count; ++i) {
    std::vector<const Question*> shots;
    for (size_t j : sample_others(all.size(), i, task.num_fewshot, options.seed, name)) shots.push_back(&all[j]);
    ChoiceItem item;
    item.context = assemble("", shots, all[i].query, " ", "\n\n");
    item.choices = all[i].choices;
    item.gold = all[i].gold;
    item.source = all[i].source;
    task.choice_items.push_back(std::move(item));
  }
  return task;
}

// ---------------------------------------------------------------------------------------------------------
// MMLU: data/{dev,val,test}/<subject>_<split>.csv in a folder or a zip archive.

class CsvTree {
 public:
  explicit CsvTree(const fs::path& path) : path_(path) {
    if (fs::is_regular_file(path) && path.extension() == ".zip") {
      zip_ = std::make_unique<ZipArchive>(ZipArchive::open(path));
      for (const auto& n : zip_->names()) {
        for (const char* prefix : {"data/", ""}) {
          if (n.rfind(prefix, 0) == 0 && n.size() > strlen(prefix)) members_[n.substr(strlen(prefix))] = n;
        }
      }
    } else if (fs::is_directory(path)) {
      root_ = fs::is_directory(path / "data") ? path / "data" : path;
      for (const char* split : {"dev", "val", "test"}) {
        if (!fs::is_directory(root_ / split)) continue;
        for (const auto& e : fs::directory_iterator(root_ / split)) {
          members_[std::string(split) + "/" + e.path().filename().string()] = (e.path()).string();
        }
      }
    } else {
      fail<IoError>("mmlu: {} is neither a folder nor a .zip archive", path.string());
    }
  }

  // Subjects that have a file in `split`, sorted.
  std::vector<std::string> subjects(const std::string& split) const {
    std::vector<std::string> out;
    const std::string prefix = split + "/", suffix = "_" + split + ".csv";
    for (const auto& [rel, _] : members_) {
      if (rel.rfind(prefix, 0) == 0 && ends_with(rel, suffix)) {
        out.push_back(rel.substr(prefix.size(), rel.size() - prefix.size() - suffix.size()));
      }
    }
    return out;
  }

  // (text, origin) of <split>/<subject>_<split>.csv. Throws IoError when absent.
  std::pair<std::string, std::string> read(const std::string& split, const std::string& subject) const {
    const std::string rel = split + "/" + subject + "_" + split + ".csv";
    const auto it = members_.find(rel);
    if (it == members_.end()) fail<IoError>("mmlu: {} has no file {}", path_.string(), rel);
    if (zip_) return {zip_->read(it->second), path_.string() + ":" + it->second};
    return {read_text_file(it->second), it->second};
  }

 private:
  fs::path path_, root_;
  std::unique_ptr<ZipArchive> zip_;
  std::map<std::string, std::string> members_;  // "split/file.csv" -> zip member or file path
};

const std::map<std::string, std::string>& builtin_mmlu_categories() {
  static const std::map<std::string, std::string> table = {
      {"abstract_algebra", "STEM"}, {"anatomy", "Other"}, {"astronomy", "STEM"}, {"business_ethics", "Other"},
      {"clinical_knowledge", "Other"}, {"college_biology", "STEM"}, {"college_chemistry", "STEM"},
      {"college_computer_science", "STEM"}, {"college_mathematics", "STEM"}, {"college_medicine", "Other"},
      {"college_physics", "STEM"}, {"computer_security", "STEM"}, {"conceptual_physics", "STEM"},
      {"econometrics", "Social Sciences"}, {"electrical_engineering", "STEM"}, {"elementary_mathematics", "STEM"},
      {"formal_logic", "Humanities"}, {"global_facts", "Other"}, {"high_school_biology", "STEM"},
      {"high_school_chemistry", "STEM"}, {"high_school_computer_science", "STEM"},
      {"high_school_european_history", "Humanities"}, {"high_school_geography", "Social Sciences"},
      {"high_school_government_and_politics", "Social Sciences"}, {"high_school_macroeconomics", "Social Sciences"},
      {"high_school_mathematics", "STEM"}, {"high_school_microeconomics", "Social Sciences"},
      {"high_school_physics", "STEM"}, {"high_school_psychology", "Social Sciences"},
      {"high_school_statistics", "STEM"}, {"high_school_us_history", "Humanities"},
      {"high_school_world_history", "Humanities"}, {"human_aging", "Other"}, {"human_sexuality", "Social Sciences"},
      {"international_law", "Humanities"}, {"jurisprudence", "Humanities"}, {"logical_fallacies", "Humanities"},
      {"machine_learning", "STEM"}, {"management", "Other"}, {"marketing", "Other"}, {"medical_genetics", "Other"},
      {"miscellaneous", "Other"}, {"moral_disputes", "Humanities"}, {"moral_scenarios", "Humanities"},
      {"nutrition", "Other"}, {"philosophy", "Humanities"}, {"prehistory", "Humanities"},
      {"professional_accounting", "Other"}, {"professional_law", "Humanities"}, {"professional_medicine", "Other"},
      {"professional_psychology", "Social Sciences"}, {"public_relations", "Social Sciences"},
      {"security_studies", "Social Sciences"}, {"sociology", "Social Sciences"},
      {"us_foreign_policy", "Social Sciences"}, {"virology", "Other"}, {"world_religions", "Humanities"}};
  return table;
}

std::vector<Question> mmlu_questions(const CsvTree& tree, const std::string& split, const std::string& subject) {
  const auto [text, origin] = tree.read(split, subject);
  std::vector<Question> out;
  for (const auto& [line, fields] : parse_csv(text, origin)) {
    const std::string where = fmt::format("{}:{}", origin, line);
    if (fields.size() != 6) {
      fail<FormatError>("{}: expected 6 fields (question, A, B, C, D, answer), got {}", where, fields.size());
    }
    const std::string answer = strip_whitespace(fields[5]);
    if (answer.size() != 1 || answer[0] < 'A' || answer[0] > 'D') {
      fail<FormatError>("{}: the answer must be A, B, C or D, got '{}'", where, fields[5]);
    }
    Question q;
    q.query = fmt::format("{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:", strip_whitespace(fields[0]), fields[1], fields[2],
                          fields[3], fields[4]);
    q.choices = {"A", "B", "C", "D"};
    q.gold = answer[0] - 'A';
    q.group = subject;
    q.source = where;
    out.push_back(std::move(q));
  }
  return out;
}

Task load_mmlu(const std::string& name, const fs::path& path, const TaskOptions& options) {
  const CsvTree tree(path);
  std::vector<std::string> subjects = tree.subjects("test");
  if (subjects.empty()) fail<IoError>("mmlu: {} holds no test/<subject>_test.csv files", path.string());
  if (name != "mmlu") {
    const std::string wanted = name.substr(5);
    if (std::find(subjects.begin(), subjects.end(), wanted) == subjects.end()) {
      fail<ConfigError>("unknown MMLU subject '{}' in {}; subjects: {}", wanted, path.string(), list_names(subjects, 60));
    }
    subjects = {wanted};
  }
  Task task;
  task.name = name;
  task.kind = TaskKind::kMultipleChoice;
  task.source = path.string();
  task.num_fewshot = options.num_fewshot.value_or(5);
  if (task.num_fewshot > 0) task.fewshot_source = "dev split (first k)";
  // Categories: mapping.json ({subject: {name, category}}) beside the data, else the standard table.
  const fs::path mapping = (fs::is_directory(path) ? path : path.parent_path()) / "mapping.json";
  if (fs::exists(mapping)) {
    const Json m = load_json_file(mapping);
    if (!m.is_object()) fail<FormatError>("{}: expected an object of subject -> {{name, category}}", mapping.string());
    for (const auto& [subject, v] : m.items()) {
      if (!v.is_object() || !v.contains("category") || !v.at("category").is_string()) {
        fail<FormatError>("{}: subject '{}' needs a string 'category'", mapping.string(), subject);
      }
      task.categories[subject] = v.at("category").get<std::string>();
    }
  } else {
    task.categories = builtin_mmlu_categories();
  }
  for (const auto& subject : subjects) {
    std::vector<Question> shots_pool;
    if (task.num_fewshot > 0) {
      shots_pool = mmlu_questions(tree, "dev", subject);
      if (static_cast<int>(shots_pool.size()) < task.num_fewshot) {
        fail<ConfigError>("mmlu: {} few-shot examples asked, but dev/{}_dev.csv has {}", task.num_fewshot, subject,
                          shots_pool.size());
      }
    }
    std::vector<const Question*> shots;
    for (int i = 0; i < task.num_fewshot; ++i) shots.push_back(&shots_pool[i]);
    std::string subject_name = subject;
    std::replace(subject_name.begin(), subject_name.end(), '_', ' ');
    const std::string description =
        fmt::format("The following are multiple choice questions (with answers) about {}.\n\n", subject_name);
    std::vector<Question> questions = mmlu_questions(tree, "test", subject);
    apply_limit(questions, options);
    for (auto& q : questions) {
      ChoiceItem item;
      item.context = assemble(description, shots, q.query, " ", "\n\n");
      item.choices = q.choices;
      item.gold = q.gold;
      item.group = subject;
      item.source = q.source;
      task.choice_items.push_back(std::move(item));
    }
  }
  return task;
}

// ---------------------------------------------------------------------------------------------------------
// ARC: {query, choices, gold} (llm-foundry), AI2's {question: {stem, choices: [{text, label}]}, answerKey} and the
// Hugging Face datasets layout {question, choices: {text: [], label: []}, answerKey}.

Question arc_question(const Json& row, const std::string& where) {
  Question q;
  q.source = where;
  if (row.contains("query")) {
    q.query = string_field(row, "query", where) + "\nAnswer:";
    if (!row.contains("choices")) fail<FormatError>("{}: expected a list 'choices'", where);
    q.choices = string_list(row.at("choices"), "choices", where);
    if (!row.contains("gold")) fail<FormatError>("{}: expected 'gold' (the index of the answer)", where);
    q.gold = gold_index(row.at("gold"), q.choices.size(), "gold", where);
    return q;
  }
  if (!row.contains("question")) fail<FormatError>("{}: expected 'query' or 'question' (ARC layouts)", where);
  const Json& question = row.at("question");
  std::string stem;
  Json choices;
  std::vector<std::string> labels;
  if (question.is_object()) {  // AI2
    stem = string_field(question, "stem", where);
    if (!question.contains("choices") || !question.at("choices").is_array() || question.at("choices").empty()) {
      fail<FormatError>("{}: expected a list 'question.choices' of {{text, label}}", where);
    }
    for (const auto& c : question.at("choices")) {
      q.choices.push_back(string_field(c, "text", where));
      labels.push_back(string_field(c, "label", where));
    }
  } else if (question.is_string()) {  // Hugging Face datasets
    stem = question.get<std::string>();
    if (!row.contains("choices") || !row.at("choices").is_object()) {
      fail<FormatError>("{}: expected 'choices' as {{text: [...], label: [...]}}", where);
    }
    q.choices = string_list(row.at("choices").value("text", Json()), "choices.text", where);
    labels = string_list(row.at("choices").value("label", Json()), "choices.label", where);
    if (labels.size() != q.choices.size()) fail<FormatError>("{}: choices.text and choices.label differ in length", where);
  } else {
    fail<FormatError>("{}: 'question' must be an object (AI2) or a string", where);
  }
  const std::string key = string_field(row, "answerKey", where);
  const auto it = std::find(labels.begin(), labels.end(), key);
  if (it == labels.end()) fail<FormatError>("{}: answerKey '{}' is not one of the labels {}", where, key, list_names(labels));
  q.gold = static_cast<int>(it - labels.begin());
  q.query = "Question: " + stem + "\nAnswer:";
  return q;
}

Task load_arc(const std::string& name, const fs::path& path, const TaskOptions& options) {
  std::vector<Question> questions;
  for (const auto& [where, row] : read_jsonl(path)) questions.push_back(arc_question(row, where));
  return choice_task_from_split(name, path.string(), std::move(questions), 0, options);
}

// ---------------------------------------------------------------------------------------------------------
// HellaSwag: JSONL {ctx, endings, label} (or the full {activity_label, ctx_a, ctx_b, ...}), {query, choices,
// gold}, and llama.cpp's text layout (6 lines a task: context, gold label, 4 endings), optionally bzip2'd.

std::string capitalize(std::string s) {  // Python's str.capitalize() for ASCII text
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i == 0 ? std::toupper(static_cast<unsigned char>(s[i]))
                                                                           : std::tolower(static_cast<unsigned char>(s[i])));
  return s;
}

Question hellaswag_question(const Json& row, const std::string& where) {
  Question q;
  q.source = where;
  if (row.contains("query")) {
    q.query = string_field(row, "query", where);
    if (!row.contains("choices")) fail<FormatError>("{}: expected a list 'choices'", where);
    q.choices = string_list(row.at("choices"), "choices", where);
    if (!row.contains("gold")) fail<FormatError>("{}: expected 'gold'", where);
    q.gold = gold_index(row.at("gold"), q.choices.size(), "gold", where);
    return q;
  }
  std::string ctx;
  if (row.contains("ctx_a")) {
    ctx = string_field(row, "activity_label", where) + ": " + string_field(row, "ctx_a", where) + " " +
          capitalize(string_field(row, "ctx_b", where));
  } else {
    ctx = string_field(row, "ctx", where);
  }
  q.query = hellaswag_preprocess(ctx);
  if (!row.contains("endings")) fail<FormatError>("{}: expected a list 'endings'", where);
  for (const auto& e : string_list(row.at("endings"), "endings", where)) q.choices.push_back(hellaswag_preprocess(e));
  if (!row.contains("label")) fail<FormatError>("{}: expected 'label' (the index of the right ending)", where);
  q.gold = gold_index(row.at("label"), q.choices.size(), "label", where);
  return q;
}

std::vector<Question> hellaswag_text_questions(const fs::path& path) {
  std::istringstream in(read_maybe_compressed(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) fail<FormatError>("{}: no tasks", path.string());
  if (lines.size() % 6 != 0) {
    fail<FormatError>("{}:{}: the text layout has 6 lines a task (context, label, 4 endings); the last task is "
                      "incomplete ({} lines in all)", path.string(), lines.size() / 6 * 6 + 1, lines.size());
  }
  std::vector<Question> out;
  for (size_t i = 0; i < lines.size(); i += 6) {
    Question q;
    q.source = fmt::format("{}:{}", path.string(), i + 1);
    q.query = hellaswag_preprocess(lines[i]);
    const std::string label = strip_whitespace(lines[i + 1]);
    if (label.size() != 1 || label[0] < '0' || label[0] > '3') {
      fail<FormatError>("{}:{}: expected the gold label 0..3, got '{}'", path.string(), i + 2, lines[i + 1]);
    }
    q.gold = label[0] - '0';
    for (size_t j = 2; j < 6; ++j) q.choices.push_back(hellaswag_preprocess(lines[i + j]));
    out.push_back(std::move(q));
  }
  return out;
}

Task load_hellaswag(const std::string& name, const fs::path& path, const TaskOptions& options) {
  std::vector<Question> questions;
  const std::string file = path.filename().string();
  if (ends_with(file, ".txt") || ends_with(file, ".txt.bz2")) {
    questions = hellaswag_text_questions(path);
  } else {
    for (const auto& [where, row] : read_jsonl(path)) questions.push_back(hellaswag_question(row, where));
  }
  return choice_task_from_split(name, path.string(), std::move(questions), 0, options);
}

// ---------------------------------------------------------------------------------------------------------
// GSM8K: {question, answer: "... #### N"}.

Task load_gsm8k(const std::string& name, const fs::path& path, const TaskOptions& options) {
  struct Row {
    std::string question, answer, where;
  };
  auto rows_of = [](const fs::path& p) {
    std::vector<Row> rows;
    for (const auto& [where, row] : read_jsonl(p)) {
      Row r{string_field(row, "question", where), string_field(row, "answer", where), where};
      const size_t marker = r.answer.rfind("#### ");
      if (marker == std::string::npos) fail<FormatError>("{}: 'answer' has no '#### N' line", where);
      // The reference number every prediction is compared with: digits with an optional sign, '.' and ','.
      std::string number = r.answer.substr(marker + 5);
      while (!number.empty() && std::isspace(static_cast<unsigned char>(number.back()))) number.pop_back();
      const bool numeric = !number.empty() && number.find_first_not_of("-0123456789.,") == std::string::npos &&
                           number.find_first_of("0123456789") != std::string::npos;
      if (!numeric) {
        fail<FormatError>("{}: 'answer' ends in '#### {}': the answer after '#### ' must be a number", where,
                          number.substr(0, 40));
      }
      rows.push_back(std::move(r));
    }
    return rows;
  };
  Task task;
  task.name = name;
  task.kind = TaskKind::kGeneration;
  task.source = path.string();
  task.num_fewshot = options.num_fewshot.value_or(5);
  task.generation = gsm8k_spec();
  std::vector<Row> rows = rows_of(path);
  std::vector<Row> shots;
  if (task.num_fewshot > 0) {
    const fs::path train = path.parent_path() / "train.jsonl";
    if (fs::exists(train) && train != path) {
      shots = rows_of(train);
      task.fewshot_source = train.string() + " (first k)";
    } else {
      // No training split: the first k test questions become the examples and are not evaluated.
      if (static_cast<int>(rows.size()) <= task.num_fewshot) {
        fail<ConfigError>("gsm8k: {} few-shot examples need more rows than {} has", task.num_fewshot, path.string());
      }
      shots.assign(rows.begin(), rows.begin() + task.num_fewshot);
      rows.erase(rows.begin(), rows.begin() + task.num_fewshot);
      task.fewshot_source = fmt::format("{} (its first {} rows, not evaluated: no train.jsonl beside it)",
                                        path.string(), task.num_fewshot);
    }
    if (static_cast<int>(shots.size()) < task.num_fewshot) {
      fail<ConfigError>("gsm8k: {} few-shot examples asked, {} available", task.num_fewshot, shots.size());
    }
    shots.resize(task.num_fewshot);
  }
  std::string prefix;
  for (const auto& s : shots) prefix += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  if (options.limit && static_cast<int64_t>(rows.size()) > *options.limit) rows.resize(*options.limit);
  for (const auto& r : rows) task.generation_items.push_back({prefix + "Question: " + r.question + "\nAnswer:", r.answer, r.where, {}});
  return task;
}

// ---------------------------------------------------------------------------------------------------------
// Perplexity: a text file (one document) or JSON Lines with a "text" field (a document a row).

Task load_perplexity(const std::string& name, const fs::path& path, const TaskOptions& options) {
  Task task;
  task.name = name;
  task.kind = TaskKind::kPerplexity;
  task.source = path.string();
  const std::string file = path.filename().string();
  if (ends_with(file, ".jsonl") || ends_with(file, ".jsonl.bz2")) {
    for (const auto& [where, row] : read_jsonl(path)) task.documents.push_back({string_field(row, "text", where), where});
  } else {
    task.documents.push_back({read_maybe_compressed(path), path.string()});
    if (task.documents.back().text.empty()) fail<FormatError>("{}: the file is empty", path.string());
  }
  if (options.limit && static_cast<int64_t>(task.documents.size()) > *options.limit) task.documents.resize(*options.limit);
  return task;
}

// ---------------------------------------------------------------------------------------------------------
// Custom tasks from YAML (docs/eval.md).

struct CustomTaskConfig {
  std::string name;
  std::string type = "multiple_choice";
  std::string data;
  std::string fewshot_data;
  int64_t num_fewshot = 0;
  std::string description;
  std::string prompt;
  std::string choices;
  std::string answer;
  std::string target;
  std::string target_delimiter = " ";
  std::string fewshot_delimiter = "\n\n";
  std::vector<std::string> stop;
  int64_t max_new_tokens = 256;
  std::string answer_regex;
  bool ignore_case = false;
  std::vector<std::string> ignore_regexes;
  std::string image_field;
};

const ConfigSchema<CustomTaskConfig>& custom_schema() {
  using C = CustomTaskConfig;
  static const ConfigSchema<C> schema = ConfigSchema<C>()
      .string("name", &C::name, "task name in results")
      .string("type", &C::type, "multiple_choice or generation", {"multiple_choice", "generation"})
      .string("data", &C::data, "JSON Lines file of the evaluated items (relative to the YAML file)")
      .string("fewshot_data", &C::fewshot_data, "JSON Lines file of few-shot examples (default: sampled from data)")
      .integer("num_fewshot", &C::num_fewshot, "few-shot examples per item", 0, 1000)
      .string("description", &C::description, "text before the examples")
      .string("prompt", &C::prompt, "the question's prompt, with {field} substitutions")
      .string("choices", &C::choices, "multiple_choice: the field holding the list of choices")
      .string("answer", &C::answer, "multiple_choice: the gold field (index or choice text); generation: reference template")
      .string("target", &C::target, "generation: the few-shot answer template (default: the answer)")
      .string("target_delimiter", &C::target_delimiter, "between the prompt and the answer")
      .string("fewshot_delimiter", &C::fewshot_delimiter, "between examples")
      .strings("stop", &C::stop, "generation: stop strings")
      .integer("max_new_tokens", &C::max_new_tokens, "generation: tokens to generate at most", 1, 1 << 20)
      .string("answer_regex", &C::answer_regex, "generation: regex extracting the answer (first group)")
      .boolean("ignore_case", &C::ignore_case, "generation: compare answers case-insensitively")
      .strings("ignore_regexes", &C::ignore_regexes, "generation: regexes removed before comparing")
      .string("image_field", &C::image_field, "the field holding each row's image path or list of paths (relative to "
              "the row's data file, or absolute); the prompt gets one <image> per image unless it writes them");
  return schema;
}

// The images of a row: `field` holds one path or a list of paths, relative ones resolved against `base` (the
// folder of the row's data file). Each must be an existing regular file (decoding waits for the evaluator).
std::vector<ImageRef> row_images(const Json& row, const std::string& field, const fs::path& base,
                                 const std::string& where) {
  if (!row.contains(field)) fail<FormatError>("{}: no field '{}' (the images)", where, field);
  const Json& value = row.at(field);
  std::vector<std::string> names;
  if (value.is_string()) {
    names.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const auto& v : value) {
      if (!v.is_string()) {
        fail<FormatError>("{}: '{}' must be an image path or a list of paths, got an element {}", where, field,
                          describe_json(v));
      }
      names.push_back(v.get<std::string>());
    }
  } else {
    fail<FormatError>("{}: '{}' must be an image path or a list of paths, got {}", where, field, describe_json(value));
  }
  std::vector<ImageRef> out;
  for (const auto& name : names) {
    if (name.empty()) fail<FormatError>("{}: '{}' holds an empty image path", where, field);
    const fs::path path = fs::path(name).is_absolute() ? fs::path(name) : base / name;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) fail<IoError>("{}: image {} does not exist", where, path.string());
    if (!fs::is_regular_file(st)) fail<IoError>("{}: image {} is not a regular file", where, path.string());
    out.push_back(path);
  }
  return out;
}

// A row's prompt with its image placeholders: as written when it holds kImagePlaceholder (then once per image),
// else one "<image>\n" per image put in front.
std::string with_image_placeholders(const std::string& prompt, size_t images, const std::string& where) {
  const int64_t written = count_image_placeholders(prompt);
  if (written == 0) {
    std::string out;
    for (size_t i = 0; i < images; ++i) out += std::string(kImagePlaceholder) + "\n";
    return out + prompt;
  }
  if (written != static_cast<int64_t>(images)) {
    fail<FormatError>("{}: the prompt holds {} {} placeholder(s) but the row has {} image(s)", where, written,
                      kImagePlaceholder, images);
  }
  return prompt;
}

// An image task's assembled context must hold exactly one placeholder per image: text outside the rows' prompts
// (description, an example's answer) may not write one.
void check_image_count(const std::string& context, size_t images, const std::string& where) {
  const int64_t n = count_image_placeholders(context);
  if (n != static_cast<int64_t>(images)) {
    fail<FormatError>("{}: the assembled prompt holds {} {} placeholder(s) for {} image(s); only the prompt of a "
                      "row may hold them (not the description or an answer)", where, n, kImagePlaceholder, images);
  }
}

Task load_custom(const fs::path& yaml, const TaskOptions& options) {
  CustomTaskConfig c;
  custom_schema().apply_file(c, yaml);
  const std::string origin = yaml.string();
  if (c.name.empty()) fail<ConfigError>("{}: 'name' is required", origin);
  if (c.data.empty()) fail<ConfigError>("{}: 'data' is required (a JSON Lines file)", origin);
  if (c.prompt.empty()) fail<ConfigError>("{}: 'prompt' is required (e.g. \"Question: {{question}}\\nAnswer:\")", origin);
  if (c.answer.empty()) fail<ConfigError>("{}: 'answer' is required", origin);
  const fs::path base = yaml.parent_path();
  const fs::path data = fs::path(c.data).is_absolute() ? fs::path(c.data) : base / c.data;
  const bool images = !c.image_field.empty();
  if (!fs::exists(data)) fail<IoError>("{}: data file {} does not exist", origin, data.string());
  const int k = options.num_fewshot.value_or(static_cast<int>(c.num_fewshot));
  Task task;
  task.name = c.name;
  task.source = data.string();
  task.num_fewshot = k;
  task.has_images = images;
  const auto rows = read_jsonl(data);
  std::vector<std::pair<std::string, Json>> shot_rows;
  fs::path shot_base;
  if (!c.fewshot_data.empty()) {
    const fs::path f = fs::path(c.fewshot_data).is_absolute() ? fs::path(c.fewshot_data) : base / c.fewshot_data;
    shot_base = f.parent_path();
    shot_rows = read_jsonl(f);
    if (static_cast<int>(shot_rows.size()) < k) fail<ConfigError>("{}: {} few-shot examples asked, {} has {}", origin, k, f.string(), shot_rows.size());
    if (k > 0) task.fewshot_source = f.string() + " (first k)";
  } else if (k > 0) {
    task.fewshot_source = data.string() + " (sampled, excluding the question)";
  }

  if (c.type == "multiple_choice") {
    if (c.choices.empty()) fail<ConfigError>("{}: multiple_choice needs 'choices' (the field holding the list)", origin);
    task.kind = TaskKind::kMultipleChoice;
    auto question = [&](const Json& row, const std::string& where, const fs::path& row_base) {
      Question q;
      q.source = where;
      q.query = render_fields(c.prompt, row, where);
      if (images) {
        q.images = row_images(row, c.image_field, row_base, where);
        q.query = with_image_placeholders(q.query, q.images.size(), where);
      }
      if (!row.contains(c.choices)) fail<FormatError>("{}: no field '{}' (the choices)", where, c.choices);
      q.choices = string_list(row.at(c.choices), c.choices, where);
      for (const auto& choice : q.choices) {
        if (images && count_image_placeholders(choice) > 0) {
          fail<FormatError>("{}: the choice \"{}\" holds {}: images go in the prompt", where, choice, kImagePlaceholder);
        }
      }
      if (!row.contains(c.answer)) fail<FormatError>("{}: no field '{}' (the answer)", where, c.answer);
      const Json& a = row.at(c.answer);
      if (a.is_string() && std::find(q.choices.begin(), q.choices.end(), a.get<std::string>()) != q.choices.end()) {
        q.gold = static_cast<int>(std::find(q.choices.begin(), q.choices.end(), a.get<std::string>()) - q.choices.begin());
      } else {
        q.gold = gold_index(a, q.choices.size(), c.answer, where);
      }
      return q;
    };
    std::vector<Question> all, shots_pool;
    for (const auto& [where, row] : rows) all.push_back(question(row, where, data.parent_path()));
    for (int i = 0; i < k && !shot_rows.empty(); ++i) {
      shots_pool.push_back(question(shot_rows[i].second, shot_rows[i].first, shot_base));
    }
    const size_t count = options.limit ? std::min<size_t>(all.size(), *options.limit) : all.size();
    for (size_t i = 0; i < count; ++i) {
      std::vector<const Question*> shots;
      if (!shots_pool.empty()) {
        for (const auto& s : shots_pool) shots.push_back(&s);
      } else {
        for (size_t j : sample_others(all.size(), i, k, options.seed, c.name)) shots.push_back(&all[j]);
      }
      ChoiceItem item;
      item.context = assemble(c.description, shots, all[i].query, c.target_delimiter, c.fewshot_delimiter);
      item.choices = all[i].choices;
      item.delimiter = c.target_delimiter;
      item.gold = all[i].gold;
      item.source = all[i].source;
      if (images) {
        for (const Question* s : shots) item.images.insert(item.images.end(), s->images.begin(), s->images.end());
        item.images.insert(item.images.end(), all[i].images.begin(), all[i].images.end());
        check_image_count(item.context, item.images.size(), item.source);
      }
      task.choice_items.push_back(std::move(item));
    }
    return task;
  }

  task.kind = TaskKind::kGeneration;
  task.generation.stop = c.stop;
  task.generation.max_new_tokens = c.max_new_tokens;
  task.generation.ignore_case = c.ignore_case;
  task.generation.ignore_regexes = c.ignore_regexes;
  if (!c.answer_regex.empty()) task.generation.filters.push_back({"regex", c.answer_regex, 0, "[invalid]"});
  else task.generation.filters.push_back({"none", "", 0, ""});
  const std::string target_templ = c.target.empty() ? c.answer : c.target;
  // A row's prompt and images (placeholders added as for multiple choice).
  auto query = [&](const Json& row, const std::string& where, const fs::path& row_base, std::vector<ImageRef>& out) {
    std::string text = render_fields(c.prompt, row, where);
    if (!images) return text;
    const std::vector<ImageRef> own = row_images(row, c.image_field, row_base, where);
    out.insert(out.end(), own.begin(), own.end());
    return with_image_placeholders(text, own.size(), where);
  };
  const fs::path data_folder = data.parent_path();
  const size_t count = options.limit ? std::min<size_t>(rows.size(), *options.limit) : rows.size();
  for (size_t i = 0; i < count; ++i) {
    GenerationItem item;
    std::string prefix = c.description;
    std::vector<std::pair<const std::pair<std::string, Json>*, const fs::path*>> shots;  // (row, its folder; null: data's)
    if (!shot_rows.empty()) {
      for (int j = 0; j < k; ++j) shots.emplace_back(&shot_rows[j], &shot_base);
    } else {
      for (size_t j : sample_others(rows.size(), i, k, options.seed, c.name)) shots.emplace_back(&rows[j], nullptr);
    }
    for (const auto& [shot, shot_folder] : shots) {
      const auto& [where, row] = *shot;
      prefix += query(row, where, shot_folder ? *shot_folder : data_folder, item.images) + c.target_delimiter +
                render_fields(target_templ, row, where) + c.fewshot_delimiter;
    }
    const auto& [where, row] = rows[i];
    item.context = prefix + query(row, where, data_folder, item.images);
    item.target = render_fields(c.answer, row, where);
    item.source = where;
    if (images) check_image_count(item.context, item.images.size(), item.source);
    task.generation_items.push_back(std::move(item));
  }
  return task;
}

}  // namespace

GenerationSpec gsm8k_spec() {
  GenerationSpec g;
  g.stop = {"Question:", "</s>", "<|im_end|>"};
  g.max_new_tokens = 256;
  g.filters = {{"strict-match", "#### (\\-?[0-9\\.\\,]+)", 0, "[invalid]"},
               {"flexible-extract", "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]"}};
  g.ignore_regexes = {",", "\\$", "(?s).*#### ", "\\.$"};
  g.ignore_case = true;
  return g;
}

// ---------------------------------------------------------------------------------------------------------

std::vector<std::pair<size_t, std::vector<std::string>>> parse_csv(const std::string& text, const std::string& origin) {
  std::vector<std::pair<size_t, std::vector<std::string>>> rows;
  std::vector<std::string> fields;
  std::string field;
  size_t line = 1, row_line = 1;
  bool quoted = false, any = false;
  size_t quote_line = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        if (ch == '\n') ++line;
        field += ch;
      }
      continue;
    }
    if (ch == '"' && field.empty()) {
      quoted = true;
      quote_line = line;
      any = true;
    } else if (ch == ',') {
      fields.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        fields.push_back(std::move(field));
        rows.emplace_back(row_line, std::move(fields));
      }
      fields.clear();
      field.clear();
      any = false;
      row_line = ++line;
    } else {
      field += ch;
      any = true;
    }
  }
  if (quoted) fail<FormatError>("{}:{}: a quoted field is never closed", origin, quote_line);
  if (any || !field.empty()) {
    fields.push_back(std::move(field));
    rows.emplace_back(row_line, std::move(fields));
  }
  return rows;
}

std::string hellaswag_preprocess(const std::string& text) {
  std::string s = strip_whitespace(text);
  std::string out;
  // " [title]" -> ". "
  for (size_t pos = 0;;) {
    const size_t hit = s.find(" [title]", pos);
    out += s.substr(pos, hit == std::string::npos ? std::string::npos : hit - pos);
    if (hit == std::string::npos) break;
    out += ". ";
    pos = hit + 8;
  }
  // Drop "[...]" (non-greedy, as re.sub("\\[.*?\\]", "", text) does; '.' does not cross newlines).
  s.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '[') {
      const size_t close = out.find(']', i + 1);
      const size_t newline = out.find('\n', i + 1);
      if (close != std::string::npos && (newline == std::string::npos || newline > close)) {
        i = close;
        continue;
      }
    }
    s += out[i];
  }
  // "  " -> " " (one pass, like str.replace)
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == ' ' && i + 1 < s.size() && s[i + 1] == ' ') ++i;
  }
  return out;
}

std::string render_fields(const std::string& templ, const Json& row, const std::string& origin) {
  std::string out;
  for (size_t i = 0; i < templ.size(); ++i) {
    const char ch = templ[i];
    if ((ch == '{' || ch == '}') && i + 1 < templ.size() && templ[i + 1] == ch) {
      out += ch;
      ++i;
      continue;
    }
    if (ch != '{') {
      out += ch;
      continue;
    }
    const size_t close = templ.find('}', i + 1);
    if (close == std::string::npos) fail<ConfigError>("{}: unclosed '{{' in the template \"{}\"", origin, templ);
    const std::string path = templ.substr(i + 1, close - i - 1);
    const Json* cur = &row;
    std::stringstream parts(path);
    for (std::string part; std::getline(parts, part, '.');) {
      if (cur->is_object() && cur->contains(part)) {
        cur = &cur->at(part);
      } else if (cur->is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
                 std::stoul(part) < cur->size()) {
        cur = &cur->at(std::stoul(part));
      } else {
        fail<FormatError>("{}: the template field '{{{}}}' is not in the row", origin, path);
      }
    }
    out += cur->is_string() ? cur->get<std::string>() : cur->dump();
    i = close;
  }
  return out;
}

void check_task_name(const std::string& spec) {
  if (ends_with(spec, ".yaml") || ends_with(spec, ".yml")) return;
  const std::string name = spec.substr(0, spec.find('='));
  const auto names = builtin_task_names();
  if (std::find(names.begin(), names.end(), name) != names.end() || name.rfind("mmlu_", 0) == 0) return;
  fail<ConfigError>("unknown task '{}'; built-in tasks: {} (and mmlu_<subject>), or a custom task file.yaml", name,
                    list_names(names));
}

Task load_task(const std::string& spec, const fs::path& data_dir, const TaskOptions& options) {
  check_task_name(spec);
  if (options.num_fewshot && *options.num_fewshot < 0) fail<ConfigError>("--num-fewshot must be >= 0");
  if (options.limit && *options.limit < 1) fail<ConfigError>("--limit must be >= 1, got {}", *options.limit);
  if (ends_with(spec, ".yaml") || ends_with(spec, ".yml")) {
    if (!fs::exists(spec)) fail<IoError>("custom task file {} does not exist", spec);
    return load_custom(spec, options);
  }
  const size_t eq = spec.find('=');
  const std::string name = spec.substr(0, eq);
  const bool explicit_path = eq != std::string::npos;
  const fs::path given = explicit_path ? fs::path(spec.substr(eq + 1)) : fs::path();
  if (explicit_path && !fs::exists(given)) fail<IoError>("task {}: {} does not exist", name, given.string());
  const fs::path d = data_dir;
  if (name == "mmlu" || name.rfind("mmlu_", 0) == 0) {
    const fs::path path = explicit_path ? given : first_existing(name, {d / "mmlu" / "data", d / "mmlu" / "mmlu.zip", d / "mmlu"});
    return load_mmlu(name, path, options);
  }
  if (name == "arc_easy" || name == "arc_challenge") {
    const std::string upper = name == "arc_easy" ? "ARC-Easy" : "ARC-Challenge";
    const fs::path path = explicit_path ? given
                                        : first_existing(name, {d / "arc" / (name + ".jsonl"), d / (name + ".jsonl"),
                                                                d / upper / (upper + "-Test.jsonl")});
    return load_arc(name, path, options);
  }
  if (name == "hellaswag") {
    const fs::path h = d / "hellaswag";
    const fs::path path = explicit_path ? given
                                        : first_existing(name, {h / "hellaswag_val.jsonl", h / "hellaswag_val_full.txt",
                                                                h / "hellaswag_val_full.txt.bz2",
                                                                h / "hellaswag_val_first200.jsonl"});
    return load_hellaswag(name, path, options);
  }
  if (name == "gsm8k") {
    const fs::path path = explicit_path ? given : first_existing(name, {d / "gsm8k" / "test.jsonl", d / "gsm8k_test.jsonl"});
    return load_gsm8k(name, path, options);
  }
  if (name == "perplexity") {
    const fs::path path = explicit_path ? given : first_existing(name, {d / "perplexity_text.txt", d / "perplexity.jsonl"});
    return load_perplexity(name, path, options);
  }
  fail<ConfigError>("unknown task '{}'", name);  // check_task_name let through a name handled above
}

}  // namespace swiftcpp::eval
