// Golden tests: Qwen2-VL (transformers 4.46) and Qwen2.5-VL (4.49) on their tiny reference checkpoints
// (../shared/assets/reference/qwen2_vl, qwen2_5_vl): the vision tower and merger, M-RoPE position ids, logits of one
// image, two images of different sizes, a padded batch with different image counts per row, the loss case, and
// greedy generation with the KV cache; and DPO with images against its formula on each sequence's own forward.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "data/collate.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "data/preference_data.h"
#include "peft/lora.h"
#include "core/memory.h"
#include "nn/attention.h"
#include "template/template.h"
#include "train/trainer.h"
#include "train/rlhf.h"
#include "train/grpo.h"
#include "tests/adapter_util.h"
#include "tests/tensor_util.h"

namespace swiftcpp {
namespace {

using test::assets;

// float32 against transformers' float32 reference (netlib BLAS; the README measures OpenBLAS at 3.3e-6 on
// |logits| <= 3.7); losses are means over 30 targets.
constexpr double kLogitTol = 1e-4;
constexpr double kVisionTol = 1e-5;
constexpr double kLossTol = 1e-5;

struct Version {
  const char* name;     // reference folder
  const char* model;    // checkpoint folder inside it
  const char* type;     // model_type
  int64_t parameters;   // model_summary
};

const Version kVersions[] = {
    {"qwen2_vl", "tiny-qwen2-vl", "qwen2_vl", 311680},
    {"qwen2_5_vl", "tiny-qwen2.5-vl", "qwen2_5_vl", 310560},
};

fs::path ref_dir(const Version& v) { return assets() / "reference" / v.name; }

at::Tensor long_tensor(const Json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) for (const auto& x : row) flat.push_back(x.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

at::Tensor long_tensor3(const Json& a) {
  std::vector<at::Tensor> planes;
  for (const auto& plane : a) planes.push_back(long_tensor(plane));
  return at::stack(planes);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor load_checkpoint_tensor(const fs::path& file, const Json& key) {
  return Checkpoint::open(file).tensor(key.get<std::string>()).clone();
}

struct QwenFixture {
  const Version& v;
  Json ref;
  Checkpoint tensors;
  CausalLM model;
  explicit QwenFixture(const Version& version)
      : v(version),
        ref(load_json_file(ref_dir(version) / "logits.json")),
        tensors(Checkpoint::open(ref_dir(version) / "logits.safetensors")),
        model(load_causal_lm(ref_dir(version) / version.model, {test::test_device(), at::kFloat})) {}

  ForwardOptions options(const Json& c) {
    ForwardOptions o;
    o.pixel_values = tensors.tensor(c["pixel_values_key"].get<std::string>()).to(test::test_device());
    o.image_grid_thw = long_tensor(c["image_grid_thw"]);
    o.key_valid = long_tensor(c["attention_mask"]).to(at::kBool).to(test::test_device());
    return o;
  }
};

class GoldenQwen2VL : public ::testing::TestWithParam<Version> {};

TEST_P(GoldenQwen2VL, ConfigAndParameterNames) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  const DecoderConfig c = load_decoder_config(ref_dir(v) / v.model);
  EXPECT_EQ(c.model_type, v.type);
  ASSERT_TRUE(c.multimodal);
  EXPECT_EQ(c.multimodal->image_token_index, 1012);
  EXPECT_EQ(c.multimodal->vision_start_token_id, 1009);
  EXPECT_EQ(c.multimodal->image_seq_length, 0);  // the processor says, per image
  EXPECT_EQ(c.rope_scaling.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  CausalLM model(c);
  int64_t n = 0;
  for (const auto& p : model->named_parameters(true)) n += p.value().numel();
  EXPECT_EQ(n, v.parameters);
  // DecoderConfig::parameter_count counts the language model's weights with its biases aside: 2 layers of q/k/v
  // biases (64 + 32 + 32) are the difference.
  EXPECT_EQ(c.parameter_count(), v.parameters - 2 * (64 + 32 + 32));
  EXPECT_EQ(model->language_model_prefix(), "");
  EXPECT_TRUE(model->in_language_model("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(model->in_language_model("lm_head"));
  EXPECT_FALSE(model->in_language_model("visual.blocks.0.mlp.fc1"));
  EXPECT_FALSE(model->in_language_model("visual.merger.mlp.0"));
}

TEST_P(GoldenQwen2VL, PositionIdsAndRopeDeltasEqualTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const Json ref = load_json_file(ref_dir(v) / "logits.json");
  for (const auto& [name, c] : ref["cases"].items()) {
    const at::Tensor mask = long_tensor(c["attention_mask"]).to(at::kBool);
    const auto [positions, deltas] =
        mrope_positions(long_tensor(c["input_ids"]), long_tensor(c["image_grid_thw"]), mask, {}, 1012, 2);
    EXPECT_TRUE(positions.equal(long_tensor3(c["position_ids"]))) << name;
    EXPECT_EQ(deltas, c["rope_deltas"].get<std::vector<int64_t>>()) << name;
  }
  // Counts that do not fit are refused, naming what is wrong.
  const Json& a = ref["cases"]["a_one_image"];
  EXPECT_THROW(mrope_positions(long_tensor(a["input_ids"]), at::tensor({1, 6, 6}, at::kLong).view({1, 3}), {}, {},
                               1012, 2), ModelError);
  EXPECT_THROW(mrope_positions(long_tensor(a["input_ids"]), {}, {}, {}, 1012, 2), ModelError);
  // Hostile grids are refused before they are walked (a negative count would step backwards).
  for (const auto& bad : {std::vector<int64_t>{1, -6, 8}, std::vector<int64_t>{0, 6, 8}, std::vector<int64_t>{1, 5, 8},
                          std::vector<int64_t>{1, 6, 1 << 20}}) {
    EXPECT_THROW(mrope_positions(long_tensor(a["input_ids"]), at::tensor(bad, at::kLong).view({1, 3}), {}, {}, 1012, 2),
                 ModelError);
  }
}

TEST_P(GoldenQwen2VL, ImagesThatDoNotFitTheirGridsOrBoundsAreRefused) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  const Json& c = f.ref["cases"]["a_one_image"];
  const ForwardOptions o = f.options(c);
  const at::Tensor ids = long_tensor(c["input_ids"]);
  ForwardOptions no_grid = o;
  no_grid.image_grid_thw = at::Tensor();
  EXPECT_THROW(f.model->forward(ids, no_grid), ModelError);
  ForwardOptions wrong = o;
  wrong.image_grid_thw = at::tensor({1, 8, 8}, at::kLong).view({1, 3});  // 64 patches, 48 given
  EXPECT_THROW(f.model->forward(ids, wrong), ModelError);
  ForwardOptions rows = o;
  rows.pixel_values = o.pixel_values.narrow(1, 0, 1000);
  EXPECT_THROW(f.model->forward(ids, rows), ModelError);
  // An image whose resize would exceed the caller's pixel bound is refused before anything is resized.
  ImageEncoding images = make_image_encoding(ref_dir(v) / v.model, *f.model->config().multimodal, {{1 << 20}, {1 << 20}});
  images.max_pixels = 1 << 18;
  test::expect_error<FormatError>([&] { process_image_file(assets() / "images/coffee.jpg", images); }, {"resized", "allowed"});
}

TEST_P(GoldenQwen2VL, VisionTowerAndMergerMatchTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  for (const char* name : {"a_one_image", "b_two_images", "d_loss_batch"}) {
    const Json& c = f.ref["cases"][name];
    const ForwardOptions o = f.options(c);
    const at::Tensor out = f.model->vision()->encode(o.pixel_values, o.image_grid_thw).cpu();
    const double diff = max_abs_diff(out, f.tensors.tensor(std::string(name) + ".vision_output"));
    std::cout << "[" << v.name << " " << name << "] max |vision output - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kVisionTol) << name;
    const at::Tensor merged = f.model->embed(long_tensor(c["input_ids"]).to(test::test_device()), o.pixel_values, {},
                                             o.image_grid_thw).cpu();
    EXPECT_LE(max_abs_diff(merged, f.tensors.tensor(std::string(name) + ".inputs_embeds")), kVisionTol) << name;
  }
}

TEST_P(GoldenQwen2VL, LogitsMatchTransformersWithPositionsComputedByTheModel) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  for (const auto& [name, c] : f.ref["cases"].items()) {
    // No position_ids passed: the decoder computes the M-RoPE positions from the ids and grids itself.
    const at::Tensor logits = f.model->forward(long_tensor(c["input_ids"]).to(test::test_device()), f.options(c)).cpu();
    const at::Tensor expected = f.tensors.tensor(c["logits_key"].get<std::string>());
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const at::Tensor valid = long_tensor(c["attention_mask"]).to(at::kBool);
    const double diff = max_abs_diff(logits.index({valid}), expected.index({valid}));
    std::cout << "[" << v.name << " " << name << "] max |logit - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kLogitTol) << name;
    // The argmax at every valid position equals transformers'.
    const at::Tensor argmax = logits.argmax(-1);
    EXPECT_TRUE(argmax.index({valid}).equal(long_tensor(c["argmax"]).index({valid}))) << name;
    if (c.contains("loss")) {
      const at::Tensor labels = long_tensor(c["labels"]);
      const at::Tensor shifted = labels.narrow(1, 1, labels.size(1) - 1);
      const at::Tensor l = logits.narrow(1, 0, logits.size(1) - 1);
      const double loss = (cross_entropy_sum(l, shifted) / (shifted != kIgnoreIndex).sum()).item<double>();
      std::cout << "[" << v.name << " " << name << "] loss " << loss << " (HF " << c["loss"].get<double>() << ")"
                << std::endl;
      EXPECT_NEAR(loss, c["loss"].get<double>(), kLossTol);
    }
  }
}

TEST_P(GoldenQwen2VL, GreedyGenerationWithTheCacheEqualsTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  const Json& c = f.ref["cases"]["a_one_image"];
  const std::vector<int64_t> prompt = c["input_ids"][0].get<std::vector<int64_t>>();
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.sampling.temperature = 0;  // greedy
  Generator gen(f.model, load_tokenizer(ref_dir(v) / v.model));
  const ForwardOptions o = f.options(c);
  const auto out = gen.generate({prompt}, config, {}, {ImageInputs{o.pixel_values, o.image_grid_thw}});
  const std::vector<int64_t> expected = f.ref["greedy_generate_a_one_image"]["generate_new_ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(out[0].new_ids, expected);
}

TEST_P(GoldenQwen2VL, ContinuousBatchingKeepsEachSequencesRopeDeltas) {
  // Three sequences (two images of different sizes, one text-only) join a running engine at different steps and
  // share decode steps in reused rows: each one's greedy tokens equal it alone.
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  const auto tokenizer = load_tokenizer(ref_dir(v) / v.model);
  std::vector<SequenceRequest> requests;
  for (const auto& [name, row] : std::vector<std::pair<const char*, int>>{{"a_one_image", 0}, {"b_two_images", 0},
                                                                          {"c_batch_right_pad", 1}}) {
    const Json& c = f.ref["cases"][name];
    SequenceRequest r;
    const int64_t n = c["rows"][row]["n_ids"].get<int64_t>();
    const std::vector<int64_t> ids = c["input_ids"][row].get<std::vector<int64_t>>();
    r.prompt.assign(ids.begin(), ids.begin() + n);
    if (c["rows"][row]["images"].size() > 0) {
      const ForwardOptions o = f.options(c);
      r.pixel_values = o.pixel_values;
      r.image_grid_thw = o.image_grid_thw;
    }
    r.config.max_new_tokens = 10;
    r.config.sampling.temperature = 0;
    requests.push_back(r);
  }
  const auto run = [&](const std::vector<size_t>& which, int64_t stagger) {
    EngineOptions options;
    options.max_sequences = 2;  // rows are reused as sequences finish
    options.max_model_len = 128;
    Engine engine(f.model, tokenizer, options);
    std::map<uint64_t, size_t> owner;
    std::map<size_t, std::vector<int64_t>> out;
    size_t next = 0;
    for (int64_t step = 0; next < which.size() || engine.has_work(); ++step) {
      if (next < which.size() && step % stagger == 0) owner[engine.add(requests[which[next]])] = which[next], ++next;
      for (auto& u : engine.step()) out[owner[u.id]].insert(out[owner[u.id]].end(), u.new_ids.begin(), u.new_ids.end());
    }
    return out;
  };
  const auto together = run({0, 1, 2}, 3);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto alone = run({i}, 1);
    EXPECT_EQ(together.at(i), alone.at(i)) << "sequence " << i;
    EXPECT_EQ(together.at(i).size(), 10u) << "sequence " << i;
  }
  const std::vector<int64_t> expected = f.ref["greedy_generate_a_one_image"]["generate_new_ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(std::vector<int64_t>(together.at(0).begin(), together.at(0).begin() + 8), expected);
}

// The messages of a reference row with each image part as the "<image>" placeholder (ms-swift's form).
std::vector<ChatMessage> placeholder_messages(const Json& messages) {
  std::vector<ChatMessage> out;
  for (const auto& m : messages) {
    std::string text;
    if (m["content"].is_string()) {
      text = m["content"].get<std::string>();
    } else {
      for (const auto& part : m["content"]) {
        text += part["type"] == "image" ? std::string(kImagePlaceholder) : part["text"].get<std::string>();
      }
    }
    out.push_back({m["role"].get<std::string>(), text, std::nullopt});
  }
  return out;
}

TEST_P(GoldenQwen2VL, TemplateTokenisationAndImageExpansionEqualTheProcessor) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const fs::path model_dir = ref_dir(v) / v.model;
  const Json ref = load_json_file(ref_dir(v) / "logits.json");
  const auto tokenizer = load_tokenizer(model_dir);
  const std::string name = detect_chat_template(model_dir);
  EXPECT_EQ(name, "qwen2");
  EncodeOptions options;
  options.max_length = 4096;
  options.images = make_image_encoding(model_dir, *load_decoder_config(model_dir).multimodal);
  const SampleEncoder encoder(tokenizer, chat_template_for(*tokenizer, name), options);
  const fs::path images = assets() / "images";
  for (const auto& [case_name, c] : ref["cases"].items()) {
    size_t image = 0;
    for (size_t row = 0; row < c["rows"].size(); ++row) {
      const Json& r = c["rows"][row];
      std::vector<fs::path> files;
      for (const auto& f : r["images"]) files.push_back(images / f.get<std::string>());
      const std::vector<ChatMessage> messages = placeholder_messages(r["messages"]);
      const std::vector<int64_t> want_all = c["input_ids"][row].get<std::vector<int64_t>>();
      const std::vector<int64_t> want(want_all.begin(), want_all.begin() + r["n_ids"].get<int64_t>());
      std::vector<int> ids;
      std::vector<at::Tensor> pixels;
      if (r["add_generation_prompt"].get<bool>()) {
        const EncodedPrompt p = encoder.encode_prompt(messages, files);
        ids = p.ids;
        pixels = p.pixel_values;
        for (size_t i = 0; i < p.image_grids.size(); ++i) {
          EXPECT_EQ(std::vector<int64_t>(p.image_grids[i].begin(), p.image_grids[i].end()),
                    c["image_grid_thw"][image + i].get<std::vector<int64_t>>()) << case_name;
        }
      } else {
        // A training row in ms-swift's form: the placeholders in the text, the files in "images".
        Json row_json = {{"messages", Json::array()}, {"images", Json::array()}};
        for (const auto& m : messages) row_json["messages"].push_back({{"role", m.role}, {"content", m.content}});
        for (const auto& f : files) row_json["images"].push_back(f.string());
        const auto sample = encoder.encode(normalise_row(row_json, case_name));
        ASSERT_TRUE(sample.has_value()) << case_name;
        ids.assign(sample->input_ids.begin(), sample->input_ids.end());
        pixels = sample->pixel_values;
        // Labels: the answer and its <|im_end|> (HF's labels shifted by one), never an image token.
        const std::vector<int64_t> hf = c["labels"][row].get<std::vector<int64_t>>();
        for (size_t t = 0; t + 1 < ids.size(); ++t) {
          EXPECT_EQ(static_cast<int64_t>(sample->labels[t]), hf[t + 1]) << case_name << " row " << row << " t " << t;
        }
      }
      EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.end()), want) << case_name << " row " << row;
      // The pixel values are the processor's, in order.
      const at::Tensor all = load_checkpoint_tensor(ref_dir(v) / "logits.safetensors", c["pixel_values_key"]);
      int64_t offset = 0;
      for (size_t i = 0; i < image; ++i) {
        const auto& g = c["image_grid_thw"][i];
        offset += g[0].get<int64_t>() * g[1].get<int64_t>() * g[2].get<int64_t>();
      }
      for (const at::Tensor& px : pixels) {
        EXPECT_LE(max_abs_diff(px, all.narrow(0, offset, px.size(0))), 1e-6) << case_name;
        offset += px.size(0);
      }
      image += files.size();
    }
  }
}

// The tower at a grid of patches with random pixel values: [patches, 3 * 2 * 14 * 14] -> [patches / 4, hidden].
at::Tensor tower_output(QwenFixture& f, int64_t gh, int64_t gw) {
  at::manual_seed(11);
  const at::Tensor patches = at::randn({gh * gw, 3 * 2 * 14 * 14}).to(test::test_device());
  const at::Tensor grid = at::tensor({int64_t{1}, gh, gw}, at::kLong).view({1, 3});
  return f.model->vision()->encode(patches, grid);
}

// Attention in the tower holds one block of query rows' scores at a time, not every patch against every patch: at
// 4096 patches (a 896 x 896 image) the whole scores of one block's two heads would be 128 MiB, twice with the
// probabilities. The blocked results equal the whole-scores ones.
TEST_P(GoldenQwen2VL, VisionTowerMemoryIsLinearInThePatchesWithTheSameResults) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  // 1536 patches: 2 heads x 1536^2 scores are past nn::kMaxWholeScores, so the default runs in blocks.
  ASSERT_GT(2 * 1536 * 1536, nn::max_whole_scores());
  const at::Tensor blocked = tower_output(f, 32, 48).cpu();
  nn::set_max_whole_scores(int64_t{1} << 40);
  const at::Tensor whole = tower_output(f, 32, 48).cpu();
  nn::set_max_whole_scores(nn::kMaxWholeScores);
  EXPECT_LE(max_abs_diff(blocked, whole), kVisionTol);
  EXPECT_EQ(blocked.sizes(), whole.sizes());

