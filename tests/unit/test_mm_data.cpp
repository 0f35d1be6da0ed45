// Vision-language data: rows with images (every form, path resolution, counts), the llava chat template, encoding
// with expanded image-token runs (labels, truncation, unreadable images), collation order of pixel_values, the
// data cache with images, ChunkFlow boundaries that never cut an image's run, and preference and KTO rows with
// images (encoded as SFT encodes them, the prompt's images decoded once for both answers). Real images from
// ../shared/assets/images and the tiny-llava tokenizer (`<image>` = 512, 16 features per image, 56 px).
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "core/error.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/pipeline.h"
#include "data/preference_data.h"
#include "template/template.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/chunkflow.h"
#include "vision/image.h"
#include "vision/processor.h"

namespace swiftcpp {
namespace {

using test::expect_error;

constexpr int32_t kImageId = 512;
constexpr int64_t kPerImage = 16;

fs::path images_dir() { return test::assets() / "images"; }
fs::path llava_dir() { return test::assets() / "reference" / "llava"; }
fs::path tiny_llava() { return llava_dir() / "tiny-llava"; }

#define MM_REQUIRE_ASSETS()                                  \
  do {                                                       \
    SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");    \
    SWIFTCPP_REQUIRE_SHARED(tiny_llava() / "tokenizer.model"); \
  } while (0)

std::string reason_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const BadRowError& e) {
    if (message != nullptr) *message = e.what();
    return e.reason();
  }
  return "";
}

Conversation row(const std::string& json, const fs::path& base = {}) {
  return normalise_row(Json::parse(json), "d.jsonl:4", std::nullopt, base);
}

// ---------------------------------------------------------------------------------------------------------------
// Rows.

TEST(MmDataRows, EveryFormGivesTheImagesInPlaceholderOrder) {
  const fs::path base = "/data/set";
  Conversation c = row(R"({"messages": [{"role": "user", "content": "<image>What is this?"},
                                        {"role": "assistant", "content": "A cup."}], "images": ["a.jpg"]})", base);
  EXPECT_EQ(c.images, std::vector<fs::path>{"/data/set/a.jpg"});
  EXPECT_EQ(c.messages[0].content, "<image>What is this?");

  c = row(R"({"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}],
              "images": "one.png"})", base);
  EXPECT_EQ(c.images, std::vector<fs::path>{"/data/set/one.png"});

  c = row(R"({"messages": [{"role": "user", "content": "<image><image>"}, {"role": "assistant", "content": "x"}],
              "images": [{"path": "p.png"}, "/abs/q.jpg"]})", base);
  EXPECT_EQ(c.images, (std::vector<fs::path>{"/data/set/p.png", "/abs/q.jpg"}));

  // Content parts: an image part becomes the placeholder at its place; image_url with a local (file://) path.
  c = row(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image", "image": "a.jpg"},
                                   {"type": "text", "text": " and "}, {"type": "image_url", "image_url": {"url": "file:///x/b.png"}}]},
      {"role": "assistant", "content": "Same."},
      {"role": "user", "content": [{"type": "image", "image": {"path": "c.jpg"}}, {"type": "text", "text": "And?"}]},
      {"role": "assistant", "content": "Different."}]})", base);
  EXPECT_EQ(c.messages[0].content, "Compare <image> and <image>");
  EXPECT_EQ(c.messages[2].content, "<image>And?");
  EXPECT_EQ(c.images, (std::vector<fs::path>{"/data/set/a.jpg", "/x/b.png", "/data/set/c.jpg"}));

  c = row(R"({"conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "Cat."}],
              "images": ["cat.png"]})", base);
  EXPECT_EQ(c.format, RowFormat::kShareGpt);
  EXPECT_EQ(c.images, std::vector<fs::path>{"/data/set/cat.png"});

  c = row(R"({"instruction": "<image>Name it.", "output": "Rocket", "images": ["r.jpg"]})", base);
  EXPECT_EQ(c.format, RowFormat::kAlpaca);
  EXPECT_EQ(c.images, std::vector<fs::path>{"/data/set/r.jpg"});

  c = row(R"({"query": "<image>?", "response": "Man", "history": [["<image>first", "ok"]], "images": ["1.png", "2.png"]})",
          base);
  EXPECT_EQ(c.images, (std::vector<fs::path>{"/data/set/1.png", "/data/set/2.png"}));

  c = row(R"({"text": "<image>A cup of coffee.", "images": ["coffee.jpg"]})", base);
  EXPECT_EQ(c.format, RowFormat::kText);
  EXPECT_EQ(c.images, std::vector<fs::path>{"/data/set/coffee.jpg"});
}

TEST(MmDataRows, RelativePathsStartAtTheDatasetFolderAbsoluteOnesAreKept) {
  const std::string json = R"({"messages": [{"role": "user", "content": "<image><image>"},
                                            {"role": "assistant", "content": "x"}], "images": ["sub/a.jpg", "/abs/b.jpg"]})";
  EXPECT_EQ(row(json, "rel/dir").images, (std::vector<fs::path>{"rel/dir/sub/a.jpg", "/abs/b.jpg"}));
  EXPECT_EQ(row(json).images, (std::vector<fs::path>{"sub/a.jpg", "/abs/b.jpg"}));  // no folder given: as written
}

TEST(MmDataRows, CountMismatchNamesBothCounts) {
  std::string message;
  EXPECT_EQ(reason_of([&] {
              row(R"({"messages": [{"role": "user", "content": "<image> and <image>"}, {"role": "assistant", "content": "x"}],
                      "images": ["a.jpg"]})");
            }, &message),
            "image count mismatch");
  EXPECT_NE(message.find("d.jsonl:4"), std::string::npos) << message;
  EXPECT_NE(message.find("2 <image> placeholder(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("1 image(s)"), std::string::npos) << message;
  // Placeholders count over all messages, history included; an empty list declares zero images.
  EXPECT_EQ(reason_of([&] { row(R"({"query": "q", "response": "r", "history": [["<image>", "a"]], "images": []})"); }),
            "image count mismatch");
  EXPECT_EQ(reason_of([&] { row(R"({"text": "no placeholder", "images": ["a.jpg"]})"); }), "image count mismatch");
}

TEST(MmDataRows, MalformedImagesAndImagesInAssistantTurnsAreBadRows) {
  const std::string turns = R"("messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}])";
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": 5})"); }), "bad images");
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": [3]})"); }), "bad images");
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": [{"bytes": "..."}]})"); }), "bad images");
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": [""]})"); }), "bad images");
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": ["https://x.org/a.jpg"]})"); }), "bad images");
  EXPECT_EQ(reason_of([&] { row("{" + turns + R"(, "images": ["a\u0000.jpg"]})"); }), "bad images");
  EXPECT_EQ(reason_of([&] {
              row(R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}]},
                                   {"role": "assistant", "content": "x"}], "images": ["b.jpg"]})");
            }),
            "images given twice");
  EXPECT_EQ(reason_of([&] {
              row(R"({"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": [{"type": "image", "image": "a.jpg"}]}]})");
            }),
            "image in an assistant message");
  EXPECT_EQ(reason_of([&] {
              row(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<image>"}],
                      "images": ["a.jpg"]})");
            }),
            "image in an assistant message");
  EXPECT_EQ(reason_of([&] {
              row(R"({"messages": [{"role": "user", "content": [{"type": "video", "video": "a.mp4"}]},
                                   {"role": "assistant", "content": "x"}]})");
            }),
            "non-text content");
}

