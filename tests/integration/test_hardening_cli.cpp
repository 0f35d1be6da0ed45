// The binary on hostile models and settings: NaN/Inf weights are reported by every command that loads them, a
// NaN training loss stops the run without a checkpoint (or is skipped when the recipe says so), NaN options are
// refused, and lengths beyond the model's context are cut or refused with a clear message.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;
using test::source_dir;
using test::stories_dir;

const char* kNanTensor = "model.layers.2.self_attn.v_proj.weight";

// A copy of stories260K with a NaN in kNanTensor (built once per process, in a folder of the process's own: ctest -j
// runs the tests that use it side by side, and a shared folder was rewritten under another's feet).
fs::path nan_stories() {
  static const fs::path dir = [] {
    const fs::path d = test::temp_dir("hardening_cli_nan_model_" + std::to_string(::getpid()));
    for (const auto& e : fs::directory_iterator(stories_dir())) {
      if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), d / e.path().filename());
    }
    const Checkpoint source = Checkpoint::open(stories_dir());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& n : source.names()) {
      at::Tensor t = source.tensor(n).clone();
      if (n == kNanTensor) t.view({-1})[5] = std::nan("");
      tensors.emplace_back(n, t);
    }
    save_safetensors(d / "model.safetensors", tensors);
    return d;
  }();
  return dir;
}

std::string alpaca(int rows) {
  return (source_dir() / "tests/data/sft/alpaca_en_demo.json").string() + "#" + std::to_string(rows);
}

