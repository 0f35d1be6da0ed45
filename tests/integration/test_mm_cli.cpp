// Vision-language models through the swiftcpp binary: infer with --image, prompts files with images, the
// interactive /image command, and the errors of bad images and text models given images.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
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

namespace swiftcpp {
namespace {

// A small multimodal dataset beside copies of the real images (relative paths), in ms-swift's forms: `<image>`
// placeholders with an `images` list, content parts, and a row with two images.
fs::path write_mm_dataset(const fs::path& dir) {
  fs::create_directories(dir / "img");
  const std::vector<std::pair<std::string, std::string>> images = {
      {"coffee.jpg", "a cup of coffee"}, {"rocket.jpg", "a rocket"}, {"chelsea_rgba.png", "a cat"},
      {"camera.png", "a man with a camera"}, {"astronaut_224.png", "an astronaut"}};
  std::string rows;
  for (const auto& [file, answer] : images) {
    fs::copy_file(image(file.c_str()), dir / "img" / file, fs::copy_options::overwrite_existing);
    for (const char* q : {"What is this?", "Describe the picture.", "What do you see?"}) {
      rows += fmt::format("{{\"messages\": [{{\"role\": \"user\", \"content\": \"<image>{}\"}}, {{\"role\": "
                          "\"assistant\", \"content\": \"It is {}.\"}}], \"images\": [\"img/{}\"]}}\n", q, answer, file);
    }
    rows += fmt::format("{{\"messages\": [{{\"role\": \"user\", \"content\": [{{\"type\": \"image\", \"image\": "
                        "\"img/{}\"}}, {{\"type\": \"text\", \"text\": \"And this?\"}}]}}, {{\"role\": \"assistant\", "
                        "\"content\": \"{}\"}}]}}\n", file, answer);
  }
  rows += "{\"messages\": [{\"role\": \"user\", \"content\": \"<image><image>Which came first?\"}, {\"role\": "
          "\"assistant\", \"content\": \"The coffee.\"}], \"images\": [\"img/coffee.jpg\", \"img/rocket.jpg\"]}\n";
  write_file_atomic(dir / "train.jsonl", rows);
  return dir / "train.jsonl";
}

std::string mm_train_args(const fs::path& data, const fs::path& out, const std::string& extra = "") {
  return fmt::format("--threads 1 train model={} dataset={} output_dir={} max_length=96 per_device_train_batch_size=2 "
                     "gradient_accumulation_steps=2 max_steps=24 save_steps=3 logging_steps=1 lora_rank=4 "
                     "lora_alpha=8 lora_dropout=0.1 learning_rate=3e-3 seed=7 save_total_limit=2 {}",
                     (llava_dir() / "tiny-llava").string(), data.string(), out.string(), extra);
}

fs::path only_run(const fs::path& out) {
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.is_directory() && e.path().filename().string().rfind("v", 0) == 0) return e.path();
  }
  return {};
}