// Without any image the row is text: a literal "<image>" stays text (the vision encoder refuses it later).
TEST(MmDataRows, RowsWithoutImagesKeepPlaceholderText) {
  const Conversation c = row(R"({"messages": [{"role": "user", "content": "<image> tag"}, {"role": "assistant", "content": "ok"}]})");
  EXPECT_TRUE(c.images.empty());
  EXPECT_EQ(c.messages[0].content, "<image> tag");
  EXPECT_EQ(count_image_placeholders("<image><image>x<image"), 2);
}

// ---------------------------------------------------------------------------------------------------------------
// The llava template.

std::vector<std::string> trainable_texts(const std::vector<TemplateSegment>& segments) {
  std::vector<std::string> out;
  for (const auto& s : segments) {
    if (s.trainable) out.push_back(s.text);
  }
  return out;
}

TEST(MmDataTemplate, LlavaRendersVicunaV1TurnsAndTrainsFromTheSpaceThroughEos) {
  const auto t = make_chat_template("llava");
  const std::vector<ChatMessage> one = {{"user", "<image>\nWhat is this?", {}}, {"assistant", "A cup.", {}}};
  EXPECT_EQ(t->render_text(one, false), "<s>USER: <image>\nWhat is this? ASSISTANT: A cup.</s>");
  EXPECT_EQ(t->render_text({one[0]}, true), "<s>USER: <image>\nWhat is this? ASSISTANT:");
  EXPECT_EQ(trainable_texts(t->render(one, false)), std::vector<std::string>{" A cup.</s>"});

  const std::vector<ChatMessage> two = {{"system", "Be brief.", {}}, {"user", "Q1", {}}, {"assistant", "A1", {}},
                                        {"user", "Q2", {}},          {"assistant", "A2", {}}};
  const auto segments = t->render(two, false);
  EXPECT_EQ(t->render_text(two, false), "<s>Be brief. USER: Q1 ASSISTANT: A1</s>USER: Q2 ASSISTANT: A2</s>");
  EXPECT_EQ(trainable_texts(segments), (std::vector<std::string>{" A1</s>", " A2</s>"}));
  ASSERT_EQ(segments.size(), 4u);
  EXPECT_EQ(segments[0].text, "<s>Be brief. USER: Q1 ASSISTANT:");
  EXPECT_EQ(segments[2].text, "USER: Q2 ASSISTANT:");
  // The tokenizer's own BOS/EOS texts replace the defaults.
  EXPECT_EQ(make_chat_template("llava", {"<bos>", "<eos>"})->render_text({{"user", "U", {}}, {"assistant", "A", {}}}, false),
            "<bos>USER: U ASSISTANT: A<eos>");
}

fs::path folder_with(const std::string& name, const std::map<std::string, std::string>& files) {
  const fs::path dir = test::temp_dir("mm_detect_" + name);
  for (const auto& [file, text] : files) write_file_atomic(dir / file, text);
  return dir;
}

TEST(MmDataTemplate, DetectsLlavaByTemplateOrByModelType) {
  const std::string vicuna = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ 'USER: ' + "
                             "m['content'] + ' ' }}{% else %}{{ 'ASSISTANT: ' + m['content'] + eos_token }}{% endif %}"
                             "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";
  EXPECT_EQ(detect_chat_template(folder_with("vicuna", {{"tokenizer_config.json", Json{{"chat_template", vicuna}}.dump()}})),
            "llava");
  // llava-hf's processor template spells the roles as role.upper() + ': '.
  const std::string hf = "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() "
                         "+ ': '}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";
  EXPECT_EQ(detect_chat_template(folder_with("llava_hf", {{"chat_template.json", Json{{"chat_template", hf}}.dump()}})),
            "llava");
  // No chat template: model_type llava says it; any other model_type stays raw text.
  EXPECT_EQ(detect_chat_template(folder_with("llava_cfg", {{"config.json", R"({"model_type": "llava"})"}})), "llava");
  EXPECT_EQ(detect_chat_template(folder_with("llama_cfg", {{"config.json", R"({"model_type": "llama"})"}})), "");
  SWIFTCPP_REQUIRE_SHARED(tiny_llava() / "config.json");
  EXPECT_EQ(detect_chat_template(tiny_llava()), "llava");
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding.

std::shared_ptr<const vision::ImageProcessorConfig> tiny_processor() {
  return std::make_shared<const vision::ImageProcessorConfig>(vision::load_image_processor_config(tiny_llava()));
}

EncodeOptions vision_options(int64_t max_length = 2048) {
  EncodeOptions o;
  o.max_length = max_length;
  o.images = make_image_encoding(tiny_llava(), kImageId, kPerImage);
  return o;
}

SampleEncoder llava_encoder(const EncodeOptions& options) {
  const auto tok = load_tokenizer(tiny_llava());
  return SampleEncoder(tok, chat_template_for(*tok, "llava"), options);
}

at::Tensor expected_pixels(const fs::path& file) {
  return vision::preprocess_image(vision::read_image(file), *tiny_processor());
}

std::vector<int64_t> run_starts(const std::vector<int32_t>& ids) {
  std::vector<int64_t> starts;
  for (const TokenSpan& run : image_token_runs(ids, {kImageId, kPerImage})) starts.push_back(run.begin);
  return starts;
}

TEST(MmDataEncode, ImageSettingsNeedATokenizerThatKnowsTheImageToken) {
  MM_REQUIRE_ASSETS();
  const auto stories = load_tokenizer(test::stories_dir());  // the same vocabulary without "<image>"
  EncodeOptions o = vision_options();
  o.images->model_dir = test::stories_dir();
  expect_error<ConfigError>([&] { SampleEncoder(stories, make_chat_template("llava"), o); },
                            {test::stories_dir().string(), "<image>", "512"});
  EncodeOptions wrong_id = vision_options();
  wrong_id.images->image_token_id = 7;
  expect_error<ConfigError>([&] { llava_encoder(wrong_id); }, {"<image>", "[512]", "7"});
  EncodeOptions no_run = vision_options();
  no_run.images->tokens_per_image = 0;
  EXPECT_THROW(llava_encoder(no_run), ConfigError);
}

// One image in the prompt: ids equal tokenising the rendered text and expanding the image token; no position is
// trained to predict an image token; pixel_values equal reading and preprocessing the file directly.
TEST(MmDataEncode, ExpandsEachImageToARunThatIsNeverATarget) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = images_dir();
  const Conversation c = row(R"({"messages": [{"role": "user", "content": "<image>\nWhat is this?"},
                                              {"role": "assistant", "content": "A cup of coffee."},
                                              {"role": "user", "content": "And this? <image>"},
                                              {"role": "assistant", "content": "An astronaut."}],
                                 "images": ["coffee.jpg", "astronaut_224.png"]})", dir);
  const SampleEncoder enc = llava_encoder(vision_options());
  const auto s = enc.encode(c);
  ASSERT_TRUE(s.has_value());
  const auto tok = load_tokenizer(tiny_llava());
  const std::string text = make_chat_template("llava")->render_text(c.messages, false);
  const std::vector<int> unexpanded = tokenize_rendered(*tok, text);
  EXPECT_EQ(std::count(unexpanded.begin(), unexpanded.end(), kImageId), 2);
  EXPECT_EQ(std::vector<int>(s->input_ids.begin(), s->input_ids.end()), expand_image_tokens(unexpanded, kImageId, kPerImage));
  const auto starts = run_starts(s->input_ids);
  ASSERT_EQ(starts.size(), 2u);
  for (size_t t = 0; t < s->labels.size(); ++t) EXPECT_NE(s->labels[t], kImageId) << t;
  for (int64_t start : starts) {
    EXPECT_EQ(s->labels[static_cast<size_t>(start - 1)], kIgnoreIndex);  // the position before a run
    for (int64_t t = start; t < start + kPerImage; ++t) EXPECT_EQ(s->labels[static_cast<size_t>(t)], kIgnoreIndex) << t;
  }
  // Trained text is exactly the two answers and their EOS.
  std::vector<int> targets;
  for (int32_t l : s->labels) {
    if (l != kIgnoreIndex) targets.push_back(l);
  }
  EXPECT_EQ(tok->decode_with_special_tokens(targets), "A cup of coffee.</s>An astronaut.</s>");
  // The space after "ASSISTANT:" is trained with the answer (a piece starting with U+2581).
  EXPECT_EQ(tok->id_to_piece(targets[0]).rfind("\u2581", 0), 0u) << tok->id_to_piece(targets[0]);
  ASSERT_EQ(s->pixel_values.size(), 2u);
  EXPECT_EQ(s->pixel_values[0].sizes(), (at::IntArrayRef{3, 56, 56}));
  EXPECT_EQ(s->pixel_values[0].scalar_type(), at::kFloat);
  EXPECT_TRUE(s->pixel_values[0].equal(expected_pixels(dir / "coffee.jpg")));
  EXPECT_TRUE(s->pixel_values[1].equal(expected_pixels(dir / "astronaut_224.png")));
}

