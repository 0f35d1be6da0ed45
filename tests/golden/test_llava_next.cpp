// Golden tests: LLaVA-NeXT (LlavaNextForConditionalGeneration, anyres) against transformers 4.40.2 on the tiny
// reference checkpoint (../shared/assets/reference/llava_next): LlavaNextImageProcessor's layout, pixel values
// and token counts for three images (one with the short, odd-padded canvas), the packed image features
// (image_newline rows included) and the logits of each case through model->forward, the config and its
// parameter count, and refused configs.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <functional>
#include <iostream>

#include "core/fs.h"
#include "data/encode.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "tests/tensor_util.h"
#include "vision/image.h"
#include "vision/image_processor.h"
#include "vision/llava_next_processor.h"

namespace swiftcpp {
namespace {

using test::assets;

// Pixel values: the reference is float32 from the same uint8 values through the same float32 table, so they are
// equal up to the float32 arithmetic (1e-6). Features and logits: float32 against transformers' float32
// (netlib BLAS); only summation order differs.
constexpr double kPixelTol = 1e-6;
constexpr double kF32Tol = 1e-4;

const char* const kCases[] = {"coffee", "rocket", "astronaut_224"};

fs::path ref_dir() { return assets() / "reference/llava_next"; }
fs::path model_dir() { return ref_dir() / "tiny-llava-next"; }

at::Tensor long_tensor(const Json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

std::vector<int64_t> ints(const Json& list) { return list.get<std::vector<int64_t>>(); }

// The reference model with every tensor of the checkpoint in place: the CausalLM's parameters by name, and the
// encoder's own image_newline (which the CausalLM does not list: see LoadsThroughLoadCausalLm).
CausalLM load_reference_model() {
  CausalLM model(load_decoder_config(model_dir()));
  const Checkpoint ck = Checkpoint::open(model_dir());
  at::NoGradGuard no_grad;
  for (auto& p : model->named_parameters(true)) p.value().set_data(ck.tensor(p.key()).to(test::test_device()).clone());
  for (auto& p : model->vision()->named_parameters(false)) {
    p.value().set_data(ck.tensor(p.key()).to(test::test_device()).clone());
  }
  model->eval();
  return model;
}

struct Fixture {
  Json ref = load_json_file(ref_dir() / "llava_next_logits.json");
  Checkpoint tensors = Checkpoint::open(ref_dir() / "llava_next_logits.safetensors");
  std::shared_ptr<const vision::ImageProcessor> processor = vision::load_image_processor(model_dir(), 0);
  CausalLM model = load_reference_model();

  vision::ProcessedImage image(const Json& c) const {
    return processor->process(vision::read_image(assets() / "images" / c["image"].get<std::string>()));
  }
  /// The case's forward inputs, as the data path builds them: ids with the image token expanded to the
  /// processor's count, pixel values [entries, 3, 56, 56] and image_grid_thw [1, 3].
  std::pair<at::Tensor, ForwardOptions> inputs(const Json& c) const {
    const vision::ProcessedImage img = image(c);
    std::vector<int> ids;
    for (const auto& v : c["input_ids"][0]) ids.push_back(v.get<int>());
    const std::vector<int> expanded = expand_image_tokens(ids, 512, std::vector<int64_t>{img.tokens});
    const at::Tensor input = at::tensor(std::vector<int64_t>(expanded.begin(), expanded.end()), at::kLong).view({1, -1});
    ForwardOptions o;
    o.pixel_values = img.pixel_values.to(test::test_device());
    o.image_grid_thw = at::tensor(std::vector<int64_t>(img.grid_thw.begin(), img.grid_thw.end()), at::kLong).view({1, 3});
    o.key_valid = at::ones({1, input.size(1)}, at::kBool).to(test::test_device());
    return {input.to(test::test_device()), o};
  }
};

TEST(GoldenLlavaNext, ConfigNamesTheCompositeModelAndCountsItsParameters) {
  SWIFTCPP_REQUIRE_SHARED(model_dir() / "config.json");
  const DecoderConfig c = load_decoder_config(model_dir());
  EXPECT_EQ(c.model_type, "llava_next");
  EXPECT_EQ(c.architecture, "LlavaNextForConditionalGeneration");
  ASSERT_TRUE(c.multimodal);
  EXPECT_EQ(c.multimodal->image_token_index, 512);
  EXPECT_EQ(c.multimodal->image_seq_length, 0);  // the processor says, per image
  EXPECT_EQ(c.multimodal->language_model, "language_model");
  EXPECT_EQ(c.vocab_size, 520);
  EXPECT_EQ(c.hidden_size, 64);
  // The checkpoint's tensors: tiny-llava's 204,000 parameters plus image_newline [64].
  const Checkpoint ck = Checkpoint::open(model_dir());
  int64_t in_file = 0;
  for (const auto& name : ck.names()) in_file += ck.tensor(name).numel();
  EXPECT_EQ(in_file, 204064);
  EXPECT_EQ(c.parameter_count(), 204064);
  CausalLM model(c);
  EXPECT_EQ(model->language_model_prefix(), "language_model.");
  EXPECT_FALSE(model->in_language_model("image_newline"));
  EXPECT_FALSE(model->in_language_model("multi_modal_projector.linear_1"));
  EXPECT_TRUE(model->in_language_model("language_model.model.layers.0.mlp.gate_proj"));
  const auto own = model->vision()->named_parameters(false);
  ASSERT_TRUE(own.contains("image_newline"));
  EXPECT_EQ(own["image_newline"].numel(), 64);
}

// The model's tensors are the checkpoint's names, image_newline at the top as Hugging Face has it. This needs the
// CausalLM to register its vision encoder's own parameters (models/decoder/decoder.cpp registers only the
// encoder's child modules today).
TEST(GoldenLlavaNext, LoadsThroughLoadCausalLm) {
  SWIFTCPP_REQUIRE_SHARED(model_dir() / "config.json");
  CausalLM model(load_decoder_config(model_dir()));
  int64_t n = 0;
  for (const auto& p : model->named_parameters(true)) n += p.value().numel();
  EXPECT_EQ(n, 204064);
  EXPECT_TRUE(model->named_parameters(true).contains("image_newline"))
      << "the CausalLM does not list the vision encoder's own parameter image_newline";
  EXPECT_NO_THROW(load_causal_lm(model_dir(), {test::test_device(), at::kFloat}));
}

TEST(GoldenLlavaNext, ProcessorLayoutPixelValuesAndTokenCountsMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(ref_dir() / "llava_next_logits.json");
  const Json ref = load_json_file(ref_dir() / "llava_next_logits.json");
  const Checkpoint tensors = Checkpoint::open(ref_dir() / "llava_next_logits.safetensors");
  const auto processor = vision::load_image_processor(model_dir(), 0);
  EXPECT_EQ(processor->type(), "LlavaNextImageProcessor");
  EXPECT_TRUE(processor->variable_size());
  const vision::LlavaNextProcessorConfig config =
      vision::parse_llava_next_processor_config(JsonObject::load(model_dir() / "preprocessor_config.json"));
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const Json& c = ref["cases"][name];
    const vision::Image image = vision::read_image(assets() / "images" / c["image"].get<std::string>());
    const int64_t h = image.height, w = image.width;
    EXPECT_EQ((std::vector<int64_t>{h, w}), ints(c["image_sizes"][0]));
    // Steps 1 to 4, field by field.
    const vision::AnyresLayout l = vision::anyres_layout(h, w, config.image_grid_pinpoints, 56);
    EXPECT_EQ((std::vector<int64_t>{l.best.height, l.best.width}), ints(c["best_resolution_hw"]));
    EXPECT_EQ((std::vector<int64_t>{l.resized_height, l.resized_width}), ints(c["resized_for_tiles_hw"]));
    EXPECT_EQ((std::vector<int64_t>{l.pad_top, l.pad_left}), ints(c["pad_top_left"]));
    EXPECT_EQ((std::vector<int64_t>{l.canvas_height, l.canvas_width}), ints(c["padded_hw"]));
    EXPECT_EQ((std::vector<int64_t>{l.tile_rows, l.tile_cols}), ints(c["tile_grid_hw"]));
    std::vector<std::vector<int64_t>> entry_hw = {{56, 56}};  // the whole image at shortest_edge squared
    for (int64_t r = 0; r < l.tile_rows; ++r) {
      for (int64_t col = 0; col < l.tile_cols; ++col) {
        entry_hw.push_back({std::min<int64_t>(56, l.canvas_height - 56 * r), std::min<int64_t>(56, l.canvas_width - 56 * col)});
      }
    }
    EXPECT_EQ(entry_hw, c["entry_hw_before_clip_steps"].get<std::vector<std::vector<int64_t>>>());
    // The model-side layout: feature grid before and after unpadding, and the count.
    const vision::AnyresFeatureLayout f = vision::anyres_feature_layout(h, w, config.image_grid_pinpoints, 56, 4);
    EXPECT_EQ((std::vector<int64_t>{f.grid_rows, f.grid_cols}), ints(c["feature_map_hw_before_unpad"]));
    EXPECT_EQ((std::vector<int64_t>{f.rows, f.cols}), ints(c["feature_map_hw_after_unpad"]));
    EXPECT_EQ(f.tokens(), c["n_image_features"].get<int64_t>());
    // The processor: pixel values [entries, 3, 56, 56], its size triple and token count.
    const vision::ProcessedImage out = processor->process(image);
    const at::Tensor expected = tensors.tensor(std::string(name) + ".pixel_values").squeeze(0);  // [5, 3, 56, 56]
    ASSERT_EQ(out.pixel_values.sizes(), expected.sizes());
    const double diff = max_abs_diff(out.pixel_values, expected);
    std::cout << "[llava_next " << name << "] max |pixel_values - HF| = " << diff << ", tokens " << out.tokens
              << std::endl;
    EXPECT_LE(diff, kPixelTol);
    EXPECT_EQ(out.grid_thw, (std::array<int64_t, 3>{l.entries(), h, w}));
    EXPECT_EQ(out.tokens, c["n_image_features"].get<int64_t>());
    EXPECT_EQ(out.tokens + static_cast<int64_t>(c["input_ids"][0].size()) - 1, c["merged_seq_len"].get<int64_t>());
    // The data path's encoding (train, infer, eval) reads the same processor and counts.
    const ImageEncoding encoding = make_image_encoding(model_dir(), *load_decoder_config(model_dir()).multimodal);
    const vision::ProcessedImage via_data =
        process_image_file(assets() / "images" / c["image"].get<std::string>(), encoding);
    EXPECT_EQ(via_data.tokens, out.tokens);
    EXPECT_TRUE(via_data.pixel_values.equal(out.pixel_values));
    // Counted from the size alone, before any pixel: the same count.
    EXPECT_EQ(processor->tokens_for(h, w), out.tokens);
    EXPECT_EQ(plan_image_file(assets() / "images" / c["image"].get<std::string>(), encoding).tokens, out.tokens);
  }
}

TEST(GoldenLlavaNext, PinpointChoiceBreaksTiesByWasteThenOrder) {
  const std::vector<vision::Pinpoint> pins = {{56, 112}, {112, 56}, {112, 112}};
  // Every pinpoint holds a 10x10 image whole: the least waste wins, the first of equals among those.
  EXPECT_EQ(vision::select_best_resolution(10, 10, pins), (vision::Pinpoint{56, 112}));
  EXPECT_EQ(vision::select_best_resolution(100, 100, pins), (vision::Pinpoint{112, 112}));
  EXPECT_EQ(vision::select_best_resolution(30, 200, pins), (vision::Pinpoint{56, 112}));
  EXPECT_EQ(vision::select_best_resolution(200, 30, pins), (vision::Pinpoint{112, 56}));
  // A canvas one row short (the odd padding) still takes two tile rows; the second is 55 rows high.
  const vision::AnyresLayout l = vision::anyres_layout(400, 600, pins, 56);
  EXPECT_EQ(l.canvas_height, 111);
  EXPECT_EQ(l.tile_rows, 2);
}

TEST(GoldenLlavaNext, ImageFeaturesMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(ref_dir() / "llava_next_logits.json");
  Fixture f;
  c10::InferenceMode guard;
  for (const char* name : kCases) {
    const Json& c = f.ref["cases"][name];
    const auto [ids, o] = f.inputs(c);
    EXPECT_EQ(f.model->vision()->feature_rows(o.pixel_values, o.image_grid_thw), c["n_image_features"].get<int64_t>())
        << name;
    const at::Tensor features = f.model->vision()->encode(o.pixel_values, o.image_grid_thw).cpu();  // [n, 64]
    const at::Tensor expected = f.tensors.tensor(std::string(name) + ".image_features").squeeze(0);
    ASSERT_EQ(features.sizes(), expected.sizes()) << name;
    const double diff = max_abs_diff(features, expected);
    std::cout << "[llava_next " << name << "] max |image_features - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
  }
}

// transformers 4.40.2 cannot batch images of different feature counts; here the rows of each image follow one
// another, so two images encoded together equal each encoded alone.
TEST(GoldenLlavaNext, TwoImagesOfDifferentCountsEncodeAsEachAlone) {
  SWIFTCPP_REQUIRE_SHARED(ref_dir() / "llava_next_logits.json");
  Fixture f;
  c10::InferenceMode guard;
  const auto a = f.inputs(f.ref["cases"]["coffee"]).second, b = f.inputs(f.ref["cases"]["astronaut_224"]).second;
  const at::Tensor px = at::cat({a.pixel_values, b.pixel_values});        // [10, 3, 56, 56]
  const at::Tensor grid = at::cat({a.image_grid_thw, b.image_grid_thw});  // [2, 3]
  EXPECT_EQ(f.model->vision()->feature_rows(px, grid), 70 + 88);
  const at::Tensor both = f.model->vision()->encode(px, grid).cpu();  // [158, 64]
  const at::Tensor alone = at::cat({f.model->vision()->encode(a.pixel_values, a.image_grid_thw),
                                    f.model->vision()->encode(b.pixel_values, b.image_grid_thw)}).cpu();
  EXPECT_LE(max_abs_diff(both, alone), 1e-6);
}

TEST(GoldenLlavaNext, LogitsMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(ref_dir() / "llava_next_logits.json");
  Fixture f;
  c10::InferenceMode guard;
  for (const char* name : kCases) {
    const Json& c = f.ref["cases"][name];
    const auto [ids, o] = f.inputs(c);
    EXPECT_EQ(ids.size(1), c["merged_seq_len"].get<int64_t>()) << name;
    const at::Tensor logits = f.model->forward(ids, o).cpu();  // [1, L, 520]
    const at::Tensor expected = f.tensors.tensor(std::string(name) + ".logits");
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const double diff = max_abs_diff(logits, expected);
    std::cout << "[llava_next " << name << "] max |logits - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
    const at::Tensor argmax = logits.argmax(-1);  // [1, L]
    EXPECT_TRUE(argmax.equal(long_tensor(c["argmax"]))) << name;
  }
}

TEST(GoldenLlavaNext, EncoderRefusesInputsThatDoNotFitTheImages) {
  SWIFTCPP_REQUIRE_SHARED(model_dir() / "config.json");
  CausalLM model(load_decoder_config(model_dir()));
  const at::Tensor px = at::zeros({5, 3, 56, 56});
  const auto grid = [](int64_t n, int64_t h, int64_t w) { return at::tensor({n, h, w}, at::kLong).view({1, 3}); };
  EXPECT_EQ(model->vision()->feature_rows(px, grid(5, 400, 600)), 70);
  test::expect_error<ModelError>([&] { model->vision()->feature_rows(px, {}); }, {"image_grid_thw"});
  test::expect_error<ModelError>([&] { model->vision()->feature_rows(px, grid(3, 400, 600)); }, {"3 entries", "2x2"});
  test::expect_error<ModelError>([&] { model->vision()->feature_rows(at::zeros({6, 3, 56, 56}), grid(5, 400, 600)); },
                                 {"6 entries"});
  test::expect_error<ModelError>([&] { model->vision()->feature_rows(at::zeros({5, 3, 28, 28}), grid(5, 400, 600)); },
                                 {"pixel_values"});
  test::expect_error<ModelError>([&] { model->vision()->feature_rows(px, grid(5, 0, 600)); }, {"0x600"});
}

// A copy of the tiny model's config.json and preprocessor_config.json with `edit` applied to one of them.
fs::path edited_model(const std::string& name, const std::function<void(Json&)>& edit_config,
                      const std::function<void(Json&)>& edit_processor = {}) {
  const fs::path dir = test::temp_dir(name);
  Json config = load_json_file(model_dir() / "config.json");
  Json processor = load_json_file(model_dir() / "preprocessor_config.json");
  if (edit_config) edit_config(config);
  if (edit_processor) edit_processor(processor);
  write_file_atomic(dir / "config.json", config.dump(2));
  write_file_atomic(dir / "preprocessor_config.json", processor.dump(2));
  return dir;
}

TEST(GoldenLlavaNext, BadConfigsNameTheKey) {
  SWIFTCPP_REQUIRE_SHARED(model_dir() / "config.json");
  const std::vector<std::pair<Json, std::vector<std::string>>> bad_pinpoints = {
      {Json("56x112"), {"'image_grid_pinpoints'", "list"}},
      {Json::array(), {"'image_grid_pinpoints'"}},
      {Json::parse("[[56, 112], [56]]"), {"'image_grid_pinpoints[1]'", "[height, width]"}},
      {Json::parse("[[56, 100]]"), {"'image_grid_pinpoints[0]'", "multiples of the tile side 56"}},
      {Json::parse("[[0, 56]]"), {"'image_grid_pinpoints[0]'"}},
      {Json::parse("[[56, \"112\"]]"), {"'image_grid_pinpoints[0]'"}},
  };
  for (const auto& [value, needles] : bad_pinpoints) {
    SCOPED_TRACE(value.dump());
    const fs::path dir = edited_model("llava_next_bad_config", [&](Json& j) { j["image_grid_pinpoints"] = value; });
    test::expect_error<ConfigError>([&] { load_decoder_config(dir); }, needles);
    // The processor's file is checked the same way.
    const fs::path pdir = edited_model("llava_next_bad_processor", {}, [&](Json& j) { j["image_grid_pinpoints"] = value; });
    test::expect_error<ConfigError>([&] { vision::load_image_processor(pdir, 0); }, needles);
  }
  // Strategy "full" cannot be packed (transformers raises too).
  test::expect_error<ConfigError>(
      [&] { load_decoder_config(edited_model("llava_next_full", [](Json& j) { j["vision_feature_select_strategy"] = "full"; })); },
      {"vision_feature_select_strategy", "full"});
  // The processor and the model must agree on the pinpoints and the tile side.
  const fs::path other = edited_model("llava_next_other_pins", {}, [](Json& j) {
    j["image_grid_pinpoints"] = Json::parse("[[56, 112], [112, 56]]");
  });
  test::expect_error<ConfigError>([&] { vision::load_image_processor(other, 0); },
                                  {"image_grid_pinpoints", "differ from the model's"});
  const fs::path crop = edited_model("llava_next_crop", {}, [](Json& j) {
    j["crop_size"] = Json{{"height", 112}, {"width", 112}};
    j["image_grid_pinpoints"] = Json::parse("[[112, 224], [224, 112], [224, 224]]");
  });
  test::expect_error<ConfigError>([&] { vision::load_image_processor(crop, 0); }, {"crop_size 112", "image_size' 56"});
  const fs::path size = edited_model("llava_next_size", {}, [](Json& j) {
    j["size"] = Json{{"height", 56}, {"width", 56}};
  });
  test::expect_error<ConfigError>([&] { vision::load_image_processor(size, 0); }, {"'size'", "shortest_edge"});
  test::expect_error<ConfigError>([&] { vision::load_image_processor(model_dir(), 0, {std::nullopt, 1000}); },
                                  {"max_pixels"});
}

}  // namespace
}  // namespace swiftcpp
