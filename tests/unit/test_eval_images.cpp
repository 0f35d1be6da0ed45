// Evaluation with images: custom tasks with image_field (paths, placeholders, few-shot images), multiple-choice
// and generation items scored on the tiny reference LLaVA against a forward pass computed by hand, and bad input.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <fstream>

#include "core/error.h"
#include "eval/evaluator.h"
#include "eval/tasks.h"
#include "infer/generate.h"
#include "models/decoder/decoder.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"
#include "vision/processor.h"
#include "data/encode.h"
#include "models/registry.h"
#include "tests/test_util.h"

namespace swiftcpp::eval {
namespace {

using test::assets;
using test::temp_dir;

fs::path llava_dir() { return assets() / "reference/llava/tiny-llava"; }
fs::path images_dir() { return assets() / "images"; }

// The files of an item's images.
std::vector<fs::path> files(const std::vector<eval::ImageRef>& images) {
  std::vector<fs::path> out;
  for (const auto& image : images) out.push_back(image.file);
  return out;
}

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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A multiple-choice image task in `dir`: YAML + data, `extra` appended to the YAML.
fs::path write_task(const fs::path& dir, const std::string& rows, const std::string& extra = "") {
  write(dir / "data.jsonl", rows);
  write(dir / "task.yaml", "name: pics\ndata: data.jsonl\nprompt: \"{q}\\nAnswer:\"\nchoices: choices\nanswer: answer\n"
                           "image_field: image\n" + extra);
  return dir / "task.yaml";
}

TEST(EvalImagesTask, ImageFieldResolvesPathsAndAddsPlaceholders) {
  const fs::path dir = temp_dir("eval_images_parse");
  write(dir / "img/a.png", "not decoded while reading the task");
  write(dir / "shots/s.png", "x");
  const std::string abs = (dir / "img/a.png").string();
  write(dir / "shots/shots.jsonl", R"({"q": "Shot?", "image": "s.png", "choices": ["x", "y"], "answer": 0})" "\n");
  const fs::path yaml = write_task(dir,
      R"({"q": "Colour?", "image": "img/a.png", "choices": ["red", "blue"], "answer": "blue"})" "\n"
      R"({"q": "Left <image> right <image>", "image": ["img/a.png", ")" + abs + R"("], "choices": ["a", "b"], "answer": 0})" "\n"
      R"({"q": "None.", "image": [], "choices": ["a", "b"], "answer": 1})" "\n");
  const Task task = load_task(yaml.string(), "", {});
  EXPECT_TRUE(task.has_images);
  ASSERT_EQ(task.choice_items.size(), 3u);
  EXPECT_EQ(task.choice_items[0].context, "<image>\nColour?\nAnswer:");
  EXPECT_EQ(files(task.choice_items[0].images), std::vector<fs::path>{dir / "img/a.png"});
  EXPECT_EQ(task.choice_items[0].gold, 1);
  // Placeholders the prompt writes are kept (one per image); the images keep their order.
  EXPECT_EQ(task.choice_items[1].context, "Left <image> right <image>\nAnswer:");
  EXPECT_EQ(files(task.choice_items[1].images), (std::vector<fs::path>{dir / "img/a.png", fs::path(abs)}));
  EXPECT_EQ(task.choice_items[2].context, "None.\nAnswer:");
  EXPECT_TRUE(task.choice_items[2].images.empty());

  // Generation tasks take the same field.
  write(dir / "gen.yaml", "name: g\ntype: generation\ndata: data.jsonl\nprompt: \"{q}\"\nanswer: \"{choices.0}\"\n"
                          "image_field: image\n");
  const Task gen = load_task((dir / "gen.yaml").string(), "", {});
  ASSERT_EQ(gen.generation_items.size(), 3u);
  EXPECT_EQ(gen.generation_items[0].context, "<image>\nColour?");
  EXPECT_EQ(gen.generation_items[0].target, "red");
  EXPECT_EQ(gen.generation_items[1].images.size(), 2u);
  // Without image_field nothing changes: "<image>" is text and no images are read.
  write(dir / "text.yaml", "name: t\ndata: data.jsonl\nprompt: \"{q}\"\nchoices: choices\nanswer: answer\n");
  const Task text = load_task((dir / "text.yaml").string(), "", {});
  EXPECT_FALSE(text.has_images);
  EXPECT_EQ(text.choice_items[0].context, "Colour?");
  EXPECT_TRUE(text.choice_items[0].images.empty());

  // Few-shot examples bring their images first; paths resolve against their own data file's folder.
  const fs::path shots_yaml = write_task(dir, R"({"q": "Colour?", "image": "img/a.png", "choices": ["red", "blue"], "answer": 0})" "\n",
                                         "fewshot_data: shots/shots.jsonl\nnum_fewshot: 1\n");
  const Task shot = load_task(shots_yaml.string(), "", {});
  ASSERT_EQ(shot.choice_items.size(), 1u);
  EXPECT_EQ(shot.choice_items[0].context, "<image>\nShot?\nAnswer: x\n\n<image>\nColour?\nAnswer:");
  EXPECT_EQ(files(shot.choice_items[0].images), (std::vector<fs::path>{dir / "shots/s.png", dir / "img/a.png"}));
  write(dir / "gen_shots.yaml", "name: g\ntype: generation\ndata: data.jsonl\nfewshot_data: shots/shots.jsonl\n"
                                "num_fewshot: 1\nprompt: \"{q}\"\nanswer: \"{choices.0}\"\nimage_field: image\n");
  const Task gen_shot = load_task((dir / "gen_shots.yaml").string(), "", {});
  ASSERT_EQ(gen_shot.generation_items.size(), 1u);
  EXPECT_EQ(gen_shot.generation_items[0].context, "<image>\nShot? x\n\n<image>\nColour?");
  EXPECT_EQ(files(gen_shot.generation_items[0].images), (std::vector<fs::path>{dir / "shots/s.png", dir / "img/a.png"}));
}

TEST(EvalImagesTask, BadImageRowsNameTheDataFileLineAndImage) {
  const fs::path dir = temp_dir("eval_images_bad");
  write(dir / "a.png", "x");
  const std::string ok = R"({"q": "Q?", "image": "a.png", "choices": ["a", "b"], "answer": 0})" "\n";
  auto load = [&](const std::string& rows, const std::string& extra = "") {
    load_task(write_task(dir, rows, extra).string(), "", {});
  };
  std::string msg = error_of<IoError>([&] { load(ok + R"({"q": "Q?", "image": "missing.png", "choices": ["a", "b"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:2") && contains(msg, "missing.png")) << msg;
  msg = error_of<FormatError>([&] { load(R"({"q": "<image> and <image>", "image": "a.png", "choices": ["a", "b"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1") && contains(msg, "2 <image>") && contains(msg, "1 image")) << msg;
  msg = error_of<FormatError>([&] { load(ok + R"({"q": "Q?", "image": 7, "choices": ["a", "b"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:2") && contains(msg, "'image'")) << msg;
  msg = error_of<FormatError>([&] { load(R"({"q": "Q?", "image": ["a.png", 3], "choices": ["a", "b"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1")) << msg;
  msg = error_of<FormatError>([&] { load(R"({"q": "Q?", "choices": ["a", "b"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1") && contains(msg, "no field 'image'")) << msg;
  msg = error_of<FormatError>([&] { load(R"({"q": "Q?", "image": "a.png", "choices": ["a", "<image>"], "answer": 0})" "\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1") && contains(msg, "choice")) << msg;
  msg = error_of<FormatError>([&] { load(ok, "description: \"<image>\"\n"); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1") && contains(msg, "description")) << msg;
  // The key is checked like every other: a misspelling names its line.
  write(dir / "typo.yaml", "name: t\ndata: data.jsonl\nprompt: \"{q}\"\nchoices: choices\nanswer: answer\nimage_feld: image\n");
  msg = error_of<ConfigError>([&] { load_task((dir / "typo.yaml").string(), "", {}); });
  EXPECT_TRUE(contains(msg, "typo.yaml:6") && contains(msg, "image_field")) << msg;
}

// ---- scoring on the tiny reference LLaVA ----

struct TinyLlava {
  CausalLM model = load_causal_lm(llava_dir());
  std::shared_ptr<TextTokenizer> tokenizer = load_tokenizer(llava_dir());
  vision::ImageProcessorConfig processor = vision::load_image_processor_config(llava_dir());
  TinyLlava() { model->eval(); }

  std::vector<int64_t> encode(const std::string& text) const {
    std::vector<int> ids = tokenizer->encode_with_special_tokens(text);
    ids.insert(ids.begin(), *tokenizer->specials().bos);  // add_bos_token: true
    return std::vector<int64_t>(ids.begin(), ids.end());
  }
  // Each image token -> image_seq_length (16) copies.
  std::vector<int64_t> expand(const std::vector<int64_t>& ids) const {
    std::vector<int64_t> out;
    for (int64_t id : ids) out.insert(out.end(), id == 512 ? 16 : 1, id);
    return out;
  }
  at::Tensor pixels(const std::vector<fs::path>& files) const {  // [N, 3, 56, 56]
    std::vector<at::Tensor> out;
    for (const auto& f : files) out.push_back(vision::preprocess_image(vision::read_image(f), processor));
    return at::stack(out);
  }
  // Full logits of one unpadded sequence without a cache: [T, V].
  at::Tensor logits(const std::vector<int64_t>& ids, const at::Tensor& pixel_values) {
    at::NoGradGuard no_grad;
    ForwardOptions o;
    o.pixel_values = pixel_values;
    return model->forward(at::tensor(ids, at::kLong).view({1, -1}), o).squeeze(0).to(at::kDouble);
  }
  // log P(choice | context, images), by hand: the pair tokenised whole, the continuation after the context's own
  // length, every position computed in one forward of the whole sequence.
  double loglikelihood(const std::string& context, const std::string& continuation, const std::vector<eval::ImageRef>& images) {
    const std::vector<int64_t> ctx = expand(encode(context));
    const std::vector<int64_t> whole = expand(encode(context + continuation));
    const at::Tensor lp = at::log_softmax(logits(whole, pixels(files(images))), -1);
    double sum = 0;
    for (size_t t = ctx.size(); t < whole.size(); ++t) sum += lp[static_cast<int64_t>(t) - 1][whole[t]].item<double>();
    return sum;
  }
};

TEST(EvalImagesScoring, MultipleChoiceEqualsHandScoredForwardWithImages) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "model.safetensors");
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  const fs::path dir = temp_dir("eval_images_mc");
  const std::string I = images_dir().string();
  // Different prompt lengths, so longest-first batching reorders the items and pairs them differently; one item
  // with two images.
  const fs::path yaml = write_task(dir,
      R"({"q": "What is in the picture?", "image": ")" + I + R"(/coffee.jpg", "choices": ["a cup", "a rocket", "a cat"], "answer": 0})" "\n"
      R"({"q": "What?", "image": ")" + I + R"(/rocket.jpg", "choices": ["a cup", "a rocket", "a cat"], "answer": 1})" "\n"
      R"({"q": "First <image> then <image>: which one is a cat", "image": [")" + I + R"(/chelsea_rgba.png", ")" + I +
      R"(/camera.png"], "choices": ["the first", "the second"], "answer": 0})" "\n");
  const Task task = load_task(yaml.string(), "", {});
  TinyLlava t;
  EvalOptions options;
  options.scorer.batch_size = 2;
  options.log_samples = true;
  options.model_dir = llava_dir();
  Evaluator evaluator(t.model, t.tokenizer, options);
  const TaskResult r = evaluator.run(task);
  ASSERT_EQ(r.samples.size(), 3u);
  double correct = 0;
  for (size_t i = 0; i < 3; ++i) {
    const ChoiceItem& item = task.choice_items[i];
    std::vector<double> expected;
    for (const auto& c : item.choices) expected.push_back(t.loglikelihood(item.context, " " + c, item.images));
    const std::vector<double> got = r.samples[i]["loglikelihoods"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), expected.size());
    // float32 model, different padding, batching and a K/V cache: rounding only (|ll| < 100).
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], expected[j], 1e-4) << "item " << i << " choice " << j;
    const size_t pred = std::max_element(expected.begin(), expected.end()) - expected.begin();
    EXPECT_EQ(r.samples[i]["pred"].get<size_t>(), pred);
    correct += static_cast<int>(pred) == item.gold ? 1 : 0;
  }
  EXPECT_DOUBLE_EQ(r.metrics[0].value, correct / 3);
  // The images matter: item 0 scored with item 1's image gives another number, so a mix-up would show above.
  const ChoiceItem& first = task.choice_items[0];
  EXPECT_GT(std::abs(t.loglikelihood(first.context, " a cup", task.choice_items[1].images) -
                     t.loglikelihood(first.context, " a cup", first.images)), 1e-3);
}

// Qwen2-VL: images of different sizes take different counts, M-RoPE positions continue through the scorer's
// left padding and its copied cache rows.
fs::path qwen_dir() { return assets() / "reference/qwen2_vl/tiny-qwen2-vl"; }

struct TinyQwen {
  CausalLM model = load_causal_lm(qwen_dir());
  std::shared_ptr<TextTokenizer> tokenizer = load_tokenizer(qwen_dir());
  ImageEncoding images = make_image_encoding(qwen_dir(), *load_decoder_config(qwen_dir()).multimodal);
  TinyQwen() { model->eval(); }

