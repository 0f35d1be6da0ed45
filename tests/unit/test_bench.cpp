// `swiftcpp bench`'s library side without training: the technique list, each technique's recipe keys, the plan's
// checks and skips, measurements from a hand-written logging.jsonl, the report JSON, table and chart; and the child
// process helper it runs techniques with (exit status, output, peak memory, stop and timeout).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/process.h"
#include "tests/test_util.h"
#include "train/bench.h"

namespace swiftcpp {
namespace {

bool has(const std::vector<std::string>& v, const std::string& item) {
  return std::find(v.begin(), v.end(), item) != v.end();
}

// A recipe file in `dir` training stories260K on the bundled Alpaca rows, plus `extra` YAML lines.
std::string write_recipe(const fs::path& dir, const std::string& extra = "") {
  const fs::path file = dir / "recipe.yaml";
  std::ofstream(file) << "model: " << test::stories_dir().string() << "\n"
                      << "dataset: " << (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string() << "#8\n"
                      << "template: default\nmax_length: 64\ntruncation_strategy: right\n"
                      << extra;
  return file.string();
}

BenchRequest request_for(const std::string& recipe, const fs::path& out, std::vector<std::string> techniques) {
  BenchRequest r;
  r.recipe = recipe;
  r.techniques = std::move(techniques);
  r.steps = 3;
  r.output_dir = out;
  return r;
}

TEST(BenchPlan, ParsesTechniqueLists) {
  EXPECT_EQ(parse_bench_techniques("lora, full,packing"), (std::vector<std::string>{"lora", "full", "packing"}));
  EXPECT_EQ(bench_techniques().size(), 8u);
  test::expect_error<ConfigError>([] { parse_bench_techniques("lora,lorra"); },
                                  {"--techniques", "unknown technique 'lorra'", "gradient_checkpointing"});
  test::expect_error<ConfigError>([] { parse_bench_techniques("lora,lora"); }, {"--techniques", "'lora' is listed twice"});
  test::expect_error<ConfigError>([] { parse_bench_techniques(" , "); }, {"--techniques is empty"});
}

TEST(BenchPlan, EachTechniqueSetsItsKeysAndTurnsTheOtherFeaturesOff) {
  TrainConfig recipe;  // lora, no features
  const auto lora = bench_technique_overrides("lora", recipe);
  for (const char* key : {"train_type=lora", "use_dora=false", "quant_bits=0", "batching=padding", "packing=false",
                          "bf16=false", "gradient_checkpointing=false"}) {
    EXPECT_TRUE(has(lora, key)) << key;
  }
  EXPECT_TRUE(has(bench_technique_overrides("dora", recipe), "use_dora=true"));
  EXPECT_TRUE(has(bench_technique_overrides("qlora", recipe), "quant_bits=4"));
  recipe.quant_bits = 8;  // the recipe's own bits are kept
  EXPECT_TRUE(has(bench_technique_overrides("qlora", recipe), "quant_bits=8"));
  const auto full = bench_technique_overrides("full", recipe);
  for (const char* key : {"train_type=full", "use_dora=false", "quant_bits=0", "modules_to_save=[]"}) {
    EXPECT_TRUE(has(full, key)) << key;
  }
  // A feature row keeps the recipe's tuning method (no train_type key) and turns only its feature on.
  const std::map<std::string, std::string> feature_on = {{"packing", "batching=packing"},
                                                         {"chunkflow", "batching=chunkflow"},
                                                         {"bf16", "bf16=true"},
                                                         {"gradient_checkpointing", "gradient_checkpointing=true"}};
  for (const auto& [technique, on] : feature_on) {
    const auto keys = bench_technique_overrides(technique, recipe);
    EXPECT_TRUE(has(keys, on)) << technique;
    EXPECT_TRUE(has(keys, "packing=false")) << technique;
    for (const auto& k : keys) EXPECT_NE(k.rfind("train_type=", 0), 0u) << technique << ": " << k;
    EXPECT_EQ(has(keys, "bf16=true"), technique == "bf16");
    EXPECT_EQ(has(keys, "gradient_checkpointing=true"), technique == "gradient_checkpointing");
  }
  EXPECT_THROW(bench_technique_overrides("fast", recipe), ConfigError);
  const auto common = bench_common_overrides(7, "out dir/x");
  for (const char* key : {"max_steps=7", "logging_steps=1", "save_steps=7", "split_dataset_ratio=0", "val_dataset=[]",
                          "output_dir=\"out dir/x\""}) {
    EXPECT_TRUE(has(common, key)) << key;
  }
}

TEST(BenchPlan, BaselineIsTheRecipesOwnMethod) {
  TrainConfig c;
  EXPECT_EQ(bench_baseline(c), "lora");
  c.use_dora = true;
  EXPECT_EQ(bench_baseline(c), "dora");
  c.quant_bits = 4;
  EXPECT_EQ(bench_baseline(c), "qlora");
  c.train_type = "full";
  EXPECT_EQ(bench_baseline(c), "full");
  EXPECT_EQ(bench_default_output("recipes/lora_sft.yaml"), fs::path("output/bench-lora_sft"));
}

TEST(BenchPlan, DecodesEveryRowAndSkipsWhatTheConfigRefuses) {
  const fs::path dir = test::temp_dir("bench_plan");
  // A Skrull scheduler does not combine with ChunkFlow; a bfloat16 base does not take bf16 autocast.
  const std::string recipe = write_recipe(dir, "scheduler: skrull\ntorch_dtype: bfloat16\n");
  const BenchPlan plan = plan_bench(request_for(recipe, dir / "out", {"lora", "chunkflow", "bf16", "full"}));
  EXPECT_EQ(plan.baseline, "lora");
  ASSERT_EQ(plan.rows.size(), 4u);
  EXPECT_EQ(plan.rows[0].status, "pending");
  EXPECT_EQ(plan.rows[1].status, "skipped");
  EXPECT_NE(plan.rows[1].reason.find("scheduler: skrull"), std::string::npos) << plan.rows[1].reason;
  EXPECT_EQ(plan.rows[2].status, "skipped");
  EXPECT_NE(plan.rows[2].reason.find("torch_dtype float32"), std::string::npos) << plan.rows[2].reason;
  EXPECT_EQ(plan.rows[3].status, "pending");
  EXPECT_EQ(plan.rows[3].output_dir, dir / "out" / "runs" / "full");
  EXPECT_EQ(plan.recipe.max_steps, 3);
  EXPECT_FALSE(fs::exists(dir / "out"));  // planning writes nothing
}

TEST(BenchPlan, RefusesBadRequestsBeforeWritingAnything) {
  const fs::path dir = test::temp_dir("bench_plan_bad");
  const std::string recipe = write_recipe(dir);
  const fs::path out = dir / "out";
  auto request = request_for(recipe, out, {"lora"});
  request.steps = 0;
  test::expect_error<ConfigError>([&] { plan_bench(request); }, {"--steps must be at least 1"});
  request.steps = 2;
  request.overrides = {"max_steps=5"};
  test::expect_error<ConfigError>([&] { plan_bench(request); }, {"max_steps=5", "--steps"});
  request.overrides = {"lora_rnk=4"};
  test::expect_error<ConfigError>([&] { plan_bench(request); }, {"lora_rnk", "lora_rank"});
  request.overrides = {"rlhf_type=dpo"};
  test::expect_error<ConfigError>([&] { plan_bench(request); }, {"rlhf_type dpo", "supervised fine-tuning"});
  request.overrides = {"model=" + (dir / "nothing").string()};
  test::expect_error<IoError>([&] { plan_bench(request); }, {"nothing/config.json"});
  request.overrides = {"dataset=" + (dir / "missing.jsonl").string()};
  test::expect_error<IoError>([&] { plan_bench(request); }, {"missing.jsonl"});
  request.overrides = {};
  request.recipe = (dir / "absent.yaml").string();
  test::expect_error<IoError>([&] { plan_bench(request); }, {"absent.yaml"});
  std::ofstream(dir / "bad.yaml") << "model: [unclosed\n";
  request.recipe = (dir / "bad.yaml").string();
  test::expect_error<FormatError>([&] { plan_bench(request); }, {"bad.yaml", "invalid YAML"});
  request.recipe = "";
  test::expect_error<ConfigError>([&] { plan_bench(request); }, {"--recipe is required"});
  EXPECT_FALSE(fs::exists(out));
}

Json step_record(int64_t step, double tokens_per_s, double step_s, double loss, double peak_bytes) {
  return {{"global_step", step}, {"tokens_per_s", tokens_per_s}, {"step_s", step_s}, {"loss", loss},
          {"peak_memory_bytes", peak_bytes}, {"memory_mib", 300.0}};
}

TEST(BenchReport, MeasuresFromTheLogLeavingOutTheWarmUpStep) {
  Json records = Json::array();
  records.push_back({{"global_step", 0}, {"eval_loss", 5.0}});           // validation: ignored
  records.push_back(step_record(1, 10, 4.0, 3.0, 8 << 20));              // warm-up: 40 tokens in 4 s
  records.push_back(step_record(2, 100, 0.5, 2.5, 2 << 20));             // 50 tokens
  records.push_back({{"global_step", 3}, {"skipped", true}, {"reason", "loss nan"}});  // ignored
  records.push_back(step_record(3, 150, 1.0, 2.25, 3 << 20));            // 150 tokens
  records.push_back(step_record(4, 100, 2.0, 2.0, 1 << 20));             // 200 tokens
  BenchRow row;
  measure_bench_row(row, records);
  EXPECT_EQ(row.steps, 4);
  EXPECT_TRUE(row.warmup_excluded);
  EXPECT_DOUBLE_EQ(row.tokens_per_s, 400.0 / 3.5);
  EXPECT_DOUBLE_EQ(row.median_step_s, 1.0);
  EXPECT_DOUBLE_EQ(row.peak_tensor_mib, 8.0);
  EXPECT_DOUBLE_EQ(row.loss, 2.0);
  EXPECT_TRUE(row.note.empty()) << row.note;
  // A stalled step is pointed out.
  records.push_back(step_record(5, 10, 10.0, 1.9, 1 << 20));
  BenchRow stalled;
  measure_bench_row(stalled, records);
  EXPECT_DOUBLE_EQ(stalled.median_step_s, 1.5);
  EXPECT_NE(stalled.note.find("step 5 took 10.00 s, 7x the median"), std::string::npos) << stalled.note;
  // One step: measured over it, warm-up included.
  BenchRow one;
  measure_bench_row(one, Json::array({step_record(1, 10, 4.0, 3.0, 1 << 20)}));
  EXPECT_FALSE(one.warmup_excluded);
  EXPECT_DOUBLE_EQ(one.tokens_per_s, 10.0);
  EXPECT_DOUBLE_EQ(one.median_step_s, 4.0);
  BenchRow none;
  measure_bench_row(none, Json::array());
  EXPECT_EQ(none.steps, 0);
  EXPECT_TRUE(std::isnan(none.tokens_per_s));
}

BenchPlan report_plan() {
  BenchPlan plan;
  plan.recipe.model = "models/stories260K";
  plan.baseline = "lora";
  BenchRow lora;
  lora.technique = "lora";
  lora.status = "ok";
  lora.exit_code = 0;
  lora.overrides = {"train_type=lora"};
  lora.steps = 3;
  lora.warmup_excluded = true;
  lora.tokens_per_s = 200;
  lora.median_step_s = 0.25;
  lora.peak_rss_mib = 300;
  lora.peak_tensor_mib = 12.5;
  lora.loss = 2.5;
  lora.wall_s = 3;
  BenchRow packing = lora;
  packing.technique = "packing";
  packing.tokens_per_s = 300;
  BenchRow qlora;
  qlora.technique = "qlora";
  qlora.status = "skipped";
  qlora.reason = "down_proj: group size 64 does not divide | its 172 input columns";
  BenchRow full;
  full.technique = "full";
  full.status = "failed";
  full.exit_code = 1;
  full.reason = "exit status 1: step 2: loss is nan";
  full.stderr_tail = "line\nswiftcpp: error: step 2: loss is nan";
  plan.rows = {lora, packing, qlora, full};
  return plan;
}

TEST(BenchReport, JsonHasTheSettingsAndEveryRow) {
  BenchRequest request = request_for("r.yaml", "out", {"lora", "packing", "qlora", "full"});
  BenchMachine machine{"Test CPU", 2, true, 1, "2025-01-01T00:00:00Z", {"swiftcpp", "bench"}};
  const Json j = bench_report_json(request, report_plan(), machine);
  for (const char* key : {"recipe", "overrides", "techniques", "steps", "baseline", "model", "train_type", "device",
                          "threads", "machine", "swiftcpp_version", "date", "command_line", "rule", "results"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["machine"]["cpu"], "Test CPU");
  EXPECT_EQ(j["steps"], 3);
  ASSERT_EQ(j["results"].size(), 4u);
  const Json& packing = j["results"][1];
  EXPECT_EQ(packing["status"], "ok");
  EXPECT_DOUBLE_EQ(packing["speed_vs_baseline"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(packing["tokens_per_s"].get<double>(), 300);
  const Json& qlora = j["results"][2];
  EXPECT_EQ(qlora["status"], "skipped");
  EXPECT_TRUE(qlora["tokens_per_s"].is_null());
  EXPECT_TRUE(qlora["exit_code"].is_null());
  EXPECT_NE(qlora["reason"].get<std::string>().find("does not divide"), std::string::npos);
  const Json& full = j["results"][3];
  EXPECT_EQ(full["exit_code"], 1);
  EXPECT_NE(full["stderr_tail"].get<std::string>().find("loss is nan"), std::string::npos);
}

TEST(BenchReport, TableAndChartHaveARowPerTechnique) {
  BenchRequest request = request_for("r.yaml", "out", {"lora", "packing", "qlora", "full"});
  BenchMachine machine{"Test CPU", 2, true, 1, "2025-01-01T00:00:00Z", {}};
  const BenchPlan plan = report_plan();
  const std::string table = bench_table(request, plan, machine);
  EXPECT_NE(table.find("| lora | ok | 200.0 | 1.00x | 0.250 | 300 | 12.5 | 2.5000 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| packing | ok | 300.0 | 1.50x |"), std::string::npos) << table;
  // A reason's '|' is escaped so that it stays one cell.
  EXPECT_NE(table.find("| qlora | skipped | - | - | - | - | - | - | down_proj: group size 64 does not divide \\| its"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| full | failed |"), std::string::npos) << table;
  EXPECT_NE(table.find("steps 2-3 (step 1 is warm-up)"), std::string::npos) << table;
  EXPECT_NE(table.find("| vs lora |"), std::string::npos) << table;
  const std::string svg = bench_chart_svg(request, plan);
  size_t bars = 0;
  for (size_t p = svg.find("class=\"bar\""); p != std::string::npos; p = svg.find("class=\"bar\"", p + 1)) ++bars;
  EXPECT_EQ(bars, 3u * 2u);  // three panels, two techniques that ran
  EXPECT_NE(svg.find("qlora (skipped)"), std::string::npos);
}

TEST(BenchProcess, RunsAProgramAndCollectsItsResults) {
  const ProcessResult r = run_process({"/bin/sh", "-c", "read x; echo out $x; echo err >&2; exit 3"}, {"hello\n"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out hello\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_GT(r.peak_rss_bytes, 0);
  EXPECT_GT(r.seconds, 0.0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(run_process({"/nonexistent/program"}).exit_code, 127);
  const ProcessResult slow = run_process({"/bin/sleep", "10"}, {"", 0.2, nullptr});
  EXPECT_TRUE(slow.timed_out);
  EXPECT_LT(slow.seconds, 5.0);
  EXPECT_EQ(run_command("exit 4", "", 10).exit_code, 4);
  // Output past the limit stops the child (and what it started) and keeps exactly the limit.
  const ProcessResult chatty = run_command("yes | cat", "", 30, 100000);
  EXPECT_TRUE(chatty.output_exceeded);
  EXPECT_FALSE(chatty.timed_out);
  EXPECT_EQ(chatty.out.size(), 100000u);
  EXPECT_FALSE(run_command("echo fine", "", 10, 100000).output_exceeded);
}

TEST(BenchProcess, StopSendsSigintToTheChild) {
  std::atomic<bool> stop{false};
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
  });
  ProcessOptions options;
  options.stop = &stop;
  const ProcessResult r = run_process({"/bin/sh", "-c", "sleep 10 >/dev/null 2>&1 & trap 'kill $!; echo stopped; exit 130' INT; wait"}, options);
  later.join();
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_EQ(r.out, "stopped\n");
  EXPECT_LT(r.seconds, 5.0);
}

TEST(BenchProcess, LastLines) {
  EXPECT_EQ(last_lines("a\nb\nc\n", 2), "b\nc");
  EXPECT_EQ(last_lines("a\nb\nc", 1), "c");
  EXPECT_EQ(last_lines("a\nb", 5), "a\nb");
  EXPECT_EQ(last_lines("a\n\nb\n", 2), "\nb");
  EXPECT_EQ(last_lines("", 3), "");
  EXPECT_EQ(last_lines("abc", 0), "");
}

}  // namespace
}  // namespace swiftcpp