  const at::Device device = test::test_device();
  install_memory_tracking();
  tower_output(f, 8, 8);  // warm: first-call allocations are not the tower's
  reset_peak_memory(device);
  const int64_t before = current_memory_bytes(device);
  const at::Tensor out = tower_output(f, 64, 64);
  const int64_t peak = peak_memory_bytes(device) - before;
  std::cout << "[" << v.name << "] tower peak at 4096 patches: " << (peak >> 20) << " MiB" << std::endl;
  EXPECT_EQ(out.size(0), 1024);
  EXPECT_LT(peak, int64_t{48} << 20);
}

// Images are counted from their headers before any is decoded: the count equals the preprocessed image's for
// every real image and pixel setting, and a prompt or row too long with its images is refused (or dropped, or cut
// before the image) with no pixel decoded or resized: a min_pixels of 10^8 would resize coffee.jpg to 10^8 pixels
// (1.2 GB of float32 values) for 127,551 tokens.
TEST_P(GoldenQwen2VL, ImageTokensAreCountedFromTheHeaderAndLongPromptsRefusedBeforeAnyPixel) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const fs::path model_dir = ref_dir(v) / v.model;
  const MultimodalConfig mm = *load_decoder_config(model_dir).multimodal;
  const fs::path images = assets() / "images";
  const std::vector<std::string> names = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png",
                                          "astronaut_224.png"};
  for (const vision::ImageProcessorOverrides& o : std::vector<vision::ImageProcessorOverrides>{
           {}, {std::nullopt, int64_t{200704}}, {int64_t{1003520}, int64_t{1003520}}}) {
    const ImageEncoding im = make_image_encoding(model_dir, mm, o);
    for (const std::string& name : names) {
      const PlannedImage planned = plan_image_file(images / name, im);
      EXPECT_EQ(planned.tokens, process_image_file(images / name, im).tokens) << name;
      EXPECT_EQ(process_planned_image(planned, im).tokens, planned.tokens) << name;
    }
  }
  const auto tokenizer = load_tokenizer(model_dir);
  EncodeOptions options;
  options.max_length = 32768;
  options.images = make_image_encoding(model_dir, mm, {int64_t{100000000}, int64_t{100000000}});
  EXPECT_EQ(plan_image_file(images / "coffee.jpg", *options.images).tokens, 127896);
  install_memory_tracking();
  const at::Device cpu(at::kCPU);
  reset_peak_memory(cpu);
  const int64_t before = current_memory_bytes(cpu);
  {
    const SampleEncoder encoder(tokenizer, chat_template_for(*tokenizer, "qwen2"), options);
    const std::vector<ChatMessage> prompt = {{"user", "<image>What is this?", std::nullopt}};
    test::expect_error<ConfigError>([&] { encoder.encode_prompt(prompt, {images / "coffee.jpg"}); },
                                    {"127", "32768", "before decoding"});
    const Json row = {{"messages", {{{"role", "user"}, {"content", "<image>What is this?"}},
                                    {{"role", "assistant"}, {"content", "A cup."}}}},
                      {"images", {(images / "coffee.jpg").string()}}};
    EXPECT_FALSE(encoder.encode(normalise_row(row, "rows.jsonl:1")).has_value());  // delete: dropped
    EncodeOptions left = options;
    left.truncation = TruncationStrategy::kLeft;
    const SampleEncoder cutting(tokenizer, chat_template_for(*tokenizer, "qwen2"), left);
    const auto sample = cutting.encode(normalise_row(row, "rows.jsonl:1"));
    ASSERT_TRUE(sample.has_value());
    EXPECT_TRUE(sample->pixel_values.empty());  // the image's run was cut: the image is dropped, never decoded
    EXPECT_LT(sample->input_ids.size(), 64u);
  }
  EXPECT_LT(peak_memory_bytes(cpu) - before, int64_t{16} << 20);
}

