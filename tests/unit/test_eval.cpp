// Evaluation tasks and scoring rules: the data layouts of MMLU, ARC, HellaSwag, GSM8K, perplexity and custom
// YAML tasks, the prompts lm-eval poses, bad input, and the metrics (acc, acc_norm, stderr, exact match).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "eval/metrics.h"
#include "eval/tasks.h"
#include "tests/test_util.h"

namespace swiftcpp::eval {
namespace {

using test::assets;
using test::temp_dir;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- CSV ----

TEST(EvalCsv, QuotedFieldsCommasNewlinesAndLineNumbers) {
  const auto rows = parse_csv("a,b\n\"x, y\",\"say \"\"hi\"\"\nnext\",z\r\nlast,\n", "t.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].first, 1u);
  EXPECT_EQ(rows[1].first, 2u);
  EXPECT_EQ(rows[1].second, (std::vector<std::string>{"x, y", "say \"hi\"\nnext", "z"}));
  EXPECT_EQ(rows[2].first, 4u);
  EXPECT_EQ(rows[2].second, (std::vector<std::string>{"last", ""}));
  EXPECT_NE(error_of<FormatError>([] { parse_csv("a\n\"open,\nb\n", "bad.csv"); }).find("bad.csv:2"), std::string::npos);
}

// ---- MMLU ----

fs::path make_mmlu(const std::string& name) {
  const fs::path dir = temp_dir(name);
  write(dir / "data/dev/alpha_beta_dev.csv",
        "d1?,w,x,y,z,A\nd2?,w,x,y,z,B\nd3?,w,x,y,z,C\nd4?,w,x,y,z,D\nd5?,w,x,y,z,A\n");
  write(dir / "data/test/alpha_beta_test.csv", " What is 1+1? ,1,2,\"3, or so\",4,B\nSecond?,a,b,c,d,D\n");
  write(dir / "data/dev/gamma_dev.csv", "g?,1,2,3,4,C\ng2?,1,2,3,4,A\n");
  write(dir / "data/test/gamma_test.csv", "Q?,1,2,3,4,C\n");
  return dir;
}

TEST(EvalMmlu, PromptIsLmEvalsAndFewShotComesFromDev) {
  const fs::path dir = make_mmlu("mmlu_prompt");
  TaskOptions o;
  o.num_fewshot = 2;
  const Task t = load_task("mmlu=" + dir.string(), "", o);
  ASSERT_EQ(t.choice_items.size(), 3u);
  const ChoiceItem& item = t.choice_items[0];
  EXPECT_EQ(item.context,
            "The following are multiple choice questions (with answers) about alpha beta.\n\n"
            "d1?\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
            "d2?\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n"
            "What is 1+1?\nA. 1\nB. 2\nC. 3, or so\nD. 4\nAnswer:");
  EXPECT_EQ(item.choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ(item.delimiter, " ");
  EXPECT_EQ(item.gold, 1);
  EXPECT_EQ(item.group, "alpha_beta");
  EXPECT_EQ(t.choice_items[1].gold, 3);
  EXPECT_EQ(t.num_fewshot, 2);
  // gamma has two dev rows: the default five shots cannot be drawn from it.
  TaskOptions five;
  EXPECT_NE(error_of<ConfigError>([&] { load_task("mmlu=" + dir.string(), "", five); }).find("gamma_dev.csv has 2"),
            std::string::npos);
  // One subject alone, limit per subject, unknown subject.
  TaskOptions zero;
  zero.num_fewshot = 0;
  zero.limit = 1;
  const Task one = load_task("mmlu_alpha_beta=" + dir.string(), "", zero);
  ASSERT_EQ(one.choice_items.size(), 1u);
  EXPECT_EQ(one.choice_items[0].context.rfind("The following", 0), 0u);
  EXPECT_NE(error_of<ConfigError>([&] { load_task("mmlu_delta=" + dir.string(), "", zero); }).find("alpha_beta, gamma"),
            std::string::npos);
}

TEST(EvalMmlu, BadRowsNameTheFileAndLine) {
  const fs::path dir = make_mmlu("mmlu_bad");
  TaskOptions o;
  o.num_fewshot = 0;
  write(dir / "data/test/gamma_test.csv", "Q?,1,2,3,4,C\nshort,1,2,C\n");
  std::string e = error_of<FormatError>([&] { load_task("mmlu=" + dir.string(), "", o); });
  EXPECT_NE(e.find("gamma_test.csv:2: expected 6 fields"), std::string::npos) << e;
  write(dir / "data/test/gamma_test.csv", "Q?,1,2,3,4,C\nQ2?,1,2,3,4,E\n");
  e = error_of<FormatError>([&] { load_task("mmlu=" + dir.string(), "", o); });
  EXPECT_NE(e.find("gamma_test.csv:2: the answer must be A, B, C or D, got 'E'"), std::string::npos) << e;
}

TEST(EvalMmlu, RealZipHasAll57SubjectsAndCategories) {
  const fs::path zip = assets() / "data/eval/mmlu/mmlu.zip";
  SWIFTCPP_REQUIRE_SHARED(zip);
  TaskOptions o;
  const Task t = load_task("mmlu", assets() / "data/eval", o);
  EXPECT_EQ(t.choice_items.size(), 14042u);
  std::set<std::string> subjects, categories;
  for (const auto& item : t.choice_items) {
    subjects.insert(item.group);
    categories.insert(t.categories.at(item.group));
  }
  EXPECT_EQ(subjects.size(), 57u);
  EXPECT_EQ(categories, (std::set<std::string>{"Humanities", "Other", "STEM", "Social Sciences"}));
  EXPECT_EQ(t.choice_items[0].context.rfind(
                "The following are multiple choice questions (with answers) about abstract algebra.\n\n", 0),
            0u);
  EXPECT_NE(t.choice_items[0].source.find("mmlu.zip:data/test/abstract_algebra_test.csv:1"), std::string::npos);
}

// ---- ARC ----

TEST(EvalArc, ThreeLayoutsGiveTheSamePrompt) {
  const fs::path dir = temp_dir("arc_layouts");
  write(dir / "a.jsonl",
        R"({"query": "Question: Why?", "choices": ["x", "y"], "gold": 1})" "\n"
        R"({"id": "1", "question": {"stem": "Why?", "choices": [{"text": "x", "label": "A"}, {"text": "y", "label": "B"}]}, "answerKey": "B"})" "\n"
        R"({"question": "Why?", "choices": {"text": ["x", "y"], "label": ["1", "2"]}, "answerKey": "2"})" "\n");
  const Task t = load_task("arc_easy=" + (dir / "a.jsonl").string(), "", {});
  ASSERT_EQ(t.choice_items.size(), 3u);
  for (const auto& item : t.choice_items) {
    EXPECT_EQ(item.context, "Question: Why?\nAnswer:");
    EXPECT_EQ(item.choices, (std::vector<std::string>{"x", "y"}));
    EXPECT_EQ(item.gold, 1);
  }
  EXPECT_EQ(t.num_fewshot, 0);
  write(dir / "bad.jsonl", R"({"query": "Q", "choices": ["x", "y"], "gold": 2})" "\n");
  std::string e = error_of<FormatError>([&] { load_task("arc_easy=" + (dir / "bad.jsonl").string(), "", {}); });
  EXPECT_NE(e.find("bad.jsonl:1: 'gold' 2 is out of range for 2 choices"), std::string::npos) << e;
  write(dir / "bad2.jsonl", "\n" R"({"question": {"stem": "Q", "choices": [{"text": "x", "label": "A"}]}, "answerKey": "C"})" "\n");
  e = error_of<FormatError>([&] { load_task("arc_challenge=" + (dir / "bad2.jsonl").string(), "", {}); });
  EXPECT_NE(e.find("bad2.jsonl:2: answerKey 'C' is not one of the labels A"), std::string::npos) << e;
}

TEST(EvalArc, FewShotFromTheSameSplitExcludesTheQuestion) {
  const fs::path dir = temp_dir("arc_shots");
  std::string text;
  for (int i = 0; i < 6; ++i) text += fmt::format(R"({{"query": "Question: q{}", "choices": ["a{}", "b{}"], "gold": 0}})" "\n", i, i, i);
  write(dir / "a.jsonl", text);
  TaskOptions o;
  o.num_fewshot = 3;
  const Task t = load_task("arc_easy=" + (dir / "a.jsonl").string(), "", o);
  for (size_t i = 0; i < t.choice_items.size(); ++i) {
    const std::string& c = t.choice_items[i].context;
    EXPECT_EQ(std::count(c.begin(), c.end(), 'Q'), 4) << c;  // three shots and the question
    EXPECT_EQ(c.find(fmt::format("q{}\n", i)), c.rfind(fmt::format("q{}\n", i)));  // the question appears once
    const std::string tail = fmt::format("Question: q{}\nAnswer:", i);
    EXPECT_EQ(c.substr(c.size() - tail.size()), tail);
  }
  // Seeded: the same seed gives the same shots.
  EXPECT_EQ(load_task("arc_easy=" + (dir / "a.jsonl").string(), "", o).choice_items[2].context, t.choice_items[2].context);
}

// ---- HellaSwag ----

TEST(EvalHellaswag, PreprocessIsLmEvals) {
  EXPECT_EQ(hellaswag_preprocess("  A man [title] walks.  [step] He  sits [header] down "), "A man. walks.  He sits down");  // Python's replace("  ", " ") is one pass
  EXPECT_EQ(hellaswag_preprocess("no tags"), "no tags");
}

TEST(EvalHellaswag, JsonlAndTextLayoutsAgreeOnRealData) {
  const fs::path txt = assets() / "data/eval/hellaswag/hellaswag_val_full.txt.bz2";
  SWIFTCPP_REQUIRE_SHARED(txt);
  const Task full = load_task("hellaswag=" + txt.string(), "", {});
  EXPECT_EQ(full.choice_items.size(), 10042u);
  const Task first = load_task("hellaswag=" + (assets() / "data/eval/hellaswag/hellaswag_val_first200.jsonl").string(), "", {});
  ASSERT_EQ(first.choice_items.size(), 200u);
  for (size_t i = 0; i < 200; ++i) {
    EXPECT_EQ(first.choice_items[i].context, full.choice_items[i].context) << i;
    EXPECT_EQ(first.choice_items[i].choices, full.choice_items[i].choices) << i;
    EXPECT_EQ(first.choice_items[i].gold, full.choice_items[i].gold) << i;
  }
  EXPECT_EQ(full.choice_items[0].context, "Roof shingle removal: A man is sitting on a roof. he");
  EXPECT_EQ(full.choice_items[0].gold, 3);
  // The default file under the data folder is the full validation set.
  EXPECT_EQ(load_task("hellaswag", assets() / "data/eval", {}).choice_items.size(), 10042u);
}

TEST(EvalHellaswag, BadTextLayout) {
  const fs::path dir = temp_dir("hs_bad");
  write(dir / "h.txt", "ctx\n3\na\nb\nc\nd\nctx2\n1\na\n");
  std::string e = error_of<FormatError>([&] { load_task("hellaswag=" + (dir / "h.txt").string(), "", {}); });
  EXPECT_NE(e.find("h.txt:7: the text layout has 6 lines a task"), std::string::npos) << e;
  write(dir / "h2.txt", "ctx\n7\na\nb\nc\nd\n");
  e = error_of<FormatError>([&] { load_task("hellaswag=" + (dir / "h2.txt").string(), "", {}); });
  EXPECT_NE(e.find("h2.txt:2: expected the gold label 0..3, got '7'"), std::string::npos) << e;
  write(dir / "h.jsonl", R"({"ctx": "c", "endings": ["a", "b"], "label": "5"})" "\n");
  e = error_of<FormatError>([&] { load_task("hellaswag=" + (dir / "h.jsonl").string(), "", {}); });
  EXPECT_NE(e.find("h.jsonl:1: 'label' 5 is out of range"), std::string::npos) << e;
}

// ---- GSM8K ----

TEST(EvalGsm8k, PromptStopsAndShotsWithoutATrainSplit) {
  const fs::path dir = temp_dir("gsm");
  std::string text;
  for (int i = 0; i < 4; ++i) text += fmt::format(R"({{"question": "q{}?", "answer": "step\n#### {}"}})" "\n", i, i * 1000);
  write(dir / "test.jsonl", text);
  TaskOptions o;
  o.num_fewshot = 2;
  const Task t = load_task("gsm8k=" + (dir / "test.jsonl").string(), "", o);
  ASSERT_EQ(t.generation_items.size(), 2u);  // the first two rows became the examples
  EXPECT_EQ(t.generation_items[0].context,
            "Question: q0?\nAnswer: step\n#### 0\n\nQuestion: q1?\nAnswer: step\n#### 1000\n\nQuestion: q2?\nAnswer:");
  EXPECT_EQ(t.generation_items[0].target, "step\n#### 2000");
  EXPECT_NE(t.fewshot_source.find("not evaluated"), std::string::npos);
  EXPECT_EQ(t.generation.stop, (std::vector<std::string>{"Question:", "</s>", "<|im_end|>"}));
  // With train.jsonl beside it, shots come from there and every test row is evaluated.
  write(dir / "train.jsonl", R"({"question": "t?", "answer": "#### 7"})" "\n" R"({"question": "u?", "answer": "#### 8"})" "\n");
  const Task u = load_task("gsm8k=" + (dir / "test.jsonl").string(), "", o);
  EXPECT_EQ(u.generation_items.size(), 4u);
  EXPECT_EQ(u.generation_items[0].context.rfind("Question: t?\nAnswer: #### 7\n\n", 0), 0u);
  write(dir / "bad.jsonl", R"({"question": "q", "answer": "no marker"})" "\n");
  EXPECT_NE(error_of<FormatError>([&] { load_task("gsm8k=" + (dir / "bad.jsonl").string(), "", o); }).find("bad.jsonl:1"),
            std::string::npos);
  // The reference after '#### ' must be a number: an empty one or NaN would make every prediction wrong unnoticed.
  for (const char* answer : {"x\\n#### ", "x\\n#### NaN", "x\\n#### seven"}) {
    write(dir / "bad.jsonl", std::string(R"({"question": "q", "answer": ")") + answer + "\"}\n");
    const std::string e = error_of<FormatError>([&] { load_task("gsm8k=" + (dir / "bad.jsonl").string(), "", o); });
    EXPECT_NE(e.find("bad.jsonl:1"), std::string::npos) << e;
    EXPECT_NE(e.find("must be a number"), std::string::npos) << e;
  }
}

// ---- names and files ----

TEST(EvalTasks, UnknownNamesAndMissingFiles) {
  const std::string e = error_of<ConfigError>([] { load_task("mmul", "", {}); });
  EXPECT_NE(e.find("unknown task 'mmul'"), std::string::npos);
  EXPECT_NE(e.find("arc_easy"), std::string::npos);
  const fs::path empty = temp_dir("no_data");
  const std::string io = error_of<IoError>([&] { load_task("arc_easy", empty, {}); });
  EXPECT_NE(io.find((empty / "arc" / "arc_easy.jsonl").string()), std::string::npos) << io;
  EXPECT_NE(error_of<IoError>([&] { load_task("gsm8k=" + (empty / "x.jsonl").string(), "", {}); }).find("x.jsonl"),
            std::string::npos);
  TaskOptions bad;
  bad.limit = 0;
  EXPECT_THROW(load_task("arc_easy", empty, bad), ConfigError);
}

// ---- custom YAML ----

TEST(EvalCustom, MultipleChoiceAndGenerationTasks) {
  const fs::path dir = temp_dir("custom");
  write(dir / "mc.jsonl", R"({"q": "2+2", "opts": ["3", "4"], "ans": "4"})" "\n" R"({"q": "1+1", "opts": ["2", "5"], "ans": 0})" "\n");
  write(dir / "mc.yaml",
        "name: sums\ntype: multiple_choice\ndata: mc.jsonl\nprompt: \"Sum {q} =\"\nchoices: opts\nanswer: ans\n"
        "description: \"Arithmetic.\\n\\n\"\n");
  const Task mc = load_task((dir / "mc.yaml").string(), "", {});
  ASSERT_EQ(mc.choice_items.size(), 2u);
  EXPECT_EQ(mc.name, "sums");
  EXPECT_EQ(mc.choice_items[0].context, "Arithmetic.\n\nSum 2+2 =");
  EXPECT_EQ(mc.choice_items[0].gold, 1);
  EXPECT_EQ(mc.choice_items[1].gold, 0);
  TaskOptions one_shot;
  one_shot.num_fewshot = 1;
  EXPECT_EQ(load_task((dir / "mc.yaml").string(), "", one_shot).choice_items[0].context,
            "Arithmetic.\n\nSum 1+1 = 2\n\nSum 2+2 =");

  write(dir / "gen.jsonl", R"({"question": {"text": "Capital of France?"}, "answer": "Paris"})" "\n");
  write(dir / "gen.yaml",
        "name: capitals\ntype: generation\ndata: gen.jsonl\nprompt: \"Q: {question.text}\\nA:\"\nanswer: \"{answer}\"\n"
        "stop: [\"\\n\"]\nmax_new_tokens: 8\nanswer_regex: \"([A-Z][a-z]+)\"\nignore_case: true\n");
  const Task gen = load_task((dir / "gen.yaml").string(), "", {});
  ASSERT_EQ(gen.generation_items.size(), 1u);
  EXPECT_EQ(gen.generation_items[0].context, "Q: Capital of France?\nA:");
  EXPECT_EQ(gen.generation_items[0].target, "Paris");
  EXPECT_EQ(gen.generation.max_new_tokens, 8);
  EXPECT_EQ(gen.generation.stop, std::vector<std::string>{"\n"});

  write(dir / "typo.yaml", "name: x\ndata: mc.jsonl\nprompt: p\nanswr: ans\n");
  std::string e = error_of<ConfigError>([&] { load_task((dir / "typo.yaml").string(), "", {}); });
  EXPECT_NE(e.find("typo.yaml:4"), std::string::npos) << e;
  write(dir / "missing.yaml", "name: x\ndata: mc.jsonl\nprompt: \"{nope}\"\nchoices: opts\nanswer: ans\n");
  e = error_of<FormatError>([&] { load_task((dir / "missing.yaml").string(), "", {}); });
  EXPECT_NE(e.find("mc.jsonl:1: the template field '{nope}' is not in the row"), std::string::npos) << e;
}

// ---- metrics ----

TEST(EvalMetrics, AccAndAccNormByHand) {
  // Summed log-likelihoods favour the short choice; per character the long one wins.
  const std::vector<std::string> choices = {"no", "a much longer answer"};  // 2 and 20 characters
  const ChoiceOutcome o = decide_choice({-3.0, -10.0}, choices, 1);
  EXPECT_EQ(o.pred, 0);       // -3 > -10
  EXPECT_EQ(o.pred_norm, 1);  // -1.5 < -0.5
  EXPECT_FALSE(o.correct);
  EXPECT_TRUE(o.correct_norm);
  // Characters, not bytes: "é" is one character (Python's len), two UTF-8 bytes.
  EXPECT_EQ(count_code_points("caf\xc3\xa9"), 4u);
  EXPECT_EQ(decide_choice({-4.0, -4.5}, {"caf\xc3\xa9", "cafes"}, 0).pred_norm, 1);  // -1.0 vs -0.9
  EXPECT_EQ(argmax({1.0, 3.0, 3.0}), 1);  // the first of ties
  EXPECT_THROW(decide_choice({-1.0}, {"a", "b"}, 0), FormatError);
  EXPECT_THROW(decide_choice({-1.0, -2.0}, {"a", "b"}, 2), FormatError);
}

TEST(EvalMetrics, MeanStderrIsSampleStdOverSqrtN) {
  const MeanStderr m = mean_stderr({1, 0, 1, 1});
  EXPECT_DOUBLE_EQ(m.mean, 0.75);
  EXPECT_NEAR(m.stderr_, 0.25, 1e-15);  // sqrt((3 * 0.0625 + 0.5625) / 3) / sqrt(4) = sqrt(p(1-p)/(n-1))
  EXPECT_EQ(m.n, 4);
  EXPECT_TRUE(std::isnan(mean_stderr({1}).stderr_));
}

TEST(EvalMetrics, Gsm8kExtractionAndNormalisation) {
  AnswerFilter strict{"strict-match", "#### (\\-?[0-9\\.\\,]+)", 0, "[invalid]"};
  AnswerFilter flexible{"flexible-extract", "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]"};
  const std::string response = " She has 3 apples and buys 12 more, $1,234.50 in all.\n#### 1,234";
  EXPECT_EQ(extract_answer(response, strict), "1,234");
  EXPECT_EQ(extract_answer("The answer is 7.", strict), "[invalid]");
  EXPECT_EQ(extract_answer("The answer is 7.", flexible), "7.");  // "7." fits the first group's {2,}
  EXPECT_EQ(extract_answer("7 and then 9", flexible), "9");       // the last match, its second group
  EXPECT_EQ(extract_answer("costs $18.", flexible), "$18.");
  EXPECT_EQ(extract_answer("no numbers", flexible), "[invalid]");
  const std::vector<std::string> ignore = {",", "\\$", "(?s).*#### ", "\\.$"};
  EXPECT_EQ(normalize_answer("Janet sells 16 - 3 - 4 = 9.\nShe makes $18.\n#### 1,800", ignore, true), "1800");
  EXPECT_EQ(normalize_answer("$18.", ignore, true), "18");
  EXPECT_EQ(normalize_answer("ABC", {}, true), "abc");
  EXPECT_THROW(normalize_answer("x", {"("}, false), ConfigError);
}

TEST(EvalMetrics, PerplexityFigures) {
  EXPECT_EQ(count_words("a b  c"), 3);
  EXPECT_EQ(count_words(" a b\n"), 4);  // re.split keeps the empty ends
  PerplexityStats s;
  s.loglikelihood = -20;
  s.tokens = 10;
  s.words = 4;
  s.bytes = 16;
  EXPECT_NEAR(s.token_perplexity(), std::exp(2.0), 1e-12);
  EXPECT_NEAR(s.word_perplexity(), std::exp(5.0), 1e-9);
  EXPECT_NEAR(s.byte_perplexity(), std::exp(1.25), 1e-12);
  EXPECT_NEAR(s.bits_per_byte(), 1.25 / std::log(2.0), 1e-12);
}

TEST(EvalFields, RenderFields) {
  const Json row = {{"a", "x"}, {"n", 3}, {"list", {"p", "q"}}, {"obj", {{"k", "v"}}}};
  EXPECT_EQ(render_fields("{a}-{n}-{list.1}-{obj.k}-{{lit}}", row, "r"), "x-3-q-v-{lit}");
  EXPECT_THROW(render_fields("{missing}", row, "r"), FormatError);
}

}  // namespace
}  // namespace swiftcpp::eval
