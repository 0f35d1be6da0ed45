// The swiftcpp binary end to end: greedy text, batched prompts files, logits output, stop options, the BLAS
// warning and the exit codes and messages of bad input.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>

#include "core/fs.h"
#include "data/encode.h"
#include "io/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::source_dir;
using test::stories_dir;
using test::CliRun;
using test::run_cli;

TEST(InferCli, GreedyTextFromEmptyPrompt) {
  const std::string expected = read_text_file(source_dir() / "tests/data/stories260K_expected_greedy_t0_n200.txt");
  const auto out_file = test::temp_dir("cli_greedy") / "out.txt";
  const std::string cmd = std::string(SWIFTCPP_BINARY) + " infer --model " + stories_dir().string() +
                          " --prompt '' --temperature 0 --max-new-tokens 200 > " + out_file.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(read_text_file(out_file), expected + "\n");
}

TEST(InferCli, PromptsFileAndLogitsOutput) {
  const auto dir = test::temp_dir("cli_batch");
  write_file_atomic(dir / "in.jsonl", "{\"id\": 1, \"prompt\": \"Once upon a time\"}\n\n{\"prompt\": \"The dog\"}\n");
  CliRun r = run_cli("infer --model " + stories_dir().string() + " --prompts-file " + (dir / "in.jsonl").string() +
              " --output " + (dir / "out.jsonl").string() + " --temperature 0 --max-new-tokens 20 --batch-size 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string out = read_text_file(dir / "out.jsonl");
  EXPECT_NE(out.find("\"id\":1"), std::string::npos) << out;
  EXPECT_NE(out.find("\"response\":\", there was a little girl named Lily."), std::string::npos) << out;
  r = run_cli("infer --model " + stories_dir().string() + " --prompt 'Once upon a time' --max-new-tokens 1 --output-logits " +
          (dir / "logits.safetensors").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto file = SafetensorsFile::open(dir / "logits.safetensors");
  EXPECT_EQ(file->info("logits").shape, (std::vector<int64_t>{5, 512}));
  // One rule for every writer: an existing output (a file, a link, even a dangling one) is refused without
  // --overwrite, and nothing is written through a link.
  const std::string logits_run = "infer --model " + stories_dir().string() + " --prompt 'The dog' --max-new-tokens 1 "
                                 "--output-logits ";
  r = run_cli(logits_run + (dir / "logits.safetensors").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--output-logits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(SafetensorsFile::open(dir / "logits.safetensors")->info("logits").shape, (std::vector<int64_t>{5, 512}));
  write_file_atomic(dir / "target.txt", "keep me");
  fs::create_symlink(dir / "target.txt", dir / "link.safetensors");
  fs::create_symlink(dir / "nowhere", dir / "dangling.safetensors");
  for (const char* name : {"link.safetensors", "dangling.safetensors", "out.jsonl"}) {
    const std::string flag = std::string(name) == "out.jsonl" ? "--output" : "--output-logits";
    r = flag == "--output" ? run_cli("infer --model " + stories_dir().string() + " --prompts-file " +
                                     (dir / "in.jsonl").string() + " --output " + (dir / name).string())
                           : run_cli(logits_run + (dir / name).string());
    EXPECT_NE(r.code, 0) << name;
    EXPECT_NE(r.out.find("exists (pass --overwrite"), std::string::npos) << name << ": " << r.out;
  }
  EXPECT_EQ(read_text_file(dir / "target.txt"), "keep me");
  r = run_cli(logits_run + (dir / "link.safetensors").string() + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::is_symlink(dir / "link.safetensors"));  // the link itself was replaced
  EXPECT_EQ(read_text_file(dir / "target.txt"), "keep me");
  EXPECT_EQ(SafetensorsFile::open(dir / "link.safetensors")->info("logits").shape, (std::vector<int64_t>{4, 512}));
}

TEST(InferCli, RepeatedStopOptionsWithEscapes) {
  const auto out_file = test::temp_dir("cli_stop") / "out.txt";
  const std::string cmd = std::string(SWIFTCPP_BINARY) + " infer --model " + stories_dir().string() +
                          " --prompt 'Once upon a time' --temperature 0 --stop '\\n' --stop park --no-stream > " +
                          out_file.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(read_text_file(out_file), ", there was a little girl named Lily. She loved to play outside in the \n");
}

// With the reference BLAS forced in front of OpenBLAS, the binary says so at start-up; with OpenBLAS it is quiet.
TEST(InferCli, WarnsWhenOnlyTheReferenceBlasIsLoaded) {
  const fs::path reference = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  if (!fs::exists(reference)) GTEST_SKIP() << "skipped: " << reference << " (Debian libblas3) is not installed";
  const std::string args = " infer --model " + stories_dir().string() + " --prompt Tom --max-new-tokens 2";
  CliRun r = run_cli(args);
  EXPECT_EQ(r.out.find("reference BLAS"), std::string::npos) << r.out;
  r = run_cli(args, "LD_PRELOAD=" + reference.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: only the reference BLAS is loaded"), std::string::npos) << r.out;
}

// A stories260K copy whose tokenizer knows ChatML's markers (as added tokens 3 and 4).
fs::path chatml_model(const std::string& name) {
  const fs::path dir = test::temp_dir(name);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "generation_config.json"}) {
    fs::copy_file(stories_dir() / f, dir / f);
  }
  write_file_atomic(dir / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": "<s>", "eos_token": "<|im_end|>",
    "added_tokens_decoder": {"3": {"content": "<|im_start|>", "special": true}, "4": {"content": "<|im_end|>", "special": true}}})");
  return dir;
}

// infer renders prompts with the same code the trainer uses: the prompt ids equal SampleEncoder::encode_prompt.
TEST(InferCli, ChatTemplatePromptsUseTheTrainingEncoder) {
  const fs::path model = chatml_model("cli_chat");
  const fs::path logits = model / "logits.safetensors";
  CliRun r = run_cli("infer --model " + model.string() + " --template chatml --system 'Be kind.' --prompt 'Hi there' "
                     "--max-new-tokens 2 --output-logits " + logits.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto tok = load_tokenizer(model);
  SampleEncoder enc(tok, chat_template_for(*tok, "chatml"), {});
  const std::vector<int> expected =
      enc.encode_prompt({{"system", "Be kind.", std::nullopt}, {"user", "Hi there", std::nullopt}});
  const at::Tensor ids = SafetensorsFile::open(logits)->tensor("input_ids");
  EXPECT_EQ(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()),
            std::vector<int64_t>(expected.begin(), expected.end()));
  EXPECT_EQ(tok->decode_with_special_tokens(expected),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  r = run_cli("infer --model " + stories_dir().string() + " --system x --prompt hi");
  EXPECT_EQ(r.code, 2) << r.out;  // no chat template to put a system prompt in
}

TEST(DataCli, InspectMarksTrainedTextAndCountsSkips) {
  const fs::path alpaca = test::assets() / "data/sft/alpaca_en_demo.json";
  SWIFTCPP_REQUIRE_SHARED(alpaca);
  CliRun r = run_cli("data inspect --model " + stories_dir().string() + " --dataset " + alpaca.string() +
                     "#40 --max-length 256");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rows read 40"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("«"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("longer than max_length"), std::string::npos) << r.out;
  const fs::path dir = test::temp_dir("cli_data_bad");
  write_file_atomic(dir / "d.jsonl", "{\"query\": \"a\", \"response\": \"b\"}\n{\"query\": \"a\"}\n");
  r = run_cli("data inspect --model " + stories_dir().string() + " --dataset " + (dir / "d.jsonl").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("d.jsonl:2: no assistant turn"), std::string::npos) << r.out;
  r = run_cli("data inspect --model " + stories_dir().string() + " --no-strict --dataset " + (dir / "d.jsonl").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 rows skipped: 1 no assistant turn"), std::string::npos) << r.out;
}

TEST(InferCli, BadInputsGiveClearErrorsAndExitCodes) {
  const auto dir = test::temp_dir("cli_bad");
  CliRun r = run_cli("infer --model " + dir.string() + " --prompt hi");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
  write_file_atomic(dir / "in.jsonl", "{\"prompt\": \"a\"}\n{\"question\": \"b\"}\n");
  r = run_cli("infer --model " + stories_dir().string() + " --prompts-file " + (dir / "in.jsonl").string() + " --output " +
          (dir / "o.jsonl").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("in.jsonl:2"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "o.jsonl"));
  r = run_cli("infer --model " + stories_dir().string() + " --prompt hi --top-p 1.5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
  r = run_cli("infer --model " + stories_dir().string() + " --prompt hi --dtype float8");
  EXPECT_EQ(r.code, 2) << r.out;
  // A truncated checkpoint: a format error naming the file, never a crash.
  const fs::path truncated = test::temp_dir("cli_truncated");
  for (const auto& entry : fs::directory_iterator(stories_dir())) fs::copy(entry.path(), truncated / entry.path().filename());
  fs::resize_file(truncated / "model.safetensors", fs::file_size(truncated / "model.safetensors") / 2);
  r = run_cli("infer --model " + truncated.string() + " --prompt hi");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  // A config.json with a key of the wrong type: a configuration error naming file and key.
  fs::remove(truncated / "config.json");
  write_file_atomic(truncated / "config.json", "{\"model_type\": \"llama\", \"vocab_size\": \"512\"}");
  r = run_cli("infer --model " + truncated.string() + " --prompt hi");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("vocab_size"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace swiftcpp