// As Hugging Face's LLaVA computes its loss: the last image position predicts the token after the run when that
// token is trained (a captioning text row), while nothing ever predicts an image token.
TEST(MmDataEncode, LastImagePositionPredictsTrainedTextAfterTheRun) {
  MM_REQUIRE_ASSETS();
  const Conversation c = row(R"({"text": "<image>A cup of coffee.", "images": ["coffee.jpg"]})", images_dir());
  const auto s = llava_encoder(vision_options()).encode(c);
  ASSERT_TRUE(s.has_value());
  const auto starts = run_starts(s->input_ids);
  ASSERT_EQ(starts, std::vector<int64_t>{1});  // after BOS
  EXPECT_EQ(s->labels[0], kIgnoreIndex);
  for (int64_t t = 1; t < kPerImage; ++t) EXPECT_EQ(s->labels[static_cast<size_t>(t)], kIgnoreIndex);
  EXPECT_EQ(s->labels[kPerImage], s->input_ids[kPerImage + 1]);  // the last image position -> the caption's start
  EXPECT_EQ(s->input_ids.back(), 2);
  EXPECT_EQ(s->pixel_values.size(), 1u);
}

TEST(MmDataEncode, MissingAndCorruptImagesAreBadRowsNamingRowAndFile) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = test::temp_dir("mm_corrupt");
  std::ifstream in(images_dir() / "coffee.jpg", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file_atomic(dir / "truncated.jpg", bytes.substr(0, bytes.size() / 2));
  write_file_atomic(dir / "not_an_image.png", "hello");
  const SampleEncoder enc = llava_encoder(vision_options());
  for (const std::string name : {"missing.jpg", "truncated.jpg", "not_an_image.png"}) {
    const Conversation c = row(R"({"messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}],
                                   "images": [")" + name + R"("]})", dir);
    std::string message;
    EXPECT_EQ(reason_of([&] { enc.encode(c); }, &message), "image unreadable") << name;
    EXPECT_NE(message.find("d.jsonl:4"), std::string::npos) << message;
    EXPECT_NE(message.find((dir / name).string()), std::string::npos) << message;
  }
}

TEST(MmDataEncode, ImagesNeedAVisionModelAndMatchingImageTokens) {
  MM_REQUIRE_ASSETS();
  const auto tok = load_tokenizer(tiny_llava());
  const Conversation with_image = row(R"({"messages": [{"role": "user", "content": "<image>"},
                                                       {"role": "assistant", "content": "x"}], "images": ["coffee.jpg"]})",
                                      images_dir());
  EXPECT_EQ(reason_of([&] { SampleEncoder(tok, chat_template_for(*tok, "llava"), {}).encode(with_image); }),
            "images need a vision-language model");
  // A text row holding "<image>" on a vision model: the token has no image.
  const Conversation stray = row(R"({"messages": [{"role": "user", "content": "<image> tag"}, {"role": "assistant", "content": "x"}]})");
  std::string message;
  EXPECT_EQ(reason_of([&] { llava_encoder(vision_options()).encode(stray); }, &message), "image count mismatch");
  EXPECT_NE(message.find("1 image token(s)"), std::string::npos) << message;
  const Conversation answer = row(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<image>"}]})");
  EXPECT_EQ(reason_of([&] { llava_encoder(vision_options()).encode(answer); }), "image in an assistant message");
}

// Truncation never cuts a run: a cut inside one drops that image whole (tokens and pixel_values); "delete"
// drops the row.
TEST(MmDataEncode, TruncationDropsAnImageWhoseRunItWouldCut) {
  MM_REQUIRE_ASSETS();
  const Conversation c = row(R"({"messages": [{"role": "user", "content": "<image> and <image> compared"},
                                              {"role": "assistant", "content": "The first is a cup, the second a rocket."}],
                                 "images": ["coffee.jpg", "rocket.jpg"]})", images_dir());
  const auto full = llava_encoder(vision_options()).encode(c);
  ASSERT_TRUE(full.has_value());
  const int64_t n = static_cast<int64_t>(full->input_ids.size());
  const auto starts = run_starts(full->input_ids);
  ASSERT_EQ(starts.size(), 2u);

  EncodeOptions o = vision_options(starts[1] + 5);  // right: the cut falls inside the second run
  o.truncation = TruncationStrategy::kRight;
  // Right truncation keeps the prompt only, which trains nothing: the row is dropped.
  EXPECT_FALSE(llava_encoder(o).encode(c).has_value());

  o = vision_options(n - starts[0] - 3);  // left: the cut falls inside the first run
  o.truncation = TruncationStrategy::kLeft;
  auto s = llava_encoder(o).encode(c);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(static_cast<int64_t>(s->input_ids.size()), n - starts[0] - kPerImage);  // starts right after run 1
  EXPECT_EQ(run_starts(s->input_ids).size(), 1u);
  ASSERT_EQ(s->pixel_values.size(), 1u);
  EXPECT_TRUE(s->pixel_values[0].equal(full->pixel_values[1]));  // the rocket stays
  EXPECT_EQ(s->label_tokens(), full->label_tokens());

  o = vision_options(n - starts[0]);  // left: the cut falls right before the first run, nothing dropped
  o.truncation = TruncationStrategy::kLeft;
  s = llava_encoder(o).encode(c);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->pixel_values.size(), 2u);
  EXPECT_EQ(run_starts(s->input_ids), (std::vector<int64_t>{0, starts[1] - starts[0]}));

  o = vision_options(n - 1);
  EXPECT_FALSE(llava_encoder(o).encode(c).has_value());  // delete
}

TEST(MmDataEncode, TruncationRightKeepsImagesBeforeTheCut) {
  MM_REQUIRE_ASSETS();
  // A captioning text row: everything after the images is trained, so a right cut leaves trained tokens.
  const Conversation c = row(R"({"text": "<image> then <image> and a long caption after both images.",
                                 "images": ["coffee.jpg", "camera.png"]})", images_dir());
  const auto full = llava_encoder(vision_options()).encode(c);
  ASSERT_TRUE(full.has_value());
  const auto starts = run_starts(full->input_ids);
  ASSERT_EQ(starts.size(), 2u);
  EncodeOptions o = vision_options(starts[1] + 3);
  o.truncation = TruncationStrategy::kRight;
  const auto s = llava_encoder(o).encode(c);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(static_cast<int64_t>(s->input_ids.size()), starts[1]);  // ends where the cut run began
  ASSERT_EQ(s->pixel_values.size(), 1u);
  EXPECT_TRUE(s->pixel_values[0].equal(full->pixel_values[0]));
  EXPECT_EQ(s->labels.back(), kIgnoreIndex);
}

