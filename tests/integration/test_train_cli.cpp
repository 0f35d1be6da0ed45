// `swiftcpp train` end to end: outputs, exact resume after SIGTERM and after a hard kill, refused resumes, bad
// recipes, `infer --adapters` and `export --merge-lora`.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <fstream>
#include <regex>

#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;
using test::source_dir;
using test::stories_dir;

// A small but real run: 48 Alpaca rows, shuffled, with LoRA dropout (so RNG state matters on resume). One thread:
// ctest runs two tests at once on two cores, and spinning OpenMP threads on a shared core slow tiny steps 10x.
std::string train_args(const fs::path& out, const std::string& extra = "") {
  return fmt::format(
      "--threads 1 train model={} dataset={}#48 output_dir={} template=default max_length=128 truncation_strategy=right "
      "per_device_train_batch_size=2 gradient_accumulation_steps=2 max_steps=8 save_steps=3 logging_steps=1 "
      "eval_steps=4 split_dataset_ratio=0.1 lora_rank=4 lora_alpha=8 lora_dropout=0.1 learning_rate=3e-3 "
      "warmup_steps=2 seed=7 save_total_limit=2 {}",
      stories_dir().string(), (source_dir() / "tests/data/sft/alpaca_en_demo.json").string(), out.string(), extra);
}

fs::path only_run_dir(const fs::path& out) {
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.is_directory() && e.path().filename().string().rfind("v", 0) == 0) runs.push_back(e.path());
  }
  EXPECT_EQ(runs.size(), 1u);
  return runs.empty() ? fs::path() : runs[0];
}

// "step: loss" of every training record of logging.jsonl, as logged (exact text of the double). Compared exactly only
// between runs of one configuration at one thread count: a resumed run repeats the uninterrupted run's operations in
// the same order (that is what exact resume promises), so even thread-split sums round the same way.
std::vector<std::string> logged_losses(const fs::path& run_dir) {
  std::vector<std::string> out;
  std::ifstream in(run_dir / "logging.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line);
    if (j.contains("loss")) out.push_back(fmt::format("{}: {}", j["global_step"].get<int64_t>(), j["loss"].dump()));
    if (j.contains("eval_loss")) out.push_back(fmt::format("{}: eval {}", j["global_step"].get<int64_t>(), j["eval_loss"].dump()));
  }
  return out;
}

// Starts `swiftcpp train`, waits until checkpoint-3 exists, then sends `signal`; returns the exit code.
int run_and_signal(const fs::path& out, const std::string& signal, const std::string& extra = "") {
  return test::run_cli_until_checkpoint(train_args(out, extra), out, "checkpoint-3", signal);
}