// The model's media tokens typed in a message are refused under one rule, image and video alike (each would be
// parsed as a position without its pixels); images are written <image>.
TEST_P(GoldenQwen2VL, TypedImageAndVideoTokensAreRefusedUnderOneRule) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const fs::path model_dir = ref_dir(v) / v.model;
  const auto tokenizer = load_tokenizer(model_dir);
  EncodeOptions options;
  options.max_length = 4096;
  options.images = make_image_encoding(model_dir, *load_decoder_config(model_dir).multimodal);
  const SampleEncoder encoder(tokenizer, chat_template_for(*tokenizer, "qwen2"), options);
  const fs::path coffee = assets() / "images" / "coffee.jpg";
  for (const auto& [token, what] : std::vector<std::pair<std::string, std::string>>{
           {"<|image_pad|>", "image"}, {"<|video_pad|>", "video"}}) {
    for (const bool with_image : {false, true}) {
      SCOPED_TRACE(token + (with_image ? " beside an image" : ""));
      Json row = {{"messages", {{{"role", "user"}, {"content", (with_image ? "<image>" : "") + token + " what?"}},
                                {{"role", "assistant"}, {"content", "A cup."}}}}};
      if (with_image) row["images"] = Json::array({coffee.string()});
      test::expect_error<BadRowError>([&] { encoder.encode(normalise_row(row, "rows.jsonl:3")); },
                                      {"rows.jsonl:3", "media token", "message 0", token, what, "<image>"});
      const std::vector<ChatMessage> prompt = {{"user", token + " what?", std::nullopt}};
      test::expect_error<ConfigError>([&] { encoder.encode_prompt(prompt, std::vector<fs::path>{}); }, {"message 0", token, what});
    }
  }
  // The same text without the tokens encodes.
  const Json row = {{"messages", {{{"role", "user"}, {"content", "<image>what?"}}, {{"role", "assistant"}, {"content", "A cup."}}}},
                    {"images", {coffee.string()}}};
  EXPECT_TRUE(encoder.encode(normalise_row(row, "rows.jsonl:4")).has_value());
}