TEST(MmDataEncode, PromptsWithImages) {
  MM_REQUIRE_ASSETS();
  const SampleEncoder enc = llava_encoder(vision_options());
  const auto tok = load_tokenizer(tiny_llava());
  const std::vector<ChatMessage> prompt = {{"user", "<image>\nWhat is in the image?", {}}};
  const EncodedPrompt p = enc.encode_prompt(prompt, {images_dir() / "chelsea_rgba.png"});
  const std::vector<int> plain = tokenize_rendered(*tok, "<s>USER: <image>\nWhat is in the image? ASSISTANT:");
  EXPECT_EQ(p.ids, expand_image_tokens(plain, kImageId, kPerImage));
  // The same ids as transformers' LlavaProcessor gives for the model card's prompt (before expansion).
  if (const fs::path file = llava_dir() / "llava_logits.json"; fs::exists(file)) {
    EXPECT_EQ(plain, load_json_file(file).at("tokenizer_check").at("llava_processor").at("input_ids").get<std::vector<int>>());
  }
  ASSERT_EQ(p.pixel_values.size(), 1u);
  EXPECT_TRUE(p.pixel_values[0].equal(expected_pixels(images_dir() / "chelsea_rgba.png")));
  // The prompt text of training and inference tokenise alike: the trained sample starts with the prompt's ids.
  const Conversation c = row(R"({"messages": [{"role": "user", "content": "<image>\nWhat is in the image?"},
                                              {"role": "assistant", "content": "A cat."}], "images": ["chelsea_rgba.png"]})",
                             images_dir());
  const auto s = enc.encode(c);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(std::vector<int>(s->input_ids.begin(), s->input_ids.begin() + static_cast<std::ptrdiff_t>(p.ids.size())), p.ids);

  expect_error<ConfigError>([&] { enc.encode_prompt(prompt, std::vector<fs::path>{}); }, {"1 <image> placeholder(s)", "0 image(s)"});
  expect_error<ConfigError>([&] { enc.encode_prompt({{"user", "hi", {}}}, {images_dir() / "coffee.jpg"}); },
                            {"0 <image> placeholder(s)", "1 image(s)"});
  expect_error<IoError>([&] { enc.encode_prompt(prompt, {images_dir() / "absent.jpg"}); }, {"absent.jpg"});
  const SampleEncoder text_only(tok, chat_template_for(*tok, "llava"), {});
  expect_error<ConfigError>([&] { text_only.encode_prompt(prompt, {images_dir() / "coffee.jpg"}); },
                            {"vision-language model"});
  EXPECT_EQ(text_only.encode_prompt(prompt), plain);  // the text-only call is unchanged
  EXPECT_EQ(enc.encode_prompt({{"user", "hi", {}}}), enc.encode_prompt({{"user", "hi", {}}}, std::vector<fs::path>{}).ids);
}

// transformers 4.40 leaves one image token per image; the reference data holds the expanded layout.
TEST(MmDataEncode, ExpandImageTokensMatchesTheReferenceLayout) {
  const fs::path file = llava_dir() / "llava_logits.json";
  SWIFTCPP_REQUIRE_SHARED(file);
  const Json cases = load_json_file(file).at("cases");
  for (const char* name : {"a_one_image", "b_two_images"}) {
    const std::vector<int> ids = cases.at(name).at("input_ids").at(0).get<std::vector<int>>();
    const std::vector<int> expanded = cases.at(name).at("input_ids_expanded").at(0).get<std::vector<int>>();
    EXPECT_EQ(expand_image_tokens(ids, kImageId, cases.at(name).at("n_features_per_image").get<int64_t>()), expanded)
        << name;
  }
  EXPECT_THROW(expand_image_tokens({1, 512}, kImageId, 0), ConfigError);
}

// The tokenizer reproduces Hugging Face's slow LlamaTokenizer on prompts with "<image>" (reference encodings).
TEST(MmDataEncode, TinyLlavaTokenizerMatchesTheReferenceEncodings) {
  const fs::path file = llava_dir() / "llava_logits.json";
  SWIFTCPP_REQUIRE_SHARED(file);
  SWIFTCPP_REQUIRE_SHARED(tiny_llava() / "tokenizer.model");
  const auto tok = load_tokenizer(tiny_llava());
  for (const Json& e : load_json_file(file).at("tokenizer_check").at("encodings")) {
    const std::string text = e.at("text").get<std::string>();
    EXPECT_EQ(tokenize_rendered(*tok, text), e.at("ids").get<std::vector<int>>()) << text;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Collation.

Sample sample_with_images(int32_t tag, int64_t images, int64_t side = 4) {
  Sample s;
  s.input_ids = {1, tag};
  s.labels = {tag, kIgnoreIndex};
  for (int64_t i = 0; i < images; ++i) {
    s.pixel_values.push_back(at::full({3, side, side}, static_cast<float>(tag * 10 + i)));
    s.input_ids.insert(s.input_ids.begin() + 1, 2, kImageId);  // two tokens per image in these tests
    s.labels.insert(s.labels.begin() + 1, 2, kIgnoreIndex);
  }
  return s;
}

std::vector<float> image_tags(const at::Tensor& pixel_values) {
  std::vector<float> tags;
  for (int64_t i = 0; i < pixel_values.size(0); ++i) tags.push_back(pixel_values[i][0][0][0].item<float>());
  return tags;
}

TEST(MmDataCollate, PaddedAndPackedBatchesStackImagesInRowMajorRunOrder) {
  const Sample a = sample_with_images(1, 2), b = sample_with_images(2, 0), c = sample_with_images(3, 1),
               d = sample_with_images(4, 1);
  const Batch padded = collate_padded({&a, &b, &c}, 0);
  ASSERT_TRUE(padded.pixel_values.defined());
  EXPECT_EQ(padded.pixel_values.sizes(), (at::IntArrayRef{3, 3, 4, 4}));
  EXPECT_EQ(image_tags(padded.pixel_values), (std::vector<float>{10, 11, 30}));
  const Batch packed = collate_packed({{&c, &a}, {&b, &d}}, 0);
  EXPECT_EQ(image_tags(packed.pixel_values), (std::vector<float>{30, 10, 11, 40}));
  // The images follow the runs of image tokens row by row.
  int64_t runs = 0;
  for (int64_t r = 0; r < packed.input_ids.size(0); ++r) {
    const at::Tensor row_ids = packed.input_ids[r];
    std::vector<int32_t> ids(row_ids.numel());
    for (int64_t t = 0; t < row_ids.numel(); ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>(row_ids[t].item<int64_t>());
    runs += static_cast<int64_t>(image_token_runs(ids, {kImageId, 2}).size());
  }
  EXPECT_EQ(runs, packed.pixel_values.size(0));
  EXPECT_FALSE(collate_padded({&b}, 0).pixel_values.defined());
  const Sample big = sample_with_images(5, 1, 6);
  expect_error<ConfigError>([&] { collate_padded({&a, &big}, 0); }, {"different sizes", "[3, 4, 4]", "[3, 6, 6]"});
}

TEST(MmDataCollate, ImageTokenRunsSplitNeighboursAndRefuseCutImages) {
  const std::vector<int32_t> ids = {1, 9, 9, 9, 9, 5, 9, 9, 2};
  const auto runs = image_token_runs(ids, {9, 2});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].begin, 1);
  EXPECT_EQ(runs[1].begin, 3);
  EXPECT_EQ(runs[2].begin, 6);
  EXPECT_EQ(runs[2].end, 8);
  expect_error<ConfigError>([&] { image_token_runs({1, 9, 9, 9, 2}, {9, 2}); }, {"3 image tokens", "[1, 4)"});
  EXPECT_THROW(image_token_runs(ids, {9, 0}), ConfigError);
}

// ---------------------------------------------------------------------------------------------------------------
// The data pipeline and its cache.

fs::path image_dataset(const fs::path& dir) {
  fs::create_directories(dir / "img");
  for (const char* name : {"coffee.jpg", "camera.png", "astronaut_224.png"}) {
    fs::copy_file(images_dir() / name, dir / "img" / name, fs::copy_options::overwrite_existing);
  }
  write_file_atomic(dir / "d.jsonl",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>What is it?\"}, {\"role\": \"assistant\", "
                    "\"content\": \"Coffee.\"}], \"images\": [\"img/coffee.jpg\"]}\n"
                    "{\"query\": \"<image><image>Same?\", \"response\": \"No.\", \"images\": [\"img/camera.png\", "
                    "\"img/coffee.jpg\"]}\n"
                    "{\"query\": \"Text only.\", \"response\": \"Fine.\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": "
                    "\"img/astronaut_224.png\"}, {\"type\": \"text\", \"text\": \"Who?\"}]}, {\"role\": \"assistant\", "
                    "\"content\": \"An astronaut.\"}]}\n"
                    "{\"query\": \"<image>\", \"response\": \"?\", \"images\": [\"img/missing.jpg\"]}\n");
  return dir / "d.jsonl";
}

void expect_same_samples(const std::vector<Sample>& a, const std::vector<Sample>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input_ids, b[i].input_ids) << i;
    EXPECT_EQ(a[i].labels, b[i].labels) << i;
    ASSERT_EQ(a[i].pixel_values.size(), b[i].pixel_values.size()) << i;
    for (size_t k = 0; k < a[i].pixel_values.size(); ++k) EXPECT_TRUE(a[i].pixel_values[k].equal(b[i].pixel_values[k])) << i;
  }
}