void expect_nan_warning(const test::CliRun& r) {
  EXPECT_NE(r.out.find("swiftcpp: warning: " + nan_stories().string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(kNanTensor), std::string::npos) << r.out;
}

TEST(HardeningCli, NanWeightsAreReportedByInferExportQuantizeAndEval) {
  const fs::path model = nan_stories();
  const fs::path dir = test::temp_dir("hardening_cli_nan_commands");
  const auto infer = run_cli("--threads 1 infer --model " + model.string() +
                             " --prompt Tom --max-new-tokens 2 --temperature 0 --template raw");
  EXPECT_EQ(infer.code, 0) << infer.out;
  expect_nan_warning(infer);
  const auto exported = run_cli("--threads 1 export --model " + model.string() + " --output " + (dir / "hf").string());
  EXPECT_EQ(exported.code, 0) << exported.out;
  expect_nan_warning(exported);
  // stories260K's 172 MLP rows do not pack into int32 words, so quantize refuses it; the warning comes first, at load.
  const auto quantized = run_cli("--threads 1 quantize --model " + model.string() + " --output " + (dir / "q").string());
  expect_nan_warning(quantized);
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << "Once upon a time there was a little girl named Lily. She liked to play outside.\n";
  const auto evaluated = run_cli("--threads 1 eval --model " + model.string() + " --tasks perplexity=" + text.string() +
                                 " --max-length 64");
  expect_nan_warning(evaluated);
  // The clean model says nothing of the kind.
  const auto clean = run_cli("--threads 1 infer --model " + stories_dir().string() +
                             " --prompt Tom --max-new-tokens 2 --temperature 0 --template raw");
  EXPECT_EQ(clean.code, 0) << clean.out;
  EXPECT_EQ(clean.out.find("NaN"), std::string::npos) << clean.out;
}

std::string train_args(const fs::path& model, const fs::path& out, const std::string& extra) {
  return fmt::format("--threads 1 train model={} dataset={} output_dir={} template=default max_length=64 "
                     "truncation_strategy=right max_steps=3 save_steps=1 logging_steps=1 lora_rank=2 {}",
                     model.string(), alpaca(6), out.string(), extra);
}

std::vector<fs::path> checkpoints_under(const fs::path& out) {
  std::vector<fs::path> found;
  if (!fs::exists(out)) return found;
  for (const auto& e : fs::recursive_directory_iterator(out)) {
    if (e.is_directory() && e.path().filename().string().rfind("checkpoint", 0) == 0) found.push_back(e.path());
  }
  return found;
}

TEST(HardeningCli, NanLossStopsTrainingNamingTheStepWithoutACheckpoint) {
  const fs::path out = test::temp_dir("hardening_cli_nan_train");
  const auto r = run_cli(train_args(nan_stories(), out, ""));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 1: the training loss is nan"), std::string::npos) << r.out;
  expect_nan_warning(r);
  EXPECT_TRUE(checkpoints_under(out).empty()) << r.out;
}

TEST(HardeningCli, SkipNonfiniteLossLogsEverySkippedStep) {
  const fs::path out = test::temp_dir("hardening_cli_nan_skip");
  const auto r = run_cli(train_args(nan_stories(), out, "skip_nonfinite_loss=true"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped (skip_nonfinite_loss)"), std::string::npos) << r.out;
  int skipped = 0;
  for (const auto& e : fs::recursive_directory_iterator(out)) {
    if (e.path().filename() != "logging.jsonl") continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      const Json j = Json::parse(line);
      if (j.value("skipped", false)) ++skipped;
      EXPECT_FALSE(j.contains("loss") && !j["loss"].is_number()) << line;
    }
  }
  EXPECT_EQ(skipped, 3);
}

TEST(HardeningCli, NanAndInfOptionsAreRefused) {
  const std::string model = stories_dir().string();
  const auto temperature = run_cli("infer --model " + model + " --prompt Tom --max-new-tokens 2 --temperature nan");
  EXPECT_EQ(temperature.code, 2) << temperature.out;
  EXPECT_NE(temperature.out.find("temperature must be a finite number"), std::string::npos) << temperature.out;
  const auto penalty = run_cli("infer --model " + model + " --prompt Tom --max-new-tokens 2 --repetition-penalty inf");
  EXPECT_EQ(penalty.code, 2) << penalty.out;
  EXPECT_NE(penalty.out.find("repetition_penalty"), std::string::npos) << penalty.out;
  const fs::path dir = test::temp_dir("hardening_cli_nan_options");
  const auto damp = run_cli("quantize --model " + model + " --method gptq --calib-dataset " + alpaca(4) +
                            " --damp-percent nan --output " + (dir / "q").string());
  EXPECT_EQ(damp.code, 2) << damp.out;
  EXPECT_NE(damp.out.find("--damp-percent must be in (0, 1)"), std::string::npos) << damp.out;
  const auto ratio = run_cli("data inspect --model " + model + " --dataset " + alpaca(4) +
                             " --split-dataset-ratio nan --show 0");
  EXPECT_EQ(ratio.code, 2) << ratio.out;
  EXPECT_NE(ratio.out.find("split_dataset_ratio"), std::string::npos) << ratio.out;
  const auto recipe = run_cli("train model=" + model + " dataset=" + alpaca(4) + " max_grad_norm=.inf");
  EXPECT_EQ(recipe.code, 2) << recipe.out;
  EXPECT_NE(recipe.out.find("'max_grad_norm' must be a finite number"), std::string::npos) << recipe.out;
}

// Global options after the subcommand, and usage errors (a value outside an option's range, an unknown option, no
// subcommand) in the program's own form and exit code.
TEST(HardeningCli, GlobalOptionsFollowTheSubcommandAndUsageErrorsAreTheProgramsOwn) {
  const std::string model = stories_dir().string();
  const auto after = run_cli("infer --model " + model + " --prompt Tom --max-new-tokens 2 --threads 1");
  EXPECT_EQ(after.code, 0) << after.out;
  const auto range = run_cli("--threads 1 infer --model " + model + " --prompt Tom --max-pixels 0");
  EXPECT_EQ(range.code, 2) << range.out;
  EXPECT_NE(range.out.find("swiftcpp: error: --max-pixels"), std::string::npos) << range.out;
  const auto unknown = run_cli("--threads 1 infer --model " + model + " --prompt Tom --no-such-option");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("swiftcpp: error:"), std::string::npos) << unknown.out;
  EXPECT_NE(unknown.out.find("--no-such-option"), std::string::npos) << unknown.out;
  const auto none = run_cli("--threads 1");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("swiftcpp: error:"), std::string::npos) << none.out;
  const auto help = run_cli("infer --help");
  EXPECT_EQ(help.code, 0) << help.out;
  EXPECT_NE(help.out.find("--max-pixels"), std::string::npos) << help.out;
}

TEST(HardeningCli, LengthsAreHeldToTheModelsContext) {
  const std::string model = stories_dir().string();
  // 512 positions: the new tokens stop where prompt + new tokens reach 512, with a warning saying so.
  const auto infer = run_cli("--threads 1 infer --model " + model +
                             " --prompt 'Once upon a time' --max-new-tokens 100000 --temperature 0 --ignore-eos "
                             "--template raw --no-stream");
  EXPECT_EQ(infer.code, 0) << infer.out;
  EXPECT_NE(infer.out.find("swiftcpp: warning: max_new_tokens 100000 does not fit the model's context of 512"),
            std::string::npos)
      << infer.out;
  const fs::path dir = test::temp_dir("hardening_cli_lengths");
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << "Once upon a time there was a little girl named Lily.\n";
  const auto eval = run_cli("--threads 1 eval --model " + model + " --tasks perplexity=" + text.string() +
                            " --max-length 100000");
  EXPECT_EQ(eval.code, 2) << eval.out;
  EXPECT_NE(eval.out.find("max length 100000 exceeds the model's context of 512 positions"), std::string::npos)
      << eval.out;
}

}  // namespace
}  // namespace swiftcpp