TEST_P(GoldenQwen2VL, PackedSamplesKeepTheirOwnMRopePositionsAndLoss) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const fs::path model_dir = ref_dir(v) / v.model;
  const Json ref = load_json_file(ref_dir(v) / "logits.json");
  const auto tokenizer = load_tokenizer(model_dir);
  EncodeOptions options;
  options.max_length = 4096;
  options.images = make_image_encoding(model_dir, *load_decoder_config(model_dir).multimodal);
  const SampleEncoder encoder(tokenizer, chat_template_for(*tokenizer, "qwen2"), options);
  std::vector<Sample> samples;
  for (const auto& r : ref["cases"]["d_loss_batch"]["rows"]) {
    Json row = {{"messages", Json::array()}, {"images", Json::array()}};
    for (const auto& m : placeholder_messages(r["messages"])) row["messages"].push_back({{"role", m.role}, {"content", m.content}});
    for (const auto& f : r["images"]) row["images"].push_back((assets() / "images" / f.get<std::string>()).string());
    samples.push_back(*encoder.encode(normalise_row(row, "d_loss_batch")));
  }
  TrainConfig c;
  c.model = model_dir.string();
  c.dataset = {"unused"};
  Trainer trainer(c, load_causal_lm(model_dir));  // fresh LoRA: B = 0, the base model's outputs
  const Batch padded = collate_padded({&samples[0], &samples[1]}, 1000);
  const Batch packed = collate_packed({{&samples[0], &samples[1]}}, 1000);
  ASSERT_EQ(packed.input_ids.size(0), 1);
  ASSERT_TRUE(packed.image_grid_thw.defined());
  const auto [sum_padded, n_padded] = trainer.evaluate({padded});
  const auto [sum_packed, n_packed] = trainer.evaluate({packed});
  EXPECT_EQ(n_padded, n_packed);
  EXPECT_NEAR(sum_padded / n_padded, ref["cases"]["d_loss_batch"]["loss"].get<double>(), kLossTol);
  EXPECT_NEAR(sum_packed / n_packed, sum_padded / n_padded, kLossTol);
  // The packed row's positions restart at each sample: the second sample's equal its own alone.
  const auto [alone, alone_deltas] = mrope_positions(padded.input_ids.narrow(0, 1, 1), padded.image_grid_thw.narrow(0, 1, 1),
                                                      padded.key_valid.narrow(0, 1, 1), {}, 1012, 2);
  const auto [row, row_deltas] = mrope_positions(packed.input_ids, packed.image_grid_thw, packed.key_valid,
                                                  packed.segment_ids, 1012, 2);
  const int64_t first = static_cast<int64_t>(samples[0].input_ids.size());
  const int64_t second = static_cast<int64_t>(samples[1].input_ids.size());
  EXPECT_TRUE(row.narrow(2, first, second).equal(alone.narrow(2, 0, second)));
}

