// `swiftcpp eval` end to end on the bundled stories260K and the real benchmark data: every task runs, outputs
// are complete and reproducible, adapters apply, bad input exits with a clear message.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/fs.h"
#include "core/json.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::run_cli;
using test::source_dir;
using test::temp_dir;

std::string stories() { return (source_dir() / "models/stories260K").string(); }

size_t count_lines(const fs::path& p) {
  std::ifstream in(p);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

std::map<std::string, double> values_of(const Json& results) {
  std::map<std::string, double> out;
  for (const auto& r : results.at("results")) {
    if (!r.at("value").is_null()) out[r.at("task").get<std::string>() + "/" + r.at("metric").get<std::string>()] = r.at("value").get<double>();
  }
  return out;
}

TEST(EvalCli, EveryTaskRunsOnRealDataWithCompleteReproducibleOutputs) {
  const fs::path data = assets() / "data/eval";
  SWIFTCPP_REQUIRE_SHARED(data);
  const fs::path dir = temp_dir("eval_cli_all");
  const std::string common = "--threads 1 eval --model " + stories() +
                             " --tasks arc_easy,arc_challenge,hellaswag,mmlu,gsm8k,perplexity --data-dir " +
                             data.string() + " --limit 2 --max-length 128 --max-new-tokens 32 --log-samples";
  const auto first = run_cli(common + " --output-dir " + (dir / "a").string());
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("| Task | Metric | Value | Stderr | n | Shots |"), std::string::npos);
  EXPECT_NE(first.out.find("| mmlu | acc |"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("| gsm8k | exact_match,strict-match |"), std::string::npos);
  EXPECT_NE(first.out.find("| perplexity | word_perplexity |"), std::string::npos);

  const Json results = load_json_file(dir / "a/results.json");
  for (const char* key : {"results", "tasks", "config", "model", "adapter", "seed", "date", "swiftcpp_version"}) {
    EXPECT_TRUE(results.contains(key)) << key;
  }
  const auto values = values_of(results);
  for (const char* key : {"arc_easy/acc", "arc_easy/acc_norm", "arc_challenge/acc", "hellaswag/acc_norm", "mmlu/acc",
                          "mmlu/acc_macro", "mmlu_stem/acc", "mmlu_abstract_algebra/acc",
                          "gsm8k/exact_match,strict-match", "gsm8k/exact_match,flexible-extract",
                          "perplexity/word_perplexity", "perplexity/bits_per_byte"}) {
    EXPECT_TRUE(values.count(key)) << key;
  }
  for (const auto& r : results.at("results")) {
    if (r.at("task") == "mmlu" && r.at("metric") == "acc") {
      EXPECT_EQ(r.at("n"), 57 * 2);  // --limit applies per subject, as lm-eval's does
      EXPECT_EQ(r.at("num_fewshot"), 5);
    }
  }
  EXPECT_GT(values.at("perplexity/word_perplexity"), 1.0);
  EXPECT_EQ(count_lines(dir / "a/samples_arc_easy.jsonl"), 2u);
  EXPECT_EQ(count_lines(dir / "a/samples_mmlu.jsonl"), 57u * 2);
  EXPECT_EQ(count_lines(dir / "a/samples_gsm8k.jsonl"), 2u);
  EXPECT_EQ(count_lines(dir / "a/samples_perplexity.jsonl"), 1u);
  std::ifstream samples(dir / "a/samples_arc_easy.jsonl");
  std::string line;
  std::getline(samples, line);
  const Json sample = parse_json(line, "sample");
  for (const char* key : {"prompt", "choices", "loglikelihoods", "pred", "gold", "acc", "acc_norm"}) {
    EXPECT_TRUE(sample.contains(key)) << key;
  }
  EXPECT_EQ(sample.at("loglikelihoods").size(), sample.at("choices").size());

  // The same command gives the same numbers; another batch size changes only float rounding.
  const auto again = run_cli(common + " --output-dir " + (dir / "b").string());
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(values_of(load_json_file(dir / "b/results.json")), values);
  const auto batch1 = run_cli(common + " --batch-size 3 --output-dir " + (dir / "c").string());
  ASSERT_EQ(batch1.code, 0) << batch1.out;
  const auto other = values_of(load_json_file(dir / "c/results.json"));
  for (const auto& [key, v] : values) EXPECT_NEAR(other.at(key), v, 1e-4 * std::max(1.0, std::abs(v))) << key;
}

TEST(EvalCli, AdapterChangesTheModelScored) {
  const fs::path adapter = assets() / "reference/stories260K/lora_after3";
  SWIFTCPP_REQUIRE_SHARED(adapter);
  const fs::path dir = temp_dir("eval_cli_adapter");
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << read_text_file(source_dir() / "tests/data/sft/alpaca_en_demo.json").substr(0, 4000);
  const std::string base = "--threads 1 eval --model " + stories() + " --tasks perplexity=" + text.string() +
                           " --max-length 128";
  const auto plain = run_cli(base + " --output-dir " + (dir / "base").string());
  ASSERT_EQ(plain.code, 0) << plain.out;
  const auto tuned = run_cli(base + " --adapters " + adapter.string() + " --output-dir " + (dir / "lora").string());
  ASSERT_EQ(tuned.code, 0) << tuned.out;
  const Json with = load_json_file(dir / "lora/results.json");
  EXPECT_EQ(with.at("adapter"), adapter.string());
  const double a = values_of(load_json_file(dir / "base/results.json")).at("perplexity/token_perplexity");
  const double b = values_of(with).at("perplexity/token_perplexity");
  EXPECT_GT(std::abs(a - b), 1e-3 * a) << a << " vs " << b;
}

// --apply-chat-template poses each prompt as one user turn; the choices follow the generation prompt.
TEST(EvalCli, ChatTemplatePrompts) {
  const fs::path data = assets() / "data/eval";
  SWIFTCPP_REQUIRE_SHARED(data);
  const fs::path dir = temp_dir("eval_cli_chat");
  const auto r = run_cli("--threads 1 eval --model " + stories() + " --tasks arc_easy --data-dir " + data.string() +
                         " --limit 2 --apply-chat-template --template chatml --log-samples --output-dir " + dir.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream samples(dir / "samples_arc_easy.jsonl");
  std::string line;
  std::getline(samples, line);
  const std::string prompt = parse_json(line, "sample").at("prompt").get<std::string>();
  EXPECT_EQ(prompt.rfind("<|im_start|>user\nQuestion: ", 0), 0u) << prompt;
  const std::string tail = "\nAnswer:<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_GT(prompt.size(), tail.size());
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail) << prompt;
  EXPECT_EQ(load_json_file(dir / "results.json").at("config").at("chat_template"), "chatml");
  const auto bad = run_cli("eval --model " + stories() + " --tasks arc_easy --data-dir " + data.string() +
                           " --apply-chat-template");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("has no chat template"), std::string::npos) << bad.out;
}