// "step: loss" of every training record, exact text: compared between runs of one configuration only.
std::vector<std::string> losses(const fs::path& run) {
  std::vector<std::string> out;
  std::istringstream in(read_text_file(run / "logging.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    if (j.contains("loss")) out.push_back(fmt::format("{}: {}", j["global_step"].get<int64_t>(), j["loss"].dump()));
  }
  return out;
}

// Starts training, sends `signal` once checkpoint-3 exists, returns the exit code.
int train_and_signal(const fs::path& data, const fs::path& out, const std::string& signal, const std::string& extra) {
  return test::run_cli_until_checkpoint(mm_train_args(data, out, extra), out, "checkpoint-3", signal);
}

TEST(MmTrainCli, LoraWithImagesLearnsSavesThePeftLayoutAndResumesExactly) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path base = test::temp_dir("mm_train_cli");
  const fs::path data = write_mm_dataset(base / "data");
  const auto r = run_cli(mm_train_args(data, base / "straight"));
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path run = only_run(base / "straight");
  const std::vector<std::string> expected = losses(run);
  ASSERT_EQ(expected.size(), 24u);
  // The loss falls: the first logged loss against the last.
  const auto value = [](const std::string& s) { return std::stod(s.substr(s.find(':') + 1)); };
  EXPECT_LT(value(expected.back()), value(expected.front()));
  // The adapter: LoRA on the language model, the projector in full as PEFT's modules_to_save.
  const fs::path ckpt = run / "checkpoint-24";
  const Json cfg = load_json_file(ckpt / "adapter_config.json");
  EXPECT_EQ(cfg["modules_to_save"], Json({"multi_modal_projector"}));
  const Checkpoint adapter = Checkpoint::open(ckpt / "adapter_model.safetensors");
  EXPECT_TRUE(adapter.contains("base_model.model.multi_modal_projector.linear_2.bias"));
  EXPECT_TRUE(adapter.contains("base_model.model.language_model.model.layers.1.mlp.down_proj.lora_B.weight"));
  for (const auto& name : adapter.names()) EXPECT_EQ(name.find("vision_tower"), std::string::npos) << name;
  for (const std::string signal : {"TERM", "KILL"}) {
    SCOPED_TRACE(signal);
    const fs::path out = base / signal;
    const int code = train_and_signal(data, out, signal, "");
    if (signal == "TERM") {
      EXPECT_EQ(code, 143);
    }
    ASSERT_FALSE(fs::exists(only_run(out) / "checkpoint-24")) << "the run finished before the signal";
    const auto resumed = run_cli(mm_train_args(data, out, "resume_from_checkpoint=latest"));
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_EQ(losses(only_run(out)), expected);
  }
  // infer with the adapter, and export --merge-lora writes a complete LLaVA folder that computes the same.
  const fs::path merged = base / "merged";
  const auto e = run_cli("export --model " + (llava_dir() / "tiny-llava").string() + " --adapters " + ckpt.string() +
                         " --merge-lora --output " + merged.string());
  ASSERT_EQ(e.code, 0) << e.out;
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.model",
                        "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(merged / f)) << f;
  }
  const Checkpoint exported = Checkpoint::open(merged);
  const Checkpoint original = Checkpoint::open(llava_dir() / "tiny-llava");
  EXPECT_EQ(exported.names(), original.names());  // Hugging Face's layout: vision, projector, language model
  const std::string prompt = " --prompt 'What is this?' --temperature 0 --max-new-tokens 8 --no-stream --image " +
                             image("rocket.jpg").string();
  const auto with_adapter = stdout_of("infer --model " + (llava_dir() / "tiny-llava").string() + " --adapters " +
                                      ckpt.string() + prompt, base);
  const auto from_merged = stdout_of("infer --model " + merged.string() + prompt, base);
  ASSERT_TRUE(with_adapter && from_merged);
  EXPECT_EQ(*with_adapter, *from_merged);
  // GGUF export of a vision-language model is refused, naming why.
  const auto g = run_cli("export --model " + merged.string() + " --format gguf --output " + (base / "m.gguf").string());
  EXPECT_NE(g.code, 0);
  EXPECT_NE(g.out.find("mmproj"), std::string::npos) << g.out;
  EXPECT_FALSE(fs::exists(base / "m.gguf"));
  // quantize packs the language model only, and infer runs the result.
  const auto q = run_cli("quantize --model " + merged.string() + " --bits 8 --group-size 16 --output " +
                         (base / "int8").string());
  ASSERT_EQ(q.code, 0) << q.out;
  const Checkpoint packed = Checkpoint::open(base / "int8");
  EXPECT_TRUE(packed.contains("language_model.model.layers.0.mlp.up_proj.qweight"));
  EXPECT_TRUE(packed.contains("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"));
  EXPECT_TRUE(packed.contains("multi_modal_projector.linear_1.weight"));
  const auto qi = run_cli("infer --model " + (base / "int8").string() + prompt);
  EXPECT_EQ(qi.code, 0) << qi.out;
}

TEST(MmTrainCli, PackingAndChunkFlowTrainLikePaddingWithImages) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path base = test::temp_dir("mm_train_cli_batching");
  const fs::path data = write_mm_dataset(base / "data");
  const std::string common = "lora_dropout=0 max_steps=4 dataset_shuffle=false";
  const auto padded = run_cli(mm_train_args(data, base / "padded", common));
  ASSERT_EQ(padded.code, 0) << padded.out;
  // ChunkFlow with chunks of 24 tokens: a sample of one image (16 positions) and its text splits into dependent
  // chunks, the image's run never cut.
  const auto chunked = run_cli(mm_train_args(data, base / "chunkflow", common + " batching=chunkflow chunk_size=24"));
  ASSERT_EQ(chunked.code, 0) << chunked.out;
  const auto a = losses(only_run(base / "padded")), b = losses(only_run(base / "chunkflow"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::stod(a[i].substr(a[i].find(':') + 1)), y = std::stod(b[i].substr(b[i].find(':') + 1));
    EXPECT_NEAR(x, y, 1e-4 * x) << "step " << i + 1;
  }
  const auto packed = run_cli(mm_train_args(data, base / "packing", common + " packing=true"));
  ASSERT_EQ(packed.code, 0) << packed.out;
  EXPECT_EQ(losses(only_run(base / "packing")).size(), 4u);
  // A chunk smaller than an image's run is refused with the reason.
  const auto small = run_cli(mm_train_args(data, base / "small", common + " batching=chunkflow chunk_size=8"));
  EXPECT_NE(small.code, 0);
  EXPECT_NE(small.out.find("chunk_size"), std::string::npos) << small.out;
}