TEST(TrainCli, WritesTheRunFolderAndResumesExactlyAfterSigtermAndHardKill) {
  const fs::path base = test::temp_dir("train_cli");
  // The uninterrupted run.
  const fs::path straight = base / "straight";
  const auto r = run_cli(train_args(straight));
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path run = only_run_dir(straight);
  for (const char* f : {"args.json", "logging.jsonl", "images/train_loss.svg", "checkpoint-8/adapter_model.safetensors",
                        "checkpoint-8/adapter_config.json", "checkpoint-8/optimizer.safetensors",
                        "checkpoint-8/rng_state.safetensors", "checkpoint-8/trainer_state.json", "checkpoint-6"}) {
    EXPECT_TRUE(fs::exists(run / f)) << f;
  }
  EXPECT_FALSE(fs::exists(run / "checkpoint-3"));  // save_total_limit=2 keeps checkpoint-6 and checkpoint-8
  const Json args = load_json_file(run / "args.json");
  EXPECT_EQ(args["lora_rank"], 4);
  const std::vector<std::string> expected = logged_losses(run);
  ASSERT_EQ(std::count_if(expected.begin(), expected.end(), [](const std::string& s) { return s.find("eval") == std::string::npos; }), 8);
  {
    std::ifstream in(run / "logging.jsonl");
    std::string line;
    std::getline(in, line);
    std::getline(in, line);  // the first training record (after the step-0 eval)
    const Json j = Json::parse(line);
    for (const char* key : {"loss", "grad_norm", "learning_rate", "token_acc", "epoch", "global_step", "tokens_per_s",
                            "memory_mib", "elapsed_time", "remaining_time"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
  }

  for (const std::string signal : {"TERM", "KILL"}) {
    SCOPED_TRACE(signal);
    const fs::path out = base / signal;
    const int code = run_and_signal(out, signal);
    if (signal == "TERM") {
      // The child's own output, so that an unexpected exit (once seen: 134, SIGABRT) says what happened.
      std::ifstream log(out / "log.txt");
      const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      EXPECT_EQ(code, 143) << "child output:\n" << text;
    }
    // The signal came before the end: the run stopped short of step 8.
    ASSERT_FALSE(fs::exists(only_run_dir(out) / "checkpoint-8")) << "the run finished before the signal";
    const auto resumed = run_cli(train_args(out, "resume_from_checkpoint=latest"));
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
    EXPECT_EQ(logged_losses(only_run_dir(out)), expected);
  }
}

// ChunkFlow end to end: the same losses as padded batches (no dropout), peak memory in the log, and an exact
// resume after SIGTERM. With max_length 128 and chunk_size 32 the longer samples become up to 4 dependent chunks.
TEST(TrainCli, ChunkFlowTrainsLikePaddingAndResumesExactly) {
  const fs::path base = test::temp_dir("train_cli_chunkflow");
  const std::string common = "lora_dropout=0 eval_steps=100";
  const auto padded = run_cli(train_args(base / "padded", common));
  ASSERT_EQ(padded.code, 0) << padded.out;
  const std::string chunkflow = common + " batching=chunkflow chunk_size=32 chunk_keep=1";
  const auto straight = run_cli(train_args(base / "straight", chunkflow));
  ASSERT_EQ(straight.code, 0) << straight.out;
  EXPECT_NE(straight.out.find("ChunkFlow chunks of 32 tokens keeping 1"), std::string::npos) << straight.out;
  const auto records = [](const fs::path& run) {
    std::vector<Json> out;
    std::ifstream in(run / "logging.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const Json j = Json::parse(line);
      if (j.contains("loss")) out.push_back(j);
    }
    return out;
  };
  const auto a = records(only_run_dir(base / "padded")), b = records(only_run_dir(base / "straight"));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i]["loss"].get<double>(), y = b[i]["loss"].get<double>();
    EXPECT_NEAR(x, y, 1e-4 * x) << "step " << i + 1;
    EXPECT_GT(b[i]["peak_memory_bytes"].get<int64_t>(), 0);
  }
  const fs::path out = base / "TERM";
  EXPECT_EQ(run_and_signal(out, "TERM", chunkflow), 143);
  ASSERT_FALSE(fs::exists(only_run_dir(out) / "checkpoint-8")) << "the run finished before the signal";
  const auto resumed = run_cli(train_args(out, chunkflow + " resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(logged_losses(only_run_dir(out)), logged_losses(only_run_dir(base / "straight")));
  // A checkpoint of the ChunkFlow run does not resume as a padded run.
  const auto refused = run_cli(train_args(out, common + " resume_from_checkpoint=latest"));
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("batching"), std::string::npos) << refused.out;
}

TEST(TrainCli, TuneChunksTimesTheGridAndRecommendsAFittingPair) {
  const fs::path base = test::temp_dir("train_cli_tune");
  const auto r = run_cli(train_args(base, "--tune-chunks --tune-budget 128 --tune-steps 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* row : {"| 128 | 1 |", "| 64 | 2 |", "recommended: batching=chunkflow chunk_size="}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " in\n" << r.out;
  }
  EXPECT_EQ(r.out.find("| 32 | 4 |"), std::string::npos) << r.out;  // below the smallest chunk size tried
  EXPECT_TRUE(fs::is_empty(base)) << "the temporary runs were not removed";
  const auto none = run_cli(train_args(base, "--tune-chunks --tune-budget 128 --tune-steps 2 --memory-limit-mib 0.001"));
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("fits 0.001 MiB"), std::string::npos) << none.out;
}

TEST(TrainCli, RefusesACheckpointOfAnotherSetupAndBadRecipes) {
  const fs::path out = test::temp_dir("train_refuse");
  ASSERT_EQ(run_cli(train_args(out, "max_steps=3")).code, 0);
  const auto other = run_cli(train_args(out, "max_steps=3 lora_rank=8 resume_from_checkpoint=latest"));
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find("different setup"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("lora"), std::string::npos) << other.out;

  const fs::path recipe = out / "bad.yaml";
  std::ofstream(recipe) << "model: " << stories_dir().string() << "\ndataset: x.jsonl\nlora_rnk: 8\n";
  const auto bad = run_cli("--threads 1 train --recipe " + recipe.string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("bad.yaml:3"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("lora_rank"), std::string::npos) << bad.out;
  const auto missing = run_cli(train_args(out, "dataset=/nonexistent/data.jsonl"));
  EXPECT_EQ(missing.code, 3) << missing.out;
  EXPECT_NE(missing.out.find("/nonexistent/data.jsonl"), std::string::npos) << missing.out;
}

TEST(TrainCli, InferWithAdaptersEqualsTheMergedExport) {
  const fs::path out = test::temp_dir("train_export");
  const auto r = run_cli(train_args(out, "max_steps=4 lora_dropout=0"));
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path checkpoint = only_run_dir(out) / "checkpoint-4";
  const std::string prompt = "--prompt 'Once upon a time' --max-new-tokens 8 --temperature 0 --template raw";
  const auto base = run_cli(fmt::format("infer --model {} {} --output-logits {}/base.safetensors", stories_dir().string(),
                                        prompt, out.string()));
  ASSERT_EQ(base.code, 0) << base.out;
  const auto adapted = run_cli(fmt::format("infer --model {} --adapters {} {} --output-logits {}/adapted.safetensors",
                                           stories_dir().string(), checkpoint.string(), prompt, out.string()));
  ASSERT_EQ(adapted.code, 0) << adapted.out;
  const auto exported = run_cli(fmt::format("export --model {} --adapters {} --merge-lora --output {}/merged",
                                            stories_dir().string(), checkpoint.string(), out.string()));
  ASSERT_EQ(exported.code, 0) << exported.out;
  EXPECT_TRUE(fs::exists(out / "merged" / "config.json"));
  EXPECT_TRUE(fs::exists(out / "merged" / "tokenizer.model"));
  const auto merged = run_cli(fmt::format("infer --model {}/merged {} --output-logits {}/merged.safetensors", out.string(),
                                          prompt, out.string()));
  ASSERT_EQ(merged.code, 0) << merged.out;
  const auto logits = [&](const std::string& name) {
    return SafetensorsFile::open(out / (name + ".safetensors"))->tensor("logits").to(at::kDouble);
  };
  const at::Tensor a = logits("adapted"), m = logits("merged"), b = logits("base");
  const double scale = a.abs().max().item<double>();
  const double diff = (a - m).abs().max().item<double>();
  std::cout << "[export] merged vs adapter logits: max |diff| " << diff << " (|logits| <= " << scale << ")" << std::endl;
  EXPECT_LT(diff / scale, 1e-5);
  EXPECT_GT((a - b).abs().max().item<double>(), 1e-3);  // the adapter changed the model
  // An existing output folder is not overwritten by accident.
  const auto again = run_cli(fmt::format("export --model {} --output {}/merged", stories_dir().string(), out.string()));
  EXPECT_EQ(again.code, 2) << again.out;
}

}  // namespace
}  // namespace swiftcpp