TEST(EvalCli, BadInputExitsWithAClearMessage) {
  const fs::path dir = temp_dir("eval_cli_bad");
  auto run = [&](const std::string& tasks) {
    return run_cli("eval --model " + stories() + " --tasks " + tasks + " --data-dir " + dir.string());
  };
  auto r = run("mmlu,arc_eazy");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unknown task 'arc_eazy'"), std::string::npos) << r.out;
  r = run("hellaswag");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("hellaswag_val.jsonl"), std::string::npos) << r.out;
  fs::create_directories(dir / "mmlu/data/test");
  std::ofstream(dir / "mmlu/data/test/x_test.csv") << "Q?,1,2,3,4,A\n\"Q2?\",1,2,3,A\n";
  r = run("mmlu --num-fewshot 0");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("x_test.csv:2: expected 6 fields"), std::string::npos) << r.out;
  std::ofstream(dir / "arc.jsonl") << R"({"query": "Q", "choices": ["a"], "gold": 3})" << "\n";
  r = run("arc_easy=" + (dir / "arc.jsonl").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("arc.jsonl:1: 'gold' 3 is out of range"), std::string::npos) << r.out;
  r = run_cli("eval --model " + stories() + " --tasks perplexity=" + (dir / "arc.jsonl").string() + " --log-samples");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--log-samples needs --output-dir"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace swiftcpp