// Qwen2-VL: images of different sizes take different token counts (coffee 12, camera 16, astronaut 16), M-RoPE
// positions, the merger trained in full beside LoRA on the language model.
fs::path qwen2_vl_dir() { return assets() / "reference/qwen2_vl/tiny-qwen2-vl"; }

std::string qwen_train_args(const fs::path& data, const fs::path& out, const std::string& extra = "") {
  return fmt::format("--threads 1 train model={} dataset={} output_dir={} max_length=128 per_device_train_batch_size=2 "
                     "gradient_accumulation_steps=2 max_steps=12 save_steps=3 logging_steps=1 lora_rank=4 "
                     "lora_alpha=8 lora_dropout=0.1 learning_rate=3e-3 seed=7 save_total_limit=2 {}",
                     qwen2_vl_dir().string(), data.string(), out.string(), extra);
}

TEST(MmTrainCli, Qwen2VLLoraTrainsResumesExactlyExportsAndQuantizes) {
  SWIFTCPP_REQUIRE_SHARED(qwen2_vl_dir() / "config.json");
  const fs::path base = test::temp_dir("mm_train_cli_qwen2_vl");
  const fs::path data = write_mm_dataset(base / "data");
  const auto r = run_cli(qwen_train_args(data, base / "straight"));
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path run = only_run(base / "straight");
  const std::vector<std::string> expected = losses(run);
  ASSERT_EQ(expected.size(), 12u);
  const fs::path ckpt = run / "checkpoint-12";
  const Json cfg = load_json_file(ckpt / "adapter_config.json");
  EXPECT_EQ(cfg["modules_to_save"], Json({"visual.merger"}));
  const Checkpoint adapter = Checkpoint::open(ckpt / "adapter_model.safetensors");
  EXPECT_TRUE(adapter.contains("base_model.model.visual.merger.mlp.0.weight"));
  EXPECT_TRUE(adapter.contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  for (const auto& name : adapter.names()) EXPECT_EQ(name.find("visual.blocks"), std::string::npos) << name;
  // Killed after checkpoint-3 and resumed: the same losses, exactly.
  const fs::path out = base / "KILL";
  (void)test::run_cli_until_checkpoint(qwen_train_args(data, out), out, "checkpoint-3", "KILL");
  ASSERT_FALSE(fs::exists(only_run(out) / "checkpoint-12")) << "the run finished before the signal";
  const auto resumed = run_cli(qwen_train_args(data, out, "resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(losses(only_run(out)), expected);
  // export --merge-lora writes a complete Hugging Face folder in Qwen2-VL's layout that answers as the adapter does.
  const fs::path merged = base / "merged";
  const auto e = run_cli("export --model " + qwen2_vl_dir().string() + " --adapters " + ckpt.string() +
                         " --merge-lora --output " + merged.string());
  ASSERT_EQ(e.code, 0) << e.out;
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json",
                        "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(merged / f)) << f;
  }
  EXPECT_EQ(Checkpoint::open(merged).names(), Checkpoint::open(qwen2_vl_dir()).names());
  const std::string prompt = " --prompt 'What is this?' --temperature 0 --max-new-tokens 8 --no-stream --image " +
                             image("rocket.jpg").string();
  const auto with_adapter = stdout_of("infer --model " + qwen2_vl_dir().string() + " --adapters " + ckpt.string() +
                                      prompt, base);
  const auto from_merged = stdout_of("infer --model " + merged.string() + prompt, base);
  ASSERT_TRUE(with_adapter && from_merged);
  EXPECT_EQ(*with_adapter, *from_merged);
  // quantize packs the language model only; the tower and merger stay float, and infer runs the result.
  const auto q = run_cli("quantize --model " + merged.string() + " --bits 8 --group-size 16 --output " +
                         (base / "int8").string());
  ASSERT_EQ(q.code, 0) << q.out;
  const Checkpoint packed = Checkpoint::open(base / "int8");
  EXPECT_TRUE(packed.contains("model.layers.0.mlp.up_proj.qweight"));
  EXPECT_TRUE(packed.contains("visual.blocks.0.mlp.fc1.weight"));
  EXPECT_TRUE(packed.contains("visual.merger.mlp.0.weight"));
  const auto qi = run_cli("infer --model " + (base / "int8").string() + prompt);
  EXPECT_EQ(qi.code, 0) << qi.out;
}

TEST(MmTrainCli, Qwen2VLPackingChunkFlowBf16AndTheirRefusals) {
  SWIFTCPP_REQUIRE_SHARED(qwen2_vl_dir() / "config.json");
  const fs::path base = test::temp_dir("mm_train_cli_qwen2_vl_batching");
  const fs::path data = write_mm_dataset(base / "data");
  const std::string common = "lora_dropout=0 max_steps=3 dataset_shuffle=false";
  for (const std::string extra : {"packing=true", "bf16=true", "max_pixels=50176", "use_dora=true",
                                   "quant_bits=4 quant_group_size=16", "train_type=full freeze_vit=false"}) {
    SCOPED_TRACE(extra);
    const auto r = run_cli(qwen_train_args(data, base / extra.substr(0, extra.find('=')), common + " " + extra));
    ASSERT_EQ(r.code, 0) << r.out;
    const auto l = losses(only_run(base / extra.substr(0, extra.find('='))));
    ASSERT_EQ(l.size(), 3u);
    EXPECT_TRUE(std::isfinite(std::stod(l.back().substr(l.back().find(':') + 1))));
  }
  // ChunkFlow: chunks of 24 tokens split samples whose images take 12 or 16 positions, never inside an image's
  // run, with each chunk's slice of the sample's M-RoPE positions: the losses equal padding's.
  const auto padded = run_cli(qwen_train_args(data, base / "padded", common));
  ASSERT_EQ(padded.code, 0) << padded.out;
  const auto c = run_cli(qwen_train_args(data, base / "chunkflow", common + " batching=chunkflow chunk_size=24"));
  ASSERT_EQ(c.code, 0) << c.out;
  const auto a = losses(only_run(base / "padded")), b = losses(only_run(base / "chunkflow"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::stod(a[i].substr(a[i].find(':') + 1)), y = std::stod(b[i].substr(b[i].find(':') + 1));
    EXPECT_NEAR(x, y, 1e-4 * x) << "step " << i + 1;
  }
  const auto small = run_cli(qwen_train_args(data, base / "small", common + " batching=chunkflow chunk_size=8"));
  EXPECT_NE(small.code, 0);
  EXPECT_NE(small.out.find("chunk_size"), std::string::npos) << small.out;
  const auto p = run_cli(qwen_train_args(data, base / "pixels", common + " min_pixels=100000 max_pixels=50000"));
  EXPECT_NE(p.code, 0);
  EXPECT_NE(p.out.find("min_pixels"), std::string::npos) << p.out;
}

// Preference pairs with images in ms-swift's multimodal forms (an `images` column, content parts): the chosen answer
// names what the image shows, the rejected one names another image's subject.
fs::path write_mm_preference_dataset(const fs::path& dir) {
  fs::create_directories(dir / "img");
  const std::vector<std::pair<std::string, std::string>> images = {
      {"coffee.jpg", "a cup of coffee"}, {"rocket.jpg", "a rocket"}, {"chelsea_rgba.png", "a cat"},
      {"camera.png", "a man with a camera"}};
  std::string rows;
  for (size_t i = 0; i < images.size(); ++i) {
    const auto& [file, answer] = images[i];
    const std::string& wrong = images[(i + 1) % images.size()].second;
    fs::copy_file(image(file.c_str()), dir / "img" / file, fs::copy_options::overwrite_existing);
    rows += fmt::format("{{\"messages\": [{{\"role\": \"user\", \"content\": \"<image>What is this?\"}}, {{\"role\": "
                        "\"assistant\", \"content\": \"It is {}.\"}}], \"rejected_response\": \"It is {}.\", "
                        "\"images\": [\"img/{}\"]}}\n", answer, wrong, file);
    rows += fmt::format("{{\"messages\": [{{\"role\": \"user\", \"content\": [{{\"type\": \"image\", \"image\": "
                        "\"img/{}\"}}, {{\"type\": \"text\", \"text\": \"What do you see?\"}}]}}], \"chosen\": "
                        "\"I see {}.\", \"rejected\": \"I see {}.\"}}\n", file, answer, wrong);
  }
  write_file_atomic(dir / "pairs.jsonl", rows);
  return dir / "pairs.jsonl";
}

std::string mm_rlhf_args(const fs::path& model, const fs::path& data, const fs::path& out, const std::string& extra) {
  return fmt::format("--threads 1 rlhf model={} dataset={} output_dir={} max_length=128 per_device_train_batch_size=2 "
                     "per_device_eval_batch_size=2 gradient_accumulation_steps=1 max_steps=6 save_steps=3 "
                     "logging_steps=1 eval_steps=3 split_dataset_ratio=0.25 lora_rank=4 lora_alpha=8 lora_dropout=0.1 "
                     "learning_rate=3e-3 seed=7 save_total_limit=2 {}",
                     model.string(), data.string(), out.string(), extra);
}

// "step key value" of the values a resumed preference run must repeat exactly.
std::vector<std::string> preference_values(const fs::path& run) {
  std::vector<std::string> out;
  std::istringstream in(read_text_file(run / "logging.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    for (const char* key : {"loss", "rewards/margins", "rewards/accuracies", "eval_loss", "eval_rewards/margins"}) {
      if (j.contains(key)) out.push_back(fmt::format("{} {} {}", j["global_step"].get<int64_t>(), key, j[key].dump()));
    }
  }
  return out;
}

// DPO on image pairs with Qwen2-VL (LoRA on the language model, the merger trained in full and at its loaded value in
// the reference forward) trains, saves the PEFT layout and resumes exactly after a hard kill; every other preference
// method runs on the same rows, LLaVA too; a text model refuses the rows naming file and line.
TEST(MmRlhfCli, PreferenceMethodsTrainOnImagePairsAndDpoResumesExactly) {
  SWIFTCPP_REQUIRE_SHARED(qwen2_vl_dir() / "config.json");
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path base = test::temp_dir("mm_rlhf_cli");
  const fs::path data = write_mm_preference_dataset(base / "data");
  const auto r = run_cli(mm_rlhf_args(qwen2_vl_dir(), data, base / "straight", "rlhf_type=dpo"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("6 train pairs, 2 validation"), std::string::npos) << r.out;
  const fs::path run = only_run(base / "straight");
  const std::vector<std::string> expected = preference_values(run);
  ASSERT_FALSE(expected.empty());
  for (const std::string& v : expected) EXPECT_EQ(v.find("null"), std::string::npos) << v;
  const Json cfg = load_json_file(run / "checkpoint-6" / "adapter_config.json");
  EXPECT_EQ(cfg["modules_to_save"], Json({"visual.merger"}));
  const fs::path out = base / "KILL";
  (void)test::run_cli_until_checkpoint(mm_rlhf_args(qwen2_vl_dir(), data, out, "rlhf_type=dpo"), out, "checkpoint-3",
                                       "KILL");
  ASSERT_FALSE(fs::exists(only_run(out) / "checkpoint-6")) << "the run finished before the signal";
  const auto resumed =
      run_cli(mm_rlhf_args(qwen2_vl_dir(), data, out, "rlhf_type=dpo resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(preference_values(only_run(out)), expected);

  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
           {"kto", "rlhf_type=kto"}, {"orpo", "rlhf_type=orpo"}, {"simpo", "rlhf_type=simpo"}, {"rm", "rlhf_type=rm"},
           {"bf16", "rlhf_type=dpo bf16=true"}, {"full", "rlhf_type=dpo train_type=full"}}) {
    SCOPED_TRACE(name);
    const auto m = run_cli(mm_rlhf_args(qwen2_vl_dir(), data, base / name, extra + " max_steps=2 save_steps=2 eval_steps=2"));
    ASSERT_EQ(m.code, 0) << m.out;
    const std::vector<std::string> values = preference_values(only_run(base / name));
    ASSERT_FALSE(values.empty());
    for (const std::string& v : values) EXPECT_EQ(v.find("null"), std::string::npos) << v;
  }
  const auto llava = run_cli(mm_rlhf_args(llava_dir() / "tiny-llava", data, base / "llava",
                                          "rlhf_type=dpo max_steps=2 save_steps=2 eval_steps=2"));
  ASSERT_EQ(llava.code, 0) << llava.out;
  // Two processes (each its share of every step's pairs, images included) train as one with accumulation.
  const std::string common = "rlhf_type=dpo max_steps=3 save_steps=3 eval_steps=100 lora_dropout=0 ddp_timeout=30";
  const auto one = run_cli(mm_rlhf_args(qwen2_vl_dir(), data, base / "one", common + " gradient_accumulation_steps=2"));
  ASSERT_EQ(one.code, 0) << one.out;
  std::string two_args = mm_rlhf_args(qwen2_vl_dir(), data, base / "two", common);
  two_args.replace(two_args.find(" rlhf "), 6, " rlhf --nproc-per-node 2 ");
  const auto two = run_cli(two_args);
  ASSERT_EQ(two.code, 0) << two.out;
  const auto step_losses = [](const fs::path& run) {
    std::vector<double> out;
    std::istringstream in(read_text_file(run / "logging.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const Json j = Json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    return out;
  };
  const std::vector<double> la = step_losses(only_run(base / "one")), lb = step_losses(only_run(base / "two"));
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 + 1e-5 * std::abs(la[i])) << "step " << i + 1;
  const auto text = run_cli(mm_rlhf_args(stories_dir(), data, base / "text", "rlhf_type=dpo"));
  EXPECT_NE(text.code, 0);
  EXPECT_NE(text.out.find("pairs.jsonl:1"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("images need a vision-language model"), std::string::npos) << text.out;
}

// GRPO on image prompts with Qwen2-VL: rollouts on the engine with each prompt's pixels, an external reward that
// sees the row's fields (its target and the image files), the KL term toward the base (adapters off, the merger at its
// loaded value); killed after checkpoint-2 and resumed, it repeats the uninterrupted run exactly.
TEST(MmRlhfCli, GrpoRollsOutImagePromptsSeesTheirFieldsAndResumesExactly) {
  SWIFTCPP_REQUIRE_SHARED(qwen2_vl_dir() / "config.json");
  const fs::path base = test::temp_dir("mm_grpo_cli");
  fs::create_directories(base / "data" / "img");
  std::string rows;
  for (const auto& [file, target] : std::vector<std::pair<std::string, std::string>>{
           {"coffee.jpg", "coffee"}, {"rocket.jpg", "rocket"}, {"chelsea_rgba.png", "cat"}, {"camera.png", "camera"}}) {
    fs::copy_file(image(file.c_str()), base / "data" / "img" / file, fs::copy_options::overwrite_existing);
    rows += fmt::format("{{\"messages\": [{{\"role\": \"user\", \"content\": \"<image>What is this?\"}}], \"images\": "
                        "[\"img/{}\"], \"target\": \"{}\"}}\n", file, target);
  }
  rows += "{\"prompt\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"img/rocket.jpg\"}, "
          "{\"type\": \"text\", \"text\": \"Name it.\"}]}], \"target\": \"rocket\"}\n";
  write_file_atomic(base / "data" / "prompts.jsonl", rows);
  // 0.5 for seeing the row's image files, 1 more for naming the target.
  write_file_atomic(base / "reward.sh",
                    "exec awk '{ r = index($0, \"\\\"images\\\":[\\\"/\") > 0 ? 0.5 : 0;\n"
                    "  if (match($0, /\"target\":\"[^\"]*\"/)) { t = substr($0, RSTART + 10, RLENGTH - 11);\n"
                    "    if (match($0, /\"completion\":\"[^\"]*\"/) && index(substr($0, RSTART, RLENGTH), t) > 0) r += 1 }\n"
                    "  print r }'\n");
  const auto args = [&](const fs::path& out, const std::string& extra) {
    return fmt::format("--threads 1 rlhf rlhf_type=grpo model={} dataset={} output_dir={} max_length=256 "
                       "reward_funcs=\"external:sh {}\" num_generations=2 max_completion_length=6 "
                       "per_device_train_batch_size=4 gradient_accumulation_steps=1 max_steps=4 save_steps=2 "
                       "logging_steps=1 eval_steps=100 lora_rank=4 lora_alpha=8 lora_dropout=0 learning_rate=5e-3 "
                       "seed=3 beta=0.04 log_completions=true {}",
                       qwen2_vl_dir().string(), (base / "data" / "prompts.jsonl").string(), out.string(),
                       (base / "reward.sh").string(), extra);
  };
  const auto r = run_cli(args(base / "straight", ""));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("5 train prompts"), std::string::npos) << r.out;
  const fs::path run = only_run(base / "straight");
  std::vector<std::string> expected;
  int rewarded = 0;
  std::istringstream log(read_text_file(run / "logging.jsonl"));
  for (std::string line; std::getline(log, line);) {
    const Json j = Json::parse(line);
    for (const char* key : {"loss", "reward", "kl", "completions/mean_length"}) {
      if (j.contains(key)) expected.push_back(fmt::format("{} {} {}", j["global_step"].get<int64_t>(), key, j[key].dump()));
    }
    if (j.contains("reward")) {
      EXPECT_GE(j["reward"].get<double>(), 0.5) << "every completion's row carried its images: " << line;
      ++rewarded;
    }
  }
  EXPECT_EQ(rewarded, 4);
  EXPECT_NE(read_text_file(run / "completions.jsonl").find("What is this?"), std::string::npos);
  const fs::path out = base / "KILL";
  (void)test::run_cli_until_checkpoint(args(out, ""), out, "checkpoint-2", "KILL");
  ASSERT_FALSE(fs::exists(only_run(out) / "checkpoint-4")) << "the run finished before the signal";
  const auto resumed = run_cli(args(out, "resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  std::vector<std::string> again;
  std::istringstream log2(read_text_file(only_run(out) / "logging.jsonl"));
  for (std::string line; std::getline(log2, line);) {
    const Json j = Json::parse(line);
    for (const char* key : {"loss", "reward", "kl", "completions/mean_length"}) {
      if (j.contains(key)) again.push_back(fmt::format("{} {} {}", j["global_step"].get<int64_t>(), key, j[key].dump()));
    }
  }
  EXPECT_EQ(again, expected);
}

// The bundled GRPO-with-images demo as docs/recipes.md runs it, on a smaller draw of its data: the format warm-up
// leaves the colour at chance, and GRPO alone (a reward for naming the picture's colour) raises the held-out reward
// by at least 0.3 in 40 steps (about 30 s; the recipe's 100 steps reach 0.94).
TEST(MmRlhfCli, TheLlavaGrpoDemoLearnsToNameTheColourItSees) {
  const fs::path base = test::temp_dir("llava_grpo_demo");
  const fs::path demo = base / "llava-demo";
  const std::string src = test::source_dir().string();
  ASSERT_EQ(std::system(("/usr/bin/python3 " + src + "/scripts/make_mm_demo.py --out " + demo.string() +
                         " --train 2000 --heldout 100 >" + (base / "make.log").string() + " 2>&1").c_str()), 0);
  const std::string data = fmt::format("model={} val_dataset={}", demo.string(), (demo / "val.jsonl").string());
  const auto warmup = run_cli(fmt::format("--threads 1 train --recipe {}/recipes/llava_demo.yaml {} dataset={} "
                                          "max_steps=40 output_dir={}", src, data, (demo / "warmup.jsonl").string(),
                                          (base / "warmup").string()));
  ASSERT_EQ(warmup.code, 0) << warmup.out;
  std::string checkpoint = warmup.out.substr(0, warmup.out.find_last_not_of('\n') + 1);
  checkpoint = checkpoint.substr(checkpoint.find_last_of('\n') + 1);
  ASSERT_TRUE(fs::exists(fs::path(checkpoint) / "adapter_model.safetensors")) << warmup.out;
  // From the source folder, as the recipe's reward command path expects.
  const auto grpo = run_cli(fmt::format("--threads 1 rlhf --recipe recipes/llava_grpo_demo.yaml model={} dataset={} "
                                        "val_dataset={} adapters={} max_steps=40 eval_steps=40 save_steps=40 "
                                        "output_dir={}", demo.string(), (demo / "grpo.jsonl").string(),
                                        (demo / "grpo_val.jsonl").string(), checkpoint, (base / "grpo").string()),
                            fmt::format("cd '{}' &&", src));
  ASSERT_EQ(grpo.code, 0) << grpo.out;
  std::map<int64_t, double> eval;
  std::istringstream log(read_text_file(only_run(base / "grpo") / "logging.jsonl"));
  for (std::string line; std::getline(log, line);) {
    const Json j = Json::parse(line);
    if (j.contains("eval_reward")) eval[j["global_step"].get<int64_t>()] = j["eval_reward"].get<double>();
  }
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_LT(eval[0], 0.4) << "the warm-up must leave the colour near chance (0.25)";
  EXPECT_GE(eval[40] - eval[0], 0.3) << "eval_reward " << eval[0] << " -> " << eval[40];
}

TEST(MmTrainCli, LlavaNextTrainsWithItsAnyresCountsInPaddingPackingAndChunkFlow) {
  // LLaVA-NeXT: each image takes 70-91 positions (tiles, unpadding and image_newline rows), told by its processor.
  const fs::path model = assets() / "reference/llava_next/tiny-llava-next";
  SWIFTCPP_REQUIRE_SHARED(model / "config.json");
  const fs::path base = test::temp_dir("mm_train_cli_llava_next");
  const fs::path data = write_mm_dataset(base / "data");
  const auto args = [&](const std::string& name, const std::string& extra) {
    return fmt::format("--threads 1 train model={} dataset={} output_dir={} max_length=200 per_device_train_batch_size=2 "
                       "max_steps=3 logging_steps=1 template=llava lora_dropout=0 dataset_shuffle=false {}",
                       model.string(), data.string(), (base / name).string(), extra);
  };
  const auto padded = run_cli(args("padded", ""));
  ASSERT_EQ(padded.code, 0) << padded.out;
  const auto chunked = run_cli(args("chunkflow", "batching=chunkflow chunk_size=100"));
  ASSERT_EQ(chunked.code, 0) << chunked.out;
  const auto a = losses(only_run(base / "padded")), b = losses(only_run(base / "chunkflow"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::stod(a[i].substr(a[i].find(':') + 1)), y = std::stod(b[i].substr(b[i].find(':') + 1));
    EXPECT_NEAR(x, y, 1e-4 * x) << "step " << i + 1;
  }
  const auto packed = run_cli(args("packing", "packing=true"));
  ASSERT_EQ(packed.code, 0) << packed.out;
  const auto small = run_cli(args("small", "batching=chunkflow chunk_size=48"));
  EXPECT_NE(small.code, 0);
  EXPECT_NE(small.out.find("smaller than an image"), std::string::npos) << small.out;
  const auto i = run_cli("infer --model " + model.string() + " --image " + image("coffee.jpg").string() +
                         " --prompt 'What is this?' --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(i.code, 0) << i.out;
}

// The Qwen2-VL demo's scripts stay runnable: the generator (a small set), the shipped recipe for a few steps,
// infer over its held-out prompts and the scorer (the full demo's figures: docs/recipes.md).
TEST(MmTrainCli, TheQwen2VLDemoScriptsBuildTrainAnswerAndScore) {
  // The generator takes the chat template and processor of the reference Qwen2-VL checkpoint.
  SWIFTCPP_REQUIRE_SHARED(test::assets() / "reference" / "qwen2_vl" / "tiny-qwen2-vl" / "tokenizer_config.json");
  const fs::path base = test::temp_dir("qwen2_vl_demo");
  const fs::path demo = base / "demo", out = base / "out";
  const std::string src = test::source_dir().string();
  ASSERT_EQ(std::system(("/usr/bin/python3 " + src + "/scripts/make_qwen2_vl_demo.py --out " + demo.string() +
                         " --train 16 --heldout 4 >" + (base / "make.log").string() + " 2>&1")
                            .c_str()),
            0);
  const auto train = run_cli("train --recipe " + src + "/recipes/qwen2_vl_demo.yaml model=" + demo.string() +
                             " dataset=" + (demo / "train.jsonl").string() + " val_dataset=" +
                             (demo / "val.jsonl").string() + " output_dir=" + out.string() +
                             " max_steps=2 per_device_train_batch_size=4 eval_steps=2 save_steps=2 logging_steps=1");
  ASSERT_EQ(train.code, 0) << train.out;
  std::string checkpoint = train.out.substr(0, train.out.find_last_not_of('\n') + 1);
  checkpoint = checkpoint.substr(checkpoint.find_last_of('\n') + 1);
  ASSERT_TRUE(fs::exists(fs::path(checkpoint) / "adapter_model.safetensors")) << train.out;
  const fs::path answers = base / "answers.jsonl";
  const auto infer = run_cli("infer --model " + demo.string() + " --adapters " + checkpoint + " --prompts-file " +
                             (demo / "heldout_prompts.jsonl").string() + " --output " + answers.string() +
                             " --temperature 0 --max-new-tokens 4");
  ASSERT_EQ(infer.code, 0) << infer.out;
  EXPECT_EQ(std::system(("/usr/bin/python3 " + src + "/scripts/score_mm_demo.py " + answers.string() + " >" +
                         (base / "score.txt").string())
                            .c_str()),
            0);
  std::ifstream score(base / "score.txt");
  const std::string text((std::istreambuf_iterator<char>(score)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("accuracy"), std::string::npos) << text;
  EXPECT_NE(text.find("/8)"), std::string::npos) << text;  // 4 held-out images, both questions each
}

TEST(MmTrainCli, DataInspectEncodesImageRowsAsTrainingDoes) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path base = test::temp_dir("mm_data_inspect");
  const fs::path data = write_mm_dataset(base / "data");
  const auto r = run_cli("data inspect --model " + (llava_dir() / "tiny-llava").string() + " --dataset " +
                         data.string() + " --show 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("template: llava"), std::string::npos) << r.out;
  // 21 rows, each image a run of 16 positions: the counts training reports for the same data.
  EXPECT_NE(r.out.find("samples 21 (train 21, validation 0), tokens 1190, trained tokens 248"), std::string::npos) << r.out;
}

TEST(MmTrainCli, BadRowsNameTheFileAndLine) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const fs::path base = test::temp_dir("mm_train_cli_bad");
  const fs::path data = write_mm_dataset(base / "data");
  std::string rows = read_text_file(data);
  rows += "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>x\"}, {\"role\": \"assistant\", \"content\": "
          "\"y\"}], \"images\": [\"img/missing.png\"]}\n";
  write_file_atomic(base / "data/bad.jsonl", rows);
  const auto strict = run_cli(mm_train_args(base / "data/bad.jsonl", base / "out", "max_steps=1"));
  EXPECT_NE(strict.code, 0);
  EXPECT_NE(strict.out.find("bad.jsonl:22"), std::string::npos) << strict.out;
  EXPECT_NE(strict.out.find("missing.png"), std::string::npos) << strict.out;
  const auto lenient = run_cli(mm_train_args(base / "data/bad.jsonl", base / "out2", "max_steps=1 strict=false"));
  EXPECT_EQ(lenient.code, 0) << lenient.out;
  EXPECT_NE(lenient.out.find("image unreadable"), std::string::npos) << lenient.out;
  // A text model given image rows.
  const auto text = run_cli(fmt::format("--threads 1 train model={} dataset={} output_dir={} max_steps=1",
                                        stories_dir().string(), data.string(), (base / "out3").string()));
  EXPECT_NE(text.code, 0);
  EXPECT_NE(text.out.find("vision-language model"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace swiftcpp