  // The text with each <image> as Qwen2-VL's markup, tokenised (no BOS), each image token expanded.
  std::pair<std::vector<int64_t>, ImageInputs> encode(const std::string& text, const std::vector<fs::path>& files) const {
    std::string marked;
    size_t from = 0;
    for (size_t at = text.find("<image>"); at != std::string::npos; at = text.find("<image>", from)) {
      marked += text.substr(from, at - from) + "<|vision_start|><|image_pad|><|vision_end|>";
      from = at + 7;
    }
    marked += text.substr(from);
    const std::vector<int> ids = tokenizer->encode_with_special_tokens(marked);
    Sample s;
    std::vector<int64_t> counts;
    for (const auto& f : files) {
      vision::ProcessedImage p = process_image_file(f, images);
      counts.push_back(p.tokens);
      s.pixel_values.push_back(p.pixel_values);
      s.image_grids.push_back(p.grid_thw);
    }
    const std::vector<int> expanded = expand_image_tokens(ids, 1012, counts);
    return {std::vector<int64_t>(expanded.begin(), expanded.end()), batch_images({&s})};
  }
  double loglikelihood(const std::string& context, const std::string& continuation, const std::vector<fs::path>& files) {
    const auto [ctx, unused] = encode(context, files);
    const auto [whole, inputs] = encode(context + continuation, files);
    at::NoGradGuard no_grad;
    ForwardOptions o;
    o.pixel_values = inputs.pixel_values;
    o.image_grid_thw = inputs.image_grid_thw;
    const at::Tensor lp =
        at::log_softmax(model->forward(at::tensor(whole, at::kLong).view({1, -1}), o).squeeze(0).to(at::kDouble), -1);
    double sum = 0;
    for (size_t t = ctx.size(); t < whole.size(); ++t) sum += lp[static_cast<int64_t>(t) - 1][whole[t]].item<double>();
    return sum;
  }
};

TEST(EvalImagesScoring, Qwen2VLMultipleChoiceEqualsHandScoredForward) {
  SWIFTCPP_REQUIRE_SHARED(qwen_dir() / "model.safetensors");
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  const fs::path dir = temp_dir("eval_images_qwen2_vl");
  const std::string I = images_dir().string();
  // Prompts of different lengths (left padding in one batch), images of 12 and 16 tokens, one item with two, and
  // multi-token choices (the scorer's second pass over copied cache rows).
  const fs::path yaml = write_task(dir,
      R"({"q": "What is in the picture?", "image": ")" + I + R"(/coffee.jpg", "choices": ["a cup of coffee", "a rocket", "a cat"], "answer": 0})" "\n"
      R"({"q": "What?", "image": ")" + I + R"(/astronaut_224.png", "choices": ["a cup", "an astronaut in space", "a cat"], "answer": 1})" "\n"
      R"({"q": "First <image> then <image>: which one is a cat", "image": [")" + I + R"(/chelsea_rgba.png", ")" + I +
      R"(/camera.png"], "choices": ["the first", "the second one"], "answer": 0})" "\n");
  const Task task = load_task(yaml.string(), "", {});
  TinyQwen t;
  EvalOptions options;
  options.scorer.batch_size = 3;
  options.log_samples = true;
  options.model_dir = qwen_dir();
  Evaluator evaluator(t.model, t.tokenizer, options);
  const TaskResult r = evaluator.run(task);
  ASSERT_EQ(r.samples.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const ChoiceItem& item = task.choice_items[i];
    const std::vector<double> got = r.samples[i]["loglikelihoods"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), item.choices.size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_NEAR(got[j], t.loglikelihood(item.context, " " + item.choices[j], files(item.images)), 1e-4)
          << "item " << i << " choice " << j;
    }
  }
}