// The LoRA step's batch (d_loss_batch) as the trainer takes it: shifted labels, its images and grids.
Batch lora_batch(const Version& v) {
  const Json ref = load_json_file(ref_dir(v) / "lora_step.json");
  Batch batch = test::batch_from_reference(ref["batch"]);
  const Checkpoint logits = Checkpoint::open(ref_dir(v) / "logits.safetensors");
  batch.pixel_values = logits.tensor("d_loss_batch.pixel_values").clone();
  batch.image_grid_thw = long_tensor(ref["batch"]["image_grid_thw"]);
  return batch;
}

TEST_P(GoldenQwen2VL, PeftAdaptersWithTheMergerReproducePeftLogits) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "lora_step.json");
  QwenFixture f(v);
  const Checkpoint step = Checkpoint::open(ref_dir(v) / "lora_step.safetensors");
  const Json& a = f.ref["cases"]["a_one_image"];
  for (const char* name : {"init", "after1"}) {
    CausalLM model = load_causal_lm(ref_dir(v) / v.model);
    const LoraConfig c = load_adapter(model, ref_dir(v) / name);
    EXPECT_EQ(c.modules_to_save, std::vector<std::string>{"merger"});
    int adapted = 0;
    for (const auto& m : model->named_modules("", false)) {
      if (const auto* l = m.value()->as<nn::Linear>(); l != nullptr && l->lora) {
        ++adapted;
        EXPECT_EQ(m.key().rfind("model.layers.", 0), 0u) << m.key();
      }
    }
    EXPECT_EQ(adapted, 14);
    at::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(long_tensor(a["input_ids"]), f.options(a)).cpu();
    const double diff = max_abs_diff(logits, step.tensor(fmt::format("{}.logits_a_one_image", name)));
    std::cout << "[" << v.name << " peft " << name << "] max |logit - peft| = " << diff << std::endl;
    EXPECT_LE(diff, kLogitTol) << name;
  }
}