TEST(MmDataPipeline, ResolvesImagesBesideTheDatasetAndCountsUnreadableOnes) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = test::temp_dir("mm_pipe");
  const fs::path data = image_dataset(dir);
  const SampleEncoder enc = llava_encoder(vision_options());
  DataOptions o;
  o.dataset = {data.string()};
  o.dataset_shuffle = false;
  expect_error<BadRowError>([&] { prepare_data(o, enc, "fp"); }, {"d.jsonl:5", "image unreadable", "missing.jpg"});
  o.strict = false;
  o.num_threads = 1;
  const TokenizedData one = prepare_data(o, enc, "fp");
  EXPECT_EQ(one.stats.skipped.summary(), "1 rows skipped: 1 image unreadable");
  ASSERT_EQ(one.train.size(), 4u);
  const std::vector<size_t> counts = {one.train[0].pixel_values.size(), one.train[1].pixel_values.size(),
                                      one.train[2].pixel_values.size(), one.train[3].pixel_values.size()};
  EXPECT_EQ(counts, (std::vector<size_t>{1, 2, 0, 1}));
  EXPECT_TRUE(one.train[1].pixel_values[0].equal(expected_pixels(images_dir() / "camera.png")));
  EXPECT_TRUE(one.train[1].pixel_values[1].equal(expected_pixels(images_dir() / "coffee.jpg")));
  EXPECT_TRUE(one.train[3].pixel_values[0].equal(expected_pixels(images_dir() / "astronaut_224.png")));
  o.num_threads = 2;
  expect_same_samples(prepare_data(o, enc, "fp").train, one.train);
  // A text model refuses the image rows and keeps the text one.
  const auto tok = load_tokenizer(tiny_llava());
  const TokenizedData text = prepare_data(o, SampleEncoder(tok, chat_template_for(*tok, "llava"), {}), "fp");
  EXPECT_EQ(text.train.size(), 1u);
  EXPECT_EQ(text.stats.skipped.by_reason.at("images need a vision-language model"), 4);
}

TEST(MmDataPipeline, CacheKeepsPixelValuesAndIsInvalidatedByAChangedImage) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = test::temp_dir("mm_cache");
  const fs::path data = image_dataset(dir);
  const SampleEncoder enc = llava_encoder(vision_options());
  DataOptions o;
  o.dataset = {data.string()};
  o.strict = false;
  o.cache_dir = dir / "cache";
  const TokenizedData built = prepare_data(o, enc, "fp");
  EXPECT_FALSE(built.stats.from_cache);
  const TokenizedData cached = prepare_data(o, enc, "fp");
  EXPECT_TRUE(cached.stats.from_cache);
  expect_same_samples(cached.train, built.train);
  EXPECT_EQ(cached.stats.skipped.summary(), built.stats.skipped.summary());

  // A changed image file: rebuilt, with the new pixels.
  fs::copy_file(images_dir() / "rocket.jpg", dir / "img" / "camera.png", fs::copy_options::overwrite_existing);
  const TokenizedData changed = prepare_data(o, enc, "fp");
  EXPECT_FALSE(changed.stats.from_cache);
  bool rocket_seen = false;
  for (const Sample& s : changed.train) {
    for (const at::Tensor& p : s.pixel_values) rocket_seen = rocket_seen || p.equal(expected_pixels(images_dir() / "rocket.jpg"));
  }
  EXPECT_TRUE(rocket_seen);
  EXPECT_TRUE(prepare_data(o, enc, "fp").stats.from_cache);

  // The missing image appears: the skipped row now has its image, so the cache is stale.
  fs::copy_file(images_dir() / "coffee.jpg", dir / "img" / "missing.jpg");
  const TokenizedData appeared = prepare_data(o, enc, "fp");
  EXPECT_FALSE(appeared.stats.from_cache);
  EXPECT_EQ(appeared.stats.skipped.total(), 0);

  // Other image settings make another key.
  EncodeOptions other = vision_options();
  other.images->tokens_per_image = 8;
  EXPECT_FALSE(prepare_data(o, llava_encoder(other), "fp").stats.from_cache);
}

