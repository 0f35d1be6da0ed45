// Vision-language models through the swiftcpp binary: infer with --image, prompts files with images, the
// interactive /image command, and the errors of bad images and text models given images.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "core/fs.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::run_cli;
using test::stories_dir;

fs::path llava_dir() { return assets() / "reference/llava"; }
fs::path image(const char* name) { return assets() / "images" / name; }

TEST(MmInferCli, ImagePromptLogitsEqualTheModelOnTheReferencePixels) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path dir = test::temp_dir("mm_cli_logits");
  // Raw text "<image> Hi": BOS, the image's 16 positions, then the text; the CLI decodes and preprocesses the JPEG.
  const auto r = run_cli("infer --model " + (llava_dir() / "tiny-llava").string() + " --template raw --image " +
                         image("coffee.jpg").string() + " --prompt '<image>' --max-new-tokens 1 --output-logits " +
                         (dir / "logits.safetensors").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto file = SafetensorsFile::open(dir / "logits.safetensors");
  const at::Tensor ids = file->tensor("input_ids");
  ASSERT_EQ(ids.numel(), 17);
  EXPECT_EQ(ids[0].item<int64_t>(), 1);
  EXPECT_TRUE((ids.narrow(0, 1, 16) == 512).all().item<bool>());
  // The same ids with transformers' pixel values of coffee.jpg at 56 px.
  CausalLM model = load_causal_lm(llava_dir() / "tiny-llava");
  const Checkpoint ref = Checkpoint::open(llava_dir() / "clip_preprocess.safetensors");
  ForwardOptions o;
  o.pixel_values = ref.tensor("coffee.jpg/56").unsqueeze(0);
  c10::InferenceMode guard;
  const at::Tensor expected = model->forward(ids.view({1, -1}), o)[0];
  EXPECT_LE((file->tensor("logits") - expected).abs().max().item<double>(), 1e-5);
}

// Standard output alone of a CLI run (the generated text), or nullopt when it failed.
std::optional<std::string> stdout_of(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt";
  const std::string cmd = std::string(SWIFTCPP_BINARY) + " " + args + " 2>/dev/null > " + out.string();
  if (std::system(cmd.c_str()) != 0) return std::nullopt;
  return read_text_file(out);
}

TEST(MmInferCli, ImagesWithoutPlaceholdersGoFirstAndPromptsFilesCarryImages) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path dir = test::temp_dir("mm_cli_file");
  const std::string model = (llava_dir() / "tiny-llava").string();
  // --image without <image> in the prompt: the image goes first, so the result equals an explicit "<image>\n".
  const auto a = stdout_of("infer --model " + model + " --image " + image("camera.png").string() +
                           " --prompt 'Once upon a time' --temperature 0 --max-new-tokens 6 --no-stream", dir);
  const auto b = stdout_of("infer --model " + model + " --image " + image("camera.png").string() +
                           " --prompt '<image>\nOnce upon a time' --temperature 0 --max-new-tokens 6 --no-stream", dir);
  const auto c = stdout_of("infer --model " + model + " --image " + image("coffee.jpg").string() +
                           " --prompt 'Once upon a time' --temperature 0 --max-new-tokens 6 --no-stream", dir);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);  // the image matters
  // A prompts file: images relative to the file, rows with different image counts batched together, each equal to
  // the same prompt run alone.
  fs::copy_file(image("camera.png"), dir / "camera.png");
  fs::copy_file(image("coffee.jpg"), dir / "coffee.jpg");
  write_file_atomic(dir / "in.jsonl",
                    "{\"prompt\": \"<image>\\nOnce upon a time\", \"images\": [\"camera.png\"]}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"<image><image>Tell me\"}], \"images\": "
                    "[\"coffee.jpg\", \"" + (dir / "camera.png").string() + "\"]}\n"
                    "{\"prompt\": \"Once upon a time\", \"images\": \"coffee.jpg\"}\n");
  const auto f = run_cli("infer --model " + model + " --prompts-file " + (dir / "in.jsonl").string() + " --output " +
                         (dir / "out.jsonl").string() + " --temperature 0 --max-new-tokens 6 --batch-size 3");
  ASSERT_EQ(f.code, 0) << f.out;
  std::vector<Json> rows;
  std::istringstream lines(read_text_file(dir / "out.jsonl"));
  for (std::string line; std::getline(lines, line);) rows.push_back(parse_json(line, "out.jsonl"));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["response"].get<std::string>() + "\n", *b);
  EXPECT_EQ(rows[2]["response"].get<std::string>() + "\n", *c);
  EXPECT_GT(rows[1]["prompt_tokens"].get<int>(), 32);  // two images of 16 positions each
}

TEST(MmInferCli, BadImagesAndTextModelsAreClearErrors) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path dir = test::temp_dir("mm_cli_errors");
  const std::string model = (llava_dir() / "tiny-llava").string();
  write_file_atomic(dir / "anim.gif", std::string("GIF89a\x01\x00\x01\x00\x00\x00\x00;", 14));
  auto r = run_cli("infer --model " + model + " --image " + (dir / "anim.gif").string() + " --prompt hi");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("anim.gif"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("JPEG and PNG"), std::string::npos) << r.out;
  r = run_cli("infer --model " + model + " --image " + image("coffee.jpg").string() + " --image " +
              image("camera.png").string() + " --prompt '<image> one placeholder'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("image count mismatch"), std::string::npos) << r.out;
  r = run_cli("infer --model " + stories_dir().string() + " --image " + image("coffee.jpg").string() + " --prompt hi");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("text model"), std::string::npos) << r.out;
  write_file_atomic(dir / "in.jsonl", "{\"prompt\": \"<image>x\", \"images\": [\"missing.png\"]}\n");
  r = run_cli("infer --model " + model + " --prompts-file " + (dir / "in.jsonl").string() + " --output " +
              (dir / "out.jsonl").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("in.jsonl:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("missing.png"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.jsonl"));
}

TEST(MmInferCli, InteractiveImageCommandAttachesToTheNextMessage) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path dir = test::temp_dir("mm_cli_interactive");
  write_file_atomic(dir / "in.txt", "/image " + (dir / "nope.png").string() + "\n/image " + image("camera.png").string() +
                                        "\nOnce upon a time\n/exit\n");
  const auto r = run_cli("infer --model " + (llava_dir() / "tiny-llava").string() +
                         " --interactive --temperature 0 --max-new-tokens 6 < " + (dir / "in.txt").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("/image PATH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nope.png is not one"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attached to the next message"), std::string::npos) << r.out;
  // 1 BOS + template text + 16 image positions: the stats line counts the prompt tokens.
  EXPECT_NE(r.out.find("prompt tokens"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace swiftcpp