TEST_P(GoldenQwen2VL, OneLoraStepWithTheMergerMatchesPeft) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "lora_step.json");
  const Json ref = load_json_file(ref_dir(v) / "lora_step.json");
  const std::string model_dir = (ref_dir(v) / v.model).string();
  Trainer trainer(test::reference_config(model_dir, ref_dir(v) / "init"), load_causal_lm(model_dir));
  int64_t trainable = 0;
  for (const auto& t : trainer.trainables()) trainable += t.tensor.numel();
  EXPECT_EQ(trainable, ref["trainable"]["n_params"].get<int64_t>());
  for (const auto& p : trainer.model()->named_parameters(true)) {
    if (p.key().rfind("visual.blocks.", 0) == 0 || p.key().rfind("visual.patch_embed.", 0) == 0) {
      EXPECT_FALSE(p.value().requires_grad()) << p.key();
    }
  }
  const Batch batch = lora_batch(v);
  const StepResult r = trainer.step({batch}, 0, 1);
  EXPECT_NEAR(r.loss, ref["loss_before"].get<double>(), kLossTol);
  EXPECT_NEAR(r.grad_norm, ref["grad_l2_norm_total_step1"].get<double>(), 1e-4);
  const double err = test::adapter_rel_error(trainer.trainables(), ref_dir(v) / "after1");
  std::cout << "[" << v.name << " lora step] worst relative adapter error " << err << std::endl;
  // The reference itself, rerun on OpenBLAS, moves after1/ by up to 2.1e-5 in 2-3 of ~43,500 elements (those whose
  // gradient is near Adam's eps: the first step is lr g / (|g| + eps)) and by at most 1e-6 elsewhere (README
  // "Tolerances"). So: every element within 5e-5, and at most 0.1% of them beyond 2e-6; the relative norm of
  // the worst tensor, dominated by those few elements in a small lora_B, within 5e-5.
  EXPECT_LT(err, 5e-5);
  const Checkpoint after = Checkpoint::open(ref_dir(v) / "after1/adapter_model.safetensors");
  int64_t elements = 0, beyond = 0;
  for (const auto& t : trainer.trainables()) {
    const at::Tensor diff = (t.tensor.detach().to(at::kDouble) - after.tensor(t.name).to(at::kDouble)).abs();
    EXPECT_LE(diff.max().item<double>(), 5e-5) << t.name;
    elements += diff.numel();
    beyond += (diff > 2e-6).sum().item<int64_t>();
  }
  EXPECT_LE(beyond, elements / 1000) << beyond << " of " << elements << " elements differ by more than 2e-6";
  const auto [sum, count] = trainer.evaluate({batch});
  EXPECT_NEAR(sum / static_cast<double>(count), ref["loss_after_step1"].get<double>(), kLossTol);
  // Saved as PEFT saves it (the merger under base_model.model.visual.merger.*) and loaded back with equal logits.
  const fs::path dir = test::temp_dir(std::string(v.name) + "_adapter_save");
  save_adapter(dir, trainer.model(), trainer.lora_config());
  const Checkpoint saved = Checkpoint::open(dir / "adapter_model.safetensors");
  const Checkpoint peft = Checkpoint::open(ref_dir(v) / "after1/adapter_model.safetensors");
  EXPECT_EQ(saved.names(), peft.names());
  CausalLM reloaded = load_causal_lm(model_dir);
  load_adapter(reloaded, dir);
  at::NoGradGuard no_grad;
  trainer.model()->eval();
  QwenFixture f(v);
  const Json& a = f.ref["cases"]["a_one_image"];
  const at::Tensor ids = long_tensor(a["input_ids"]);
  EXPECT_LE(max_abs_diff(reloaded->forward(ids, f.options(a)), trainer.model()->forward(ids, f.options(a))), 1e-6);
}

TEST_P(GoldenQwen2VL, FreshLoraTargetsTheLanguageModelOnlyAndTrainsTheMergerInFull) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  for (const std::vector<std::string>& targets :
       {std::vector<std::string>{"all-linear"}, std::vector<std::string>{"gate_proj", "up_proj", "down_proj", "qkv"}}) {
    TrainConfig c;
    c.model = (ref_dir(v) / v.model).string();
    c.dataset = {"unused"};
    c.target_modules = targets;
    if (targets.back() == "qkv") {
      // "qkv" names only vision-tower layers: outside the language model, so it matches nothing there.
      EXPECT_THROW(Trainer(c, load_causal_lm(c.model)), ConfigError);
      c.target_modules.pop_back();
    }
    Trainer trainer(c, load_causal_lm(c.model));
    EXPECT_EQ(trainer.lora_config().modules_to_save, std::vector<std::string>{"visual.merger"});
    int lora = 0, merger = 0;
    for (const auto& t : trainer.trainables()) {
      if (t.name.find("lora_") != std::string::npos) {
        ++lora;
        EXPECT_EQ(t.name.find("visual."), std::string::npos) << t.name;  // Qwen2.5-VL's vision MLP is gate/up/down too
      } else {
        ++merger;
        EXPECT_NE(t.name.find("visual.merger."), std::string::npos) << t.name;
      }
    }
    EXPECT_EQ(lora, targets.front() == "all-linear" ? 28 : 12);
    EXPECT_EQ(merger, v.parameters == 311680 ? 6 : 5);
  }
}