TEST(MmDataPipeline, DamagedCacheFilesAreRebuiltNotTrusted) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = test::temp_dir("mm_cache_damaged");
  const fs::path data = image_dataset(dir);
  const SampleEncoder enc = llava_encoder(vision_options());
  DataOptions o;
  o.dataset = {data.string()};
  o.strict = false;
  o.cache_dir = dir / "cache";
  const TokenizedData built = prepare_data(o, enc, "fp");
  fs::path file;
  for (const auto& entry : fs::directory_iterator(o.cache_dir)) file = entry.path();
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::mt19937 rng(3);
  const auto check_rebuilt = [&](const std::string& damaged, const std::string& what) {
    write_file_atomic(file, damaged);
    const TokenizedData again = prepare_data(o, enc, "fp");
    EXPECT_FALSE(again.stats.from_cache) << what;
    expect_same_samples(again.train, built.train);
  };
  check_rebuilt(bytes.substr(0, bytes.size() - 7), "truncated");
  check_rebuilt(bytes + "x", "trailing byte");
  std::string old_version = bytes;
  old_version[7] = '1';
  check_rebuilt(old_version, "version 1");
  for (int trial = 0; trial < 8; ++trial) {  // bytes of the header and manifest overwritten
    std::string damaged = bytes;
    const size_t at = 8 + rng() % 64;
    for (size_t k = 0; k < 8 && at + k < damaged.size(); ++k) damaged[at + k] = '\xff';
    write_file_atomic(file, damaged);
    const TokenizedData again = prepare_data(o, enc, "fp");
    if (!again.stats.from_cache) expect_same_samples(again.train, built.train);
  }

  // Counts and sizes far beyond the file are refused before anything is allocated for them. Walk the layout
  // (docs/formats.md) to the training sample count and to the first image's sizes.
  const auto u64_at = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  const auto with_u64 = [&](size_t at, uint64_t v) {
    std::string damaged = bytes;
    std::memcpy(damaged.data() + at, &v, 8);
    return damaged;
  };
  size_t at = 16 + u64_at(8);  // past the stats JSON
  const uint64_t manifest = u64_at(at);
  EXPECT_EQ(manifest, 4u);  // coffee, camera, astronaut and the missing file
  at += 8;
  for (uint64_t i = 0; i < manifest; ++i) at += 8 + u64_at(at) + 1 + 8;
  const size_t train_count = at;
  EXPECT_EQ(u64_at(train_count), built.train.size());
  check_rebuilt(with_u64(train_count, uint64_t{1} << 39), "sample count 2^39");
  at += 8;
  size_t dims = 0;
  for (size_t i = 0; i < built.train.size() && dims == 0; ++i) {
    const uint64_t len = u64_at(at);
    at += 8 + 8 * len;
    if (u64_at(at) > 0) dims = at + 8;
    at += 8;
    ASSERT_EQ(len, built.train[i].input_ids.size());
  }
  ASSERT_NE(dims, 0u);
  EXPECT_EQ(u64_at(dims), 3u);
  check_rebuilt(with_u64(dims + 8, uint64_t{1} << 31), "image height 2^31");
  check_rebuilt(with_u64(dims - 8, uint64_t{1} << 40), "image count 2^40");
  check_rebuilt(with_u64(train_count + 8, uint64_t{1} << 31), "token count 2^31");
}

// ---------------------------------------------------------------------------------------------------------------
// ChunkFlow.

// A sample of `length` tokens with images of `per` tokens starting at `starts`.
Sample chunk_sample(int64_t length, const std::vector<int64_t>& starts, int64_t per) {
  Sample s;
  for (int64_t t = 0; t < length; ++t) s.input_ids.push_back(static_cast<int32_t>(3 + t % 50));
  for (size_t i = 0; i < starts.size(); ++i) {
    for (int64_t t = starts[i]; t < starts[i] + per; ++t) s.input_ids[static_cast<size_t>(t)] = kImageId;
    s.pixel_values.push_back(at::full({3, 2, 2}, static_cast<float>(i)));
  }
  for (int64_t t = 0; t < length; ++t) {
    const bool trained = t + 1 < length && s.input_ids[static_cast<size_t>(t + 1)] != kImageId;
    s.labels.push_back(trained ? s.input_ids[static_cast<size_t>(t + 1)] : kIgnoreIndex);
  }
  return s;
}

TEST(MmDataChunkFlow, BoundariesMoveBeforeImageRunsAndChunksCarryTheirImages) {
  // C = 10, runs of 6 at 7 and 20: the plain boundaries 10 and 20 would cut the first run.
  const Sample s = chunk_sample(34, {7, 20}, 6);
  const Sample short_one = chunk_sample(8, {1}, 6);
  const ImageTokenLayout layout{kImageId, 6};
  const ChunkedBatch batch = build_chunked_batch({&s, &short_one}, 10, 0, layout);
  ASSERT_EQ(batch.sequences.size(), 1u);
  const auto& chunks = batch.sequences[0];
  std::vector<int64_t> sizes, images;
  int64_t start = 0;
  for (const Batch& c : chunks) {
    sizes.push_back(c.input_ids.size(1));
    images.push_back(c.pixel_values.defined() ? c.pixel_values.size(0) : 0);
    EXPECT_EQ(c.position_ids[0][0].item<int64_t>(), start);
    start += c.input_ids.size(1);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{7, 10, 10, 7}));  // [0,7) [7,17) [17,27) [27,34)
  EXPECT_EQ(images, (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(chunks[1].pixel_values[0][0][0][0].item<float>(), 0.0f);
  EXPECT_EQ(chunks[2].pixel_values[0][0][0][0].item<float>(), 1.0f);
  ASSERT_EQ(batch.standalone.size(), 1u);
  EXPECT_EQ(batch.standalone[0].pixel_values.size(0), 1);
  EXPECT_EQ(batch.label_tokens, s.label_tokens() + short_one.label_tokens());

  expect_error<ConfigError>([&] { build_chunked_batch({&s}, 5, 0, layout); }, {"chunk_size 5", "image_seq_length"});
  expect_error<ConfigError>([&] { build_chunked_batch({&s}, 10, 0); }, {"image token id"});
  Sample missing = s;
  missing.pixel_values.pop_back();
  expect_error<ConfigError>([&] { build_chunked_batch({&missing}, 10, 0, layout); }, {"2 image-token runs", "1 images"});
}

TEST(MmDataChunkFlow, RandomPlansPlaceEveryTokenOnceAndNeverCutARun) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t per = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t C = per + static_cast<int64_t>(rng() % 20);
    std::vector<int64_t> lengths(1 + rng() % 6);
    std::vector<std::vector<TokenSpan>> runs(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
      int64_t t = 0;
      while (t < 5 * C) {  // text, then maybe an image, repeatedly
        t += static_cast<int64_t>(rng() % 6);
        if (rng() % 2 == 0) {
          runs[i].push_back({t, t + per});
          t += per;
        }
      }
      lengths[i] = t + static_cast<int64_t>(rng() % 3);
      if (rng() % 3 == 0) {  // sometimes short
        lengths[i] = 1 + static_cast<int64_t>(rng() % C);
        runs[i].clear();
      }
    }
    std::vector<std::vector<int>> seen(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) seen[i].assign(static_cast<size_t>(lengths[i]), 0);
    for (const auto& group : plan_chunks(lengths, C, runs)) {
      for (const auto& chunk : group.chunks) {
        int64_t tokens = 0;
        for (const ChunkSpan& span : chunk) {
          tokens += span.end - span.begin;
          ASSERT_GT(span.end, span.begin);
          for (const TokenSpan& run : runs[span.sample]) {
            EXPECT_FALSE(run.begin < span.begin && span.begin < run.end) << "trial " << trial;
            EXPECT_FALSE(run.begin < span.end && span.end < run.end) << "trial " << trial;
          }
          for (int64_t t = span.begin; t < span.end; ++t) ++seen[span.sample][static_cast<size_t>(t)];
        }
        EXPECT_LE(tokens, C);
      }
    }
    for (const auto& s : seen) {
      for (int count : s) ASSERT_EQ(count, 1) << "trial " << trial;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Preference rows with images.

PreferenceRow pref_row(const std::string& json, PreferenceTask task = PreferenceTask::kPairs,
                       const fs::path& base = images_dir()) {
  return normalise_preference_row(Json::parse(json), "p.jsonl:2", task, std::nullopt, base);
}

std::string pref_reason(const std::string& json) {
  return reason_of([&] { pref_row(json); });
}

PreferenceEncoder llava_preference_encoder(PreferenceEncodeOptions o = {}) {
  o.images = make_image_encoding(tiny_llava(), kImageId, kPerImage);
  const auto tok = load_tokenizer(tiny_llava());
  return PreferenceEncoder(tok, chat_template_for(*tok, "llava"), o);
}

// SFT's encoding (loss on the last answer) of the row's prompt followed by `answer`.
Sample sft_encoding(const PreferenceRow& r, const std::string& answer) {
  EncodeOptions o = vision_options();
  o.loss_scale = LossScale::kLastRound;
  Conversation c;
  c.messages = r.prompt;
  c.messages.push_back({"assistant", answer, std::nullopt});
  c.images = r.images;
  c.where = r.where;
  const auto s = llava_encoder(o).encode(c);
  EXPECT_TRUE(s.has_value());
  return s.value_or(Sample());
}

TEST(MmPreferenceRows, EveryFormCarriesThePromptsImages) {
  MM_REQUIRE_ASSETS();
  const std::vector<fs::path> coffee = {images_dir() / "coffee.jpg"};
  PreferenceRow r = pref_row(R"({"messages": [{"role": "user", "content": "<image>What is it?"},
      {"role": "assistant", "content": "A cup."}], "rejected_response": "A rocket.", "images": ["coffee.jpg"]})");
  EXPECT_EQ(r.images, coffee);
  EXPECT_EQ(r.prompt.back().content, "<image>What is it?");
  r = pref_row(R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "coffee.jpg"},
      {"type": "text", "text": "What is it?"}]}], "chosen": "A cup.", "rejected": "A rocket."})");
  EXPECT_EQ(r.images, coffee);
  EXPECT_EQ(r.prompt.back().content, "<image>What is it?");
  r = pref_row(R"({"prompt": "<image>What is it?", "chosen": "A cup.", "rejected": "A rocket.",
      "images": ["coffee.jpg"]})");
  EXPECT_EQ(r.images, coffee);
  r = pref_row(R"({"messages": [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A cup."}],
      "rejected_messages": [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A rocket."}],
      "images": ["coffee.jpg"]})");
  EXPECT_EQ(r.images, coffee);
  EXPECT_EQ(*r.rejected, "A rocket.");
  r = normalise_preference_row(Json::parse(R"({"messages": [{"role": "user", "content": "<image>Is it hot?"},
      {"role": "assistant", "content": "Yes."}], "label": true, "images": ["coffee.jpg"]})"), "k.jsonl:1",
      PreferenceTask::kKto, std::nullopt, images_dir());
  EXPECT_EQ(r.images, coffee);
  EXPECT_EQ(r.desirable, std::optional<bool>(true));

  // Bad rows name their reason: placeholders and images that differ in number, an image in an answer, a rejected
  // conversation whose images differ from the chosen one's.
  EXPECT_EQ(pref_reason(R"({"prompt": "What is it?", "chosen": "A cup.", "rejected": "A rocket.",
      "images": ["coffee.jpg"]})"), "image count mismatch");
  EXPECT_EQ(pref_reason(R"({"prompt": "<image>What is it?", "chosen": "A cup.", "rejected": "A <image> rocket.",
      "images": ["coffee.jpg"]})"), "image in an assistant message");
  EXPECT_EQ(pref_reason(R"({"prompt": "<image>What is it?", "chosen": "A <image> cup.", "rejected": "A rocket.",
      "images": ["coffee.jpg"]})"), "image in an assistant message");
  EXPECT_EQ(pref_reason(R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "coffee.jpg"}]},
      {"role": "assistant", "content": "A cup."}], "rejected_messages": [{"role": "user", "content": [{"type": "image",
      "image": "rocket.jpg"}]}, {"role": "assistant", "content": "A rocket."}]})"), "rejected_messages images differ");
}