TEST(EvalImagesScoring, GenerationEqualsHandGreedyWithImages) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "model.safetensors");
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  const fs::path dir = temp_dir("eval_images_gen");
  const std::string I = images_dir().string();
  write(dir / "data.jsonl",
        R"({"q": "Describe the picture.", "image": ")" + I + R"(/coffee.jpg", "a": "cup"})" "\n"
        R"({"q": "What?", "image": ")" + I + R"(/rocket.jpg", "a": "rocket"})" "\n"
        R"({"q": "Name both.", "image": [")" + I + R"(/astronaut_224.png", ")" + I + R"(/camera.png"], "a": "x"})" "\n");
  write(dir / "gen.yaml", "name: g\ntype: generation\ndata: data.jsonl\nprompt: \"{q}\"\nanswer: \"{a}\"\n"
                          "max_new_tokens: 6\nimage_field: image\n");
  const Task task = load_task((dir / "gen.yaml").string(), "", {});
  TinyLlava t;
  EvalOptions options;
  options.scorer.batch_size = 2;
  options.log_samples = true;
  options.model_dir = llava_dir();
  Evaluator evaluator(t.model, t.tokenizer, options);
  const TaskResult r = evaluator.run(task);
  ASSERT_EQ(r.samples.size(), 3u);
  Generator generator(t.model, t.tokenizer);
  GenerationConfig config;
  config.max_new_tokens = 6;
  config.sampling.temperature = 0.0;
  for (int id : t.tokenizer->specials().eos) config.eos_ids.push_back(id);
  for (size_t i = 0; i < 3; ++i) {
    const GenerationItem& item = task.generation_items[i];
    // Greedy by hand: the whole sequence re-run for every new token, no cache, no padding.
    std::vector<int64_t> ids = t.expand(t.encode(item.context));
    const std::vector<int64_t> prompt = ids;
    const at::Tensor pixels = t.pixels(files(item.images));
    std::vector<int64_t> greedy;
    for (int step = 0; step < 6; ++step) {
      const int64_t next = t.logits(ids, pixels)[-1].argmax().item<int64_t>();
      greedy.push_back(next);
      ids.push_back(next);
      if (t.tokenizer->is_eos(static_cast<int>(next))) break;
    }
    // The generator alone on this prompt gives those ids; the evaluator's batched response is its text.
    const auto single = generator.generate({prompt}, config, {}, {ImageInputs{pixels, {}}});
    EXPECT_EQ(single[0].new_ids, greedy) << "item " << i;
    EXPECT_EQ(r.samples[i]["response"].get<std::string>(), single[0].text) << "item " << i;
    EXPECT_EQ(r.samples[i]["exact_match"]["none"].get<int>(), single[0].text == item.target ? 1 : 0);
  }
}