TEST_P(GoldenQwen2VL, FullTrainingFreezesTheTowerMergerOrLanguageModelByName) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  TrainConfig c;
  c.model = (ref_dir(v) / v.model).string();
  c.dataset = {"unused"};
  c.train_type = "full";
  c.freeze_vit = true;
  c.freeze_aligner = false;
  c.freeze_llm = true;
  Trainer trainer(c, load_causal_lm(c.model));
  for (const auto& p : trainer.model()->named_parameters(true)) {
    const bool merger = p.key().rfind("visual.merger.", 0) == 0;
    EXPECT_EQ(p.value().requires_grad(), merger) << p.key();
  }
}

// The label log-probability sum of one sample under `model`: its own forward, its own images.
double sample_logp(CausalLM& model, const Sample& s) {
  at::NoGradGuard no_grad;
  const ImageInputs images = batch_images({&s});
  ForwardOptions o;
  o.pixel_values = images.pixel_values.to(test::test_device());
  o.image_grid_thw = images.image_grid_thw;
  const at::Tensor ids = at::tensor(std::vector<int64_t>(s.input_ids.begin(), s.input_ids.end()), at::kLong).view({1, -1});
  const at::Tensor logp = at::log_softmax(model->forward(ids.to(test::test_device()), o).to(at::kDouble), -1)[0];
  double sum = 0;
  for (size_t t = 0; t < s.labels.size(); ++t) {
    if (s.labels[t] != kIgnoreIndex) sum += logp[static_cast<int64_t>(t)][s.labels[t]].item<double>();
  }
  return sum;
}

// DPO on image pairs through pair_objective (the code `swiftcpp rlhf` runs: one padded 2B-row forward, each prompt's
// images encoded once for both rows, the reference as the LoRA policy with its adapters off and the merger, trained
// in full, at its loaded value) equals the sigmoid loss computed from each sequence's own forward: the policy's, and
// a freshly loaded base model's for the reference. The policy's trained merger comes back after the reference.
TEST_P(GoldenQwen2VL, DpoWithImagesEqualsItsFormulaOnEachSequencesOwnForward) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  SWIFTCPP_REQUIRE_SHARED(assets() / "images" / "rocket.jpg");
  const fs::path model_dir = ref_dir(v) / v.model;
  TrainConfig c;
  c.model = model_dir.string();
  c.dataset = {"unused"};
  c.seed = 3;
  Trainer trainer(c, load_causal_lm(model_dir, {test::test_device(), at::kFloat}));
  CausalLM& policy = trainer.model();
  {  // adapters and merger moved away from the base, so policy and reference differ in both
    at::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(11);
    for (const auto& t : trainer.trainables()) {
      t.tensor.add_(at::normal(0.0, 0.05, t.tensor.sizes(), gen, at::TensorOptions().dtype(at::kFloat))
                        .to(t.tensor.device(), t.tensor.scalar_type()));
    }
  }
  policy->eval();  // no dropout: the direct forwards below are deterministic too
  const auto tokenizer = load_tokenizer(model_dir);
  PreferenceEncodeOptions options;
  options.max_length = 512;
  options.images = make_image_encoding(model_dir, *policy->config().multimodal);
  const PreferenceEncoder encoder(tokenizer, chat_template_for(*tokenizer, "qwen2"), options);
  const fs::path images = assets() / "images";
  std::vector<PreferenceSample> pairs;
  for (const auto& [file, chosen, rejected] : {std::tuple<const char*, const char*, const char*>{
                                                   "rocket.jpg", "A rocket on its pad.", "A cup of coffee."},
                                               {"coffee.jpg", "Coffee.", "It is a small red rocket, I think."}}) {
    PreferenceRow row;
    row.prompt = {{"user", std::string(kImagePlaceholder) + "What is in the picture?", std::nullopt}};
    row.chosen = chosen;
    row.rejected = rejected;
    row.images = {images / file};
    row.where = file;
    pairs.push_back(encoder.encode_pair(row).value());
  }
  ASSERT_EQ(pairs[0].chosen.pixel_values.size(), 1u);
  const PreferenceBatch batch = collate_preference({&pairs[0], &pairs[1]}, 0);
  PreferenceOptions dpo;
  dpo.rlhf_type = RlhfType::kDpo;
  const std::vector<std::pair<std::string, at::Tensor>> before = [&] {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& t : trainer.trainables()) out.emplace_back(t.name, t.tensor.detach().clone());
    return out;
  }();
  const PreferenceResult r = pair_objective(dpo, policy, batch, {}, CausalLM(nullptr), false);

  CausalLM base = load_causal_lm(model_dir, {test::test_device(), at::kFloat});
  base->eval();
  double loss = 0, chosen_reward = 0;
  for (const PreferenceSample& p : pairs) {
    const double pc = sample_logp(policy, p.chosen), pr = sample_logp(policy, p.rejected);
    const double rc = sample_logp(base, p.chosen), rr = sample_logp(base, p.rejected);
    const double h = (pc - pr) - (rc - rr);
    loss += std::log1p(std::exp(-0.1 * h)) / 2;  // -log sigmoid(beta h), mean over the pairs
    chosen_reward += 0.1 * (pc - rc) / 2;
  }
  std::cout << "[" << v.name << " dpo with images] loss " << r.loss.item<double>() << " vs direct " << loss << std::endl;
  EXPECT_NEAR(r.loss.item<double>(), loss, 1e-5);
  EXPECT_NEAR(r.metrics.at("rewards/chosen"), chosen_reward, 1e-5);
  EXPECT_GT(std::abs(chosen_reward), 1e-3) << "the policy must differ from its reference";
  // The reference's modules_to_save values were swapped back: the trained merger is in place and gets gradients.
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(trainer.trainables()[i].tensor.detach().equal(before[i].second)) << before[i].first;
  }
  r.loss.backward();
  bool merger_grad = false;
  for (const auto& t : trainer.trainables()) {
    if (t.name.find("visual.merger.") != std::string::npos && t.tensor.grad().defined()) {
      merger_grad = merger_grad || t.tensor.grad().abs().sum().item<double>() > 0;
    }
  }
  EXPECT_TRUE(merger_grad);
}