// Chosen and rejected are exactly SFT's encodings of the prompt with each answer (image runs expanded, labels on the
// answer only), and hold the same decoded images: one tensor each, shared.
TEST(MmPreferenceEncode, PairsAreSftEncodingsSharingThePromptsDecodedImages) {
  MM_REQUIRE_ASSETS();
  const PreferenceRow r = pref_row(R"({"messages": [{"role": "user", "content": "<image>What is it?"},
      {"role": "assistant", "content": "A cup of coffee."}, {"role": "user", "content": "And this one? <image>"},
      {"role": "assistant", "content": "A rocket."}], "rejected_response": "A camera, I think.",
      "images": ["coffee.jpg", "rocket.jpg"]})");
  const auto pair = llava_preference_encoder().encode_pair(r);
  ASSERT_TRUE(pair.has_value());
  for (const auto& [sample, answer] : {std::pair<const Sample*, std::string>{&pair->chosen, "A rocket."},
                                      {&pair->rejected, "A camera, I think."}}) {
    SCOPED_TRACE(answer);
    const Sample sft = sft_encoding(r, answer);
    EXPECT_EQ(sample->input_ids, sft.input_ids);
    EXPECT_EQ(sample->labels, sft.labels);
    EXPECT_EQ(sample->image_tokens, (std::vector<int64_t>{kPerImage, kPerImage}));
    ASSERT_EQ(sample->pixel_values.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(sample->pixel_values[i].equal(sft.pixel_values[i])) << i;
  }
  EXPECT_TRUE(pair->chosen.pixel_values[0].equal(expected_pixels(images_dir() / "coffee.jpg")));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(pair->chosen.pixel_values[i].data_ptr(), pair->rejected.pixel_values[i].data_ptr()) << "decoded once";
  }
  // The prompt holds both runs, and no prompt position is trained.
  const auto starts = run_starts(pair->chosen.input_ids);
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_LE(starts[1] + kPerImage, pair->prompt_length);
  for (int64_t t = 0; t + 1 < pair->prompt_length; ++t) EXPECT_EQ(pair->chosen.labels[static_cast<size_t>(t)], kIgnoreIndex);

  // KTO: a pair row gives two examples with the same images, decoded once.
  const auto kto = llava_preference_encoder().encode_kto(r);
  ASSERT_EQ(kto.size(), 2u);
  ASSERT_TRUE(kto[0] && kto[1]);
  EXPECT_EQ(kto[0]->completion.input_ids, pair->chosen.input_ids);
  EXPECT_EQ(kto[1]->completion.input_ids, pair->rejected.input_ids);
  EXPECT_EQ(kto[0]->completion.pixel_values[1].data_ptr(), kto[1]->completion.pixel_values[1].data_ptr());
  // Its KL rows take the prompt's own images: row 0 is prompt 0 with completion 1.
  const std::vector<Sample> kl = kto_kl_samples({&*kto[0], &*kto[1]}, llava_preference_encoder().options());
  ASSERT_EQ(kl.size(), 2u);
  EXPECT_EQ(kl[0].input_ids, kto[1]->completion.input_ids);  // the same prompt, so the other completion follows it
  EXPECT_EQ(kl[0].pixel_values.size(), 2u);
  EXPECT_EQ(kl[0].image_tokens, (std::vector<int64_t>{kPerImage, kPerImage}));

  // The pair batch: the chosen rows' images once; the rejected rows take the same.
  const PreferenceBatch batch = collate_preference({&*pair, &*pair}, 0);
  EXPECT_FALSE(batch.batch.pixel_values.defined());
  ASSERT_FALSE(batch.images.empty());
  EXPECT_EQ(batch.images.pixel_values.sizes(), (at::IntArrayRef{4, 3, 56, 56}));  // 2 pairs x 2 images

  // A text model refuses the row; a prompt whose image tokens and images differ in number is a bad row.
  const auto tok = load_tokenizer(tiny_llava());
  const PreferenceEncoder text(tok, chat_template_for(*tok, "llava"), {});
  EXPECT_EQ(reason_of([&] { text.encode_pair(r); }), "images need a vision-language model");
  PreferenceRow fewer = r;
  fewer.images.pop_back();
  EXPECT_EQ(reason_of([&] { llava_preference_encoder().encode_pair(fewer); }), "image count mismatch");
}