TEST(EvalImagesErrors, TextModelCorruptImageAndCutImagesAreRefused) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "model.safetensors");
  const fs::path dir = temp_dir("eval_images_errors");
  write(dir / "bad.png", "\x89PNG\r\n\x1a\n but then nothing of a PNG");
  const std::string I = images_dir().string();
  const fs::path yaml = write_task(dir,
      R"({"q": "Q?", "image": ")" + I + R"(/coffee.jpg", "choices": ["a", "b"], "answer": 0})" "\n"
      R"({"q": "Q?", "image": "bad.png", "choices": ["a", "b"], "answer": 0})" "\n");
  const Task task = load_task(yaml.string(), "", {});

  // A text model: refused before anything is scored, naming the task.
  CausalLM text_model = load_causal_lm(test::stories_dir());
  Evaluator text_eval(text_model, load_tokenizer(test::stories_dir()), {});
  std::string msg = error_of<ConfigError>([&] { text_eval.check(task); });
  EXPECT_TRUE(contains(msg, "task pics") && contains(msg, "text model")) << msg;
  EXPECT_TRUE(contains(error_of<ConfigError>([&] { text_eval.run(task); }), "task pics"));

  TinyLlava t;
  EvalOptions options;
  options.model_dir = llava_dir();
  Evaluator evaluator(t.model, t.tokenizer, options);
  // A corrupt image names the data file:line and the image.
  msg = error_of<FormatError>([&] { evaluator.run(task); });
  EXPECT_TRUE(contains(msg, "data.jsonl:2") && contains(msg, "bad.png")) << msg;
  // Without the model folder the images cannot be prepared.
  Evaluator no_dir(t.model, t.tokenizer, {});
  EXPECT_TRUE(contains(error_of<ConfigError>([&] { no_dir.check(task); }), "preprocessor_config.json"));

  // A context that must be cut from the left into its image run is refused, never scored with half an image.
  const fs::path long_yaml = write_task(dir / "long",
      R"({"q": "one two three four five six seven eight nine ten", "image": ")" + I +
      R"(/coffee.jpg", "choices": ["a", "b"], "answer": 0})" "\n");
  EvalOptions short_options = options;
  short_options.scorer.max_length = 24;  // 16 image positions + BOS + the question do not fit
  Evaluator short_eval(t.model, t.tokenizer, short_options);
  msg = error_of<ConfigError>([&] { short_eval.run(load_task(long_yaml.string(), "", {})); });
  EXPECT_TRUE(contains(msg, "cut into its images")) << msg;
  // "<image>" written in a text task's prompt on a vision-language model: an image token without an image.
  write(dir / "text.yaml", "name: t\ndata: data.jsonl\nprompt: \"<image> {q}\"\nchoices: choices\nanswer: answer\n");
  msg = error_of<FormatError>([&] { evaluator.run(load_task((dir / "text.yaml").string(), "", {})); });
  EXPECT_TRUE(contains(msg, "data.jsonl:1") && contains(msg, "0 image")) << msg;
}

}  // namespace
}  // namespace swiftcpp::eval