// GRPO's training forward on image prompts: each row (a prompt's completion; rows of one prompt share its images)
// gives the log-probabilities of its own forward with its own images. encode_generation_prompt keeps the last tokens
// of a long prompt without splitting an image.
TEST_P(GoldenQwen2VL, GrpoCompletionLogpsWithImagesEqualEachRowsOwnForward) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  SWIFTCPP_REQUIRE_SHARED(assets() / "images" / "rocket.jpg");
  const fs::path model_dir = ref_dir(v) / v.model;
  CausalLM model = load_causal_lm(model_dir, {test::test_device(), at::kFloat});
  model->eval();
  const auto tokenizer = load_tokenizer(model_dir);
  PreferenceEncodeOptions options;
  options.images = make_image_encoding(model_dir, *model->config().multimodal);
  const PreferenceEncoder encoder(tokenizer, chat_template_for(*tokenizer, "qwen2"), options);
  const fs::path images = assets() / "images";
  std::vector<std::vector<int64_t>> prompts;
  std::vector<ImageInputs> prompt_images;
  for (const char* file : {"rocket.jpg", "coffee.jpg"}) {
    const std::vector<ChatMessage> messages = {{"user", "What is this? <image>", std::nullopt}};
    const auto p = encoder.encode_generation_prompt(messages, {images / file}, file, 4096, false);
    ASSERT_TRUE(p.has_value());
    prompts.emplace_back(p->ids.begin(), p->ids.end());
    prompt_images.push_back(p->batched_images());
    ASSERT_FALSE(prompt_images.back().empty());
  }
  const std::vector<std::vector<int64_t>> completions = {{20, 31, 42, 7}, {5, 6}, {9, 10, 11}};
  const std::vector<size_t> owner = {0, 0, 1};  // two completions of the rocket, one of the coffee
  const std::vector<int64_t> counted = {4, 2, 3};
  std::vector<const std::vector<int64_t>*> p, c;
  std::vector<const ImageInputs*> im;
  for (size_t r = 0; r < owner.size(); ++r) {
    p.push_back(&prompts[owner[r]]);
    im.push_back(&prompt_images[owner[r]]);
    c.push_back(&completions[r]);
  }
  const CompletionBatch b = collate_completions(p, c, counted, 0, im);
  at::NoGradGuard no_grad;
  const at::Tensor logps = completion_logps(model, b, 1.0, false).logps.cpu();  // [3, 4]
  for (size_t r = 0; r < owner.size(); ++r) {
    std::vector<int64_t> ids = prompts[owner[r]];
    ids.insert(ids.end(), completions[r].begin(), completions[r].begin() + counted[r]);
    ForwardOptions o;
    o.pixel_values = prompt_images[owner[r]].pixel_values.to(test::test_device());
    o.image_grid_thw = prompt_images[owner[r]].image_grid_thw;
    const at::Tensor lp =
        at::log_softmax(model->forward(at::tensor(ids, at::kLong).view({1, -1}).to(test::test_device()), o), -1)[0].cpu();
    const auto P = static_cast<int64_t>(prompts[owner[r]].size());
    for (int64_t t = 0; t < counted[r]; ++t) {
      EXPECT_NEAR(logps[static_cast<int64_t>(r)][t].item<double>(), lp[P - 1 + t][completions[r][t]].item<double>(), 1e-5)
          << "row " << r << " token " << t;
    }
  }
  // Keeping the last tokens of a prompt whose cut would split its image leaves the image out whole.
  const std::vector<ChatMessage> long_prompt = {{"user", "<image> is what I see, and now a question about it?", std::nullopt}};
  const auto whole = encoder.encode_generation_prompt(long_prompt, {images / "rocket.jpg"}, "w", 4096, true);
  ASSERT_TRUE(whole.has_value());
  const auto n = static_cast<int64_t>(whole->ids.size());
  const auto first = std::find(whole->ids.begin(), whole->ids.end(), options.images->image_token_id) - whole->ids.begin();
  const auto cut = encoder.encode_generation_prompt(long_prompt, {images / "rocket.jpg"}, "w", n - first - 2, true);
  ASSERT_TRUE(cut.has_value());
  EXPECT_TRUE(cut->pixel_values.empty());
  EXPECT_EQ(std::count(cut->ids.begin(), cut->ids.end(), options.images->image_token_id), 0);
  EXPECT_LT(static_cast<int64_t>(cut->ids.size()), n - first - 2);
  EXPECT_FALSE(encoder.encode_generation_prompt(long_prompt, {images / "rocket.jpg"}, "w", n - 1, false).has_value());
}

INSTANTIATE_TEST_SUITE_P(Versions, GoldenQwen2VL, ::testing::ValuesIn(kVersions),
                         [](const ::testing::TestParamInfo<Version>& info) {
                           return std::string(info.param.type);
                         });

}  // namespace
}  // namespace swiftcpp