// Truncation counts image tokens and never keeps part of a run: a prompt cut inside a run leaves that image out
// whole (its pixels too); a pair dropped by its length decodes no image, so an undecodable one goes unnoticed.
TEST(MmPreferenceEncode, TruncationLeavesCutImagesOutAndDroppedPairsDecodeNothing) {
  MM_REQUIRE_ASSETS();
  const PreferenceRow r = pref_row(R"({"prompt": "<image> and <image>: which came first?", "chosen": "The cup.",
      "rejected": "The rocket.", "images": ["coffee.jpg", "rocket.jpg"]})");
  const auto full = llava_preference_encoder().encode_pair(r);
  ASSERT_TRUE(full.has_value());
  const auto starts = run_starts(full->chosen.input_ids);
  ASSERT_EQ(starts.size(), 2u);
  const int64_t P = full->prompt_length;
  PreferenceEncodeOptions o;
  o.truncation = TruncationStrategy::kLeft;
  o.max_prompt_length = P - starts[0] - 3;  // keep_end: the cut falls inside the first run
  o.max_length = o.max_prompt_length + 8;  // the prompt plus an answer (5 or 6 tokens) is longer: the prompt is cut
  const auto cut = llava_preference_encoder(o).encode_pair(r);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->prompt_length, P - starts[0] - kPerImage);  // starts right after the first run
  for (const Sample* s : {&cut->chosen, &cut->rejected}) {
    EXPECT_EQ(run_starts(s->input_ids).size(), 1u);
    ASSERT_EQ(s->pixel_values.size(), 1u);
    EXPECT_TRUE(s->pixel_values[0].equal(full->chosen.pixel_values[1]));  // the rocket stays
    EXPECT_EQ(s->label_tokens(), (s == &cut->chosen ? full->chosen : full->rejected).label_tokens());
  }

  // An image whose header opens but whose data does not decode: a dropped pair never decodes it.
  const fs::path dir = test::temp_dir("mm_pref_truncated");
  std::ifstream in(images_dir() / "coffee.jpg", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file_atomic(dir / "truncated.jpg", bytes.substr(0, bytes.size() / 2));
  const PreferenceRow broken = pref_row(R"({"prompt": "<image>?", "chosen": "A cup.", "rejected": "A rocket.",
      "images": ["truncated.jpg"]})", PreferenceTask::kPairs, dir);
  PreferenceEncodeOptions tight;
  tight.max_length = 8;  // delete: shorter than the image's run
  EXPECT_FALSE(llava_preference_encoder(tight).encode_pair(broken).has_value());
  EXPECT_EQ(llava_preference_encoder(tight).encode_kto(broken).size(), 2u);
  std::string message;
  EXPECT_EQ(reason_of([&] { llava_preference_encoder().encode_pair(broken); }, &message), "image unreadable");
  EXPECT_NE(message.find("p.jsonl:2"), std::string::npos) << message;
  EXPECT_NE(message.find((dir / "truncated.jpg").string()), std::string::npos) << message;
}

// The prepared pairs and KTO examples keep their pixels through the cache, the rejected sample sharing the chosen
// one's images after loading too; a changed image rebuilds it.
TEST(MmPreferencePipeline, CacheKeepsThePairsImagesAndNoticesAChangedImage) {
  MM_REQUIRE_ASSETS();
  const fs::path dir = test::temp_dir("mm_pref_cache");
  fs::create_directories(dir / "img");
  for (const char* name : {"coffee.jpg", "rocket.jpg"}) {
    fs::copy_file(images_dir() / name, dir / "img" / name, fs::copy_options::overwrite_existing);
  }
  write_file_atomic(dir / "pairs.jsonl",
                    "{\"prompt\": \"<image>What is it?\", \"chosen\": \"A cup.\", \"rejected\": \"A rocket.\", "
                    "\"images\": [\"img/coffee.jpg\"]}\n"
                    "{\"prompt\": \"Text only?\", \"chosen\": \"Yes.\", \"rejected\": \"No.\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": "
                    "\"img/rocket.jpg\"}, {\"type\": \"text\", \"text\": \"And this?\"}]}, {\"role\": \"assistant\", "
                    "\"content\": \"A rocket.\"}], \"rejected_response\": \"A cup.\"}\n");
  DataOptions o;
  o.dataset = {(dir / "pairs.jsonl").string()};
  o.cache_dir = dir / "cache";
  o.dataset_shuffle = false;
  const PreferenceEncoder enc = llava_preference_encoder();
  const PreferenceData built = prepare_preference_data(o, enc, "fp");
  ASSERT_EQ(built.train.size(), 3u);
  EXPECT_FALSE(built.stats.from_cache);
  const PreferenceData cached = prepare_preference_data(o, enc, "fp");
  EXPECT_TRUE(cached.stats.from_cache);
  ASSERT_EQ(cached.train.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const PreferenceSample& a = built.train[i];
    const PreferenceSample& b = cached.train[i];
    EXPECT_EQ(a.chosen.input_ids, b.chosen.input_ids) << i;
    EXPECT_EQ(a.rejected.labels, b.rejected.labels) << i;
    EXPECT_EQ(a.prompt_length, b.prompt_length) << i;
    ASSERT_EQ(a.chosen.pixel_values.size(), b.rejected.pixel_values.size()) << i;
    for (size_t k = 0; k < b.chosen.pixel_values.size(); ++k) {
      EXPECT_TRUE(a.chosen.pixel_values[k].equal(b.chosen.pixel_values[k])) << i;
      EXPECT_EQ(b.chosen.pixel_values[k].data_ptr(), b.rejected.pixel_values[k].data_ptr()) << i;
    }
    EXPECT_EQ(a.chosen.image_tokens, b.rejected.image_tokens) << i;
  }
  EXPECT_EQ(cached.train[1].chosen.pixel_values.size(), 0u);
  EXPECT_TRUE(cached.train[2].chosen.pixel_values[0].equal(expected_pixels(images_dir() / "rocket.jpg")));
  fs::copy_file(images_dir() / "coffee.jpg", dir / "img" / "rocket.jpg", fs::copy_options::overwrite_existing);
  const PreferenceData changed = prepare_preference_data(o, enc, "fp");
  EXPECT_FALSE(changed.stats.from_cache);
  EXPECT_TRUE(changed.train[2].chosen.pixel_values[0].equal(expected_pixels(images_dir() / "coffee.jpg")));

  // KTO: each example holds its prompt's images, through its cache too.
  const KtoData kto = prepare_kto_data(o, enc, "fp");
  ASSERT_EQ(kto.train.size(), 6u);
  const KtoData kto_cached = prepare_kto_data(o, enc, "fp");
  EXPECT_TRUE(kto_cached.stats.from_cache);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(kto.train[i].completion.pixel_values.size(), kto_cached.train[i].completion.pixel_values.size()) << i;
    for (size_t k = 0; k < kto.train[i].completion.pixel_values.size(); ++k) {
      EXPECT_TRUE(kto.train[i].completion.pixel_values[k].equal(kto_cached.train[i].completion.pixel_values[k])) << i;
    }
  }
  EXPECT_EQ(kto.train[0].completion.pixel_values.size(), 1u);
}

}  // namespace
}  // namespace swiftcpp
