// `swiftcpp bench` end to end on stories260K: the table, bench.json and bench.svg for techniques that run, one that
// the model cannot take (QLoRA: stories260K's 172-wide MLP does not pack), a technique that fails at run time, and
// bad input refused before anything is written.
#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;

// A small SFT recipe on stories260K (`dataset` defaults to 16 Alpaca rows).
fs::path write_recipe(const fs::path& dir, const std::string& dataset = "") {
  const fs::path file = dir / "stories.yaml";
  std::ofstream(file) << "model: " << test::stories_dir().string() << "\n"
                      << "dataset: "
                      << (dataset.empty() ? (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string() + "#16"
                                          : dataset)
                      << "\ntemplate: default\nmax_length: 64\ntruncation_strategy: right\n"
                      << "per_device_train_batch_size: 2\nlora_rank: 2\nlora_dropout: 0.0\nlearning_rate: 1.0e-3\n";
  return file;
}

// The table row of `technique` on stdout, split into its cells.
std::vector<std::string> table_row(const std::string& out, const std::string& technique) {
  const size_t at = out.find("| " + technique + " |");
  if (at == std::string::npos) return {};
  const std::string line = out.substr(at, out.find('\n', at) - at);
  std::vector<std::string> cells;
  size_t start = 1;
  for (size_t bar = line.find(" |", start); bar != std::string::npos; bar = line.find(" |", start)) {
    cells.push_back(line.substr(start + 1, bar - start - 1));
    start = bar + 2;
  }
  return cells;
}

TEST(BenchCli, MeasuresEachTechniqueAndReportsSkippedOnes) {
  const fs::path dir = test::temp_dir("bench_cli");
  const fs::path recipe = write_recipe(dir), out = dir / "report";
  const auto r = run_cli("--threads 1 bench --recipe " + recipe.string() +
                         " --techniques lora,full,packing,gradient_checkpointing,qlora --steps 2 --output " +
                         out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string technique : {"lora", "full", "packing", "gradient_checkpointing"}) {
    const auto cells = table_row(r.out, technique);
    ASSERT_EQ(cells.size(), 9u) << technique << "\n" << r.out;
    EXPECT_EQ(cells[1], "ok") << r.out;
    for (size_t c : {2, 4, 5, 6, 7}) EXPECT_GT(std::stod(cells[c]), 0.0) << technique << " column " << c << "\n" << r.out;
  }
  EXPECT_EQ(table_row(r.out, "lora")[3], "1.00x") << r.out;  // the recipe's own method is the baseline
  const auto qlora = table_row(r.out, "qlora");
  ASSERT_EQ(qlora.size(), 9u) << r.out;
  EXPECT_EQ(qlora[1], "skipped");
  EXPECT_NE(qlora[8].find("172"), std::string::npos) << r.out;  // the layer whose shape does not pack
  EXPECT_NE(r.out.find("steps 2-2 (step 1 is warm-up)"), std::string::npos) << r.out;

  const Json report = load_json_file(out / "bench.json");
  for (const char* key : {"recipe", "steps", "threads", "machine", "swiftcpp_version", "date", "rule", "results"}) {
    EXPECT_TRUE(report.contains(key)) << key;
  }
  EXPECT_EQ(report["steps"], 2);
  EXPECT_EQ(report["threads"], test::test_threads() > 0 ? test::test_threads() : 1);
  ASSERT_EQ(report["results"].size(), 5u);
  for (const auto& row : report["results"]) {
    const bool ok = row["technique"] != "qlora";
    EXPECT_EQ(row["status"], ok ? "ok" : "skipped") << row.dump();
    if (!ok) continue;
    EXPECT_EQ(row["steps"], 2) << row.dump();
    for (const char* key : {"tokens_per_s", "median_step_s", "peak_rss_mib", "peak_tensor_mib", "loss", "wall_s"}) {
      EXPECT_GT(row[key].get<double>(), 0.0) << key << " " << row.dump();
    }
    // The child's log and stderr stay; its checkpoint does not.
    const fs::path run_dir = row["run_dir"].get<std::string>();
    EXPECT_TRUE(fs::exists(run_dir / "logging.jsonl")) << run_dir;
    EXPECT_TRUE(fs::exists(run_dir.parent_path() / "stderr.log")) << run_dir;
    for (const auto& e : fs::directory_iterator(run_dir)) {
      EXPECT_NE(e.path().filename().string().rfind("checkpoint-", 0), 0u) << e.path();
    }
  }
  // gradient checkpointing recomputes activations: the same loss as lora, up to the order of float sums.
  EXPECT_NEAR(report["results"][0]["loss"].get<double>(), report["results"][3]["loss"].get<double>(), 1e-4);

  const std::string svg = read_text_file(out / "bench.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  size_t bars = 0;
  for (size_t p = svg.find("<rect class=\"bar\""); p != std::string::npos; p = svg.find("<rect class=\"bar\"", p + 1)) {
    ++bars;
  }
  EXPECT_EQ(bars, 3u * 4u);  // tokens/s, peak RSS and peak tensors for each technique that ran
}

TEST(BenchCli, ATechniqueThatFailsIsReportedAndTheExitIsNonZero) {
  const fs::path dir = test::temp_dir("bench_cli_failed");
  const fs::path data = dir / "rows.json";
  std::ofstream(data) << "{\"not\": \"an array\"}\n";  // a .json dataset must hold an array: exit 4 in the child
  const fs::path out = dir / "report";
  const auto r = run_cli("--threads 1 bench --recipe " + write_recipe(dir, data.string()).string() +
                         " --techniques lora --steps 1 --output " + out.string());
  EXPECT_EQ(r.code, 1) << r.out;
  const auto row = table_row(r.out, "lora");
  ASSERT_EQ(row.size(), 9u) << r.out;
  EXPECT_EQ(row[1], "failed");
  EXPECT_NE(row[8].find("exit status 4"), std::string::npos) << r.out;
  const Json report = load_json_file(out / "bench.json");  // written all the same
  EXPECT_EQ(report["results"][0]["exit_code"], 4);
  EXPECT_NE(report["results"][0]["stderr_tail"].get<std::string>().find("rows.json"), std::string::npos)
      << report.dump(2);
}

TEST(BenchCli, BadInputIsRefusedBeforeAnythingIsWritten) {
  const fs::path dir = test::temp_dir("bench_cli_bad");
  const std::string recipe = write_recipe(dir).string(), out = (dir / "report").string();
  std::ofstream(dir / "bad.yaml") << "model: [unclosed\n";
  // (arguments after "bench", exit code, what the message says)
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"--recipe " + recipe + " --techniques lora,turbo", 2, "--techniques: unknown technique 'turbo'"},
      {"--recipe " + recipe + " --steps 0", 2, "--steps must be at least 1"},
      {"--recipe " + (dir / "absent.yaml").string(), 3, "absent.yaml"},
      {"--recipe " + (dir / "bad.yaml").string(), 4, "bad.yaml"},
      {"--recipe " + recipe + " lora_rnk=4", 2, "lora_rnk"},
      {"--recipe " + recipe + " max_steps=9", 2, "use --steps"}};
  for (const auto& [args, code, message] : cases) {
    const auto r = run_cli("bench " + args + " --output " + out);
    EXPECT_EQ(r.code, code) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace swiftcpp
