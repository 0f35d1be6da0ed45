// Qwen2VLImageProcessor (lib/vision/qwen2_vl_processor): smart_resize against every row of transformers'
// table, pixel_values and grids of five real images at two settings against transformers 4.46 + Pillow 9.4
// (../shared/assets/reference/qwen2_vl/image_preprocess.*), the patch layout on a hand-built image, both
// spellings of `size` in preprocessor_config.json, and the refusals.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "tests/test_util.h"
#include "vision/image.h"
#include "vision/qwen2_vl_processor.h"

namespace swiftcpp::vision {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

const char* const kImages[] = {"coffee.jpg", "rocket.jpg", "chelsea_rgba.png", "camera.png", "astronaut_224.png"};
const char* const kSettings[] = {"max_12544", "max_50176"};

fs::path images_dir() { return test::assets() / "images"; }
fs::path reference_dir() { return test::assets() / "reference" / "qwen2_vl"; }

using HW = std::pair<int64_t, int64_t>;

Qwen2VLProcessorConfig parse(const std::string& text) {
  return parse_qwen2_vl_processor_config(JsonObject(parse_json(text, "pp.json"), "pp.json"));
}

// ---------------------------------------------------------------------------------------------------------------
// smart_resize

TEST(Qwen2VLProcessor, SmartResizeMatchesEveryTableRow) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "image_preprocess.json");
  const Json root = load_json_file(reference_dir() / "image_preprocess.json");
  const Json& table = root.at("smart_resize_table");
  ASSERT_EQ(table.size(), 184u);
  int errors = 0, zeros = 0, double_rounding = 0;
  for (const Json& row : table) {
    const int64_t h = row.at("h").get<int64_t>(), w = row.at("w").get<int64_t>();
    const int64_t factor = row.at("factor").get<int64_t>();
    const int64_t min_pixels = row.at("min_pixels").get<int64_t>(), max_pixels = row.at("max_pixels").get<int64_t>();
    SCOPED_TRACE(fmt::format("({}, {}) at {}", h, w, row.at("setting").get<std::string>()));
    if (row.contains("error")) {
      ++errors;
      const std::string error = row.at("error").get<std::string>();
      const bool aspect = error.find("aspect ratio") != std::string::npos;
      expect_error<FormatError>([&] { smart_resize(h, w, factor, min_pixels, max_pixels); },
                                {aspect ? "aspect ratio" : "at least the factor 28",
                                 fmt::format("{}x{}", h, w)});
      continue;
    }
    const auto [rh, rw] = smart_resize(h, w, factor, min_pixels, max_pixels);
    EXPECT_EQ(rh, row.at("resized_hw").at(0).get<int64_t>());
    EXPECT_EQ(rw, row.at("resized_hw").at(1).get<int64_t>());
    if (rh == 0 || rw == 0) ++zeros;
    if (row.at("double_rounding_matters").get<bool>()) ++double_rounding;
  }
  // The table covers the cases the README names: errors, sizes of 0, and float64 rounding that changes a size.
  EXPECT_GT(errors, 0);
  EXPECT_GT(zeros, 0);
  EXPECT_GT(double_rounding, 0);
}

TEST(Qwen2VLProcessor, SmartResizeRoundsHalfToEvenInFloat64) {
  // round(2.5) = 2 and round(3.5) = 4 (half away from zero would give 84 and 112 for both).
  EXPECT_EQ(smart_resize(70, 70, 28, 3136, 12544), HW(56, 56));
  EXPECT_EQ(smart_resize(70, 98, 28, 3136, 12544), HW(56, 112));
  // 38 * beta / 28 = 2.0000000000000004 in float64: ceil gives 3, not 2.
  EXPECT_EQ(smart_resize(38, 38, 28, 3136, 12544), HW(84, 84));
  // Not re-checked: a side of 0; aspect 200 exactly is allowed.
  EXPECT_EQ(smart_resize(28, 5600, 28, 3136, 12544), HW(0, 1568));
  EXPECT_EQ(smart_resize(28, 28, 28, 3136, 12544), HW(56, 56));
  expect_error<FormatError>([] { smart_resize(28, 5628, 28, 3136, 12544); }, {"aspect ratio", "201"});
  expect_error<FormatError>([] { smart_resize(27, 100, 28, 3136, 12544); }, {"27x100", "factor 28"});
  expect_error<FormatError>([] { smart_resize(int64_t{1} << 30, int64_t{1} << 30, 28, 3136, 12544); },
                            {"too large"});
  expect_error<ConfigError>([] { smart_resize(100, 100, 0, 3136, 12544); }, {"factor"});
  expect_error<ConfigError>([] { smart_resize(100, 100, 28, 0, 12544); }, {"min_pixels"});
  expect_error<ConfigError>([] { smart_resize(100, 100, 28, 3136, -1); }, {"max_pixels"});
}

// ---------------------------------------------------------------------------------------------------------------
// The whole processor

TEST(Qwen2VLProcessor, PixelValuesMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(reference_dir() / "image_preprocess.safetensors");
  SWIFTCPP_REQUIRE_SHARED(images_dir() / "coffee.jpg");
  const Json root = load_json_file(reference_dir() / "image_preprocess.json");
  const auto reference = SafetensorsFile::open(reference_dir() / "image_preprocess.safetensors");
  double worst = 0.0;
  int skipped = 0;
  for (const char* name : kImages) {
    const Image image = read_image(images_dir() / name);
    for (const char* setting : kSettings) {
      SCOPED_TRACE(fmt::format("{} at {}", name, setting));
      // The processor as the reference ran it: its to_dict(), a 4.46 preprocessor_config.json.
      const Qwen2VLProcessorConfig config = parse_qwen2_vl_processor_config(
          JsonObject(root.at("settings").at(setting).at("processor_config"), fmt::format("settings.{}", setting)));
      EXPECT_EQ(config.min_pixels, root.at("settings").at(setting).at("min_pixels").get<int64_t>());
      EXPECT_EQ(config.max_pixels, root.at("settings").at(setting).at("max_pixels").get<int64_t>());
      const Json& facts = root.at("images").at(name).at("settings").at(setting);
      EXPECT_EQ(image.height, facts.at("input_hw").at(0).get<int64_t>());
      EXPECT_EQ(image.width, facts.at("input_hw").at(1).get<int64_t>());
      const auto [rh, rw] = smart_resize(image.height, image.width, 28, config.min_pixels, config.max_pixels);
      EXPECT_EQ(rh, facts.at("resized_hw").at(0).get<int64_t>());
      EXPECT_EQ(rw, facts.at("resized_hw").at(1).get<int64_t>());
      EXPECT_EQ(rh == image.height && rw == image.width, facts.at("resample_skipped").get<bool>());
      if (facts.at("resample_skipped").get<bool>()) ++skipped;

      const Qwen2VLImage got = preprocess_qwen2_vl(image, config);
      const Json& grid = facts.at("image_grid_thw");
      EXPECT_EQ(got.grid_t, grid.at(0).get<int64_t>());
      EXPECT_EQ(got.grid_h, grid.at(1).get<int64_t>());
      EXPECT_EQ(got.grid_w, grid.at(2).get<int64_t>());
      EXPECT_EQ(got.tokens(), facts.at("n_merged_tokens").get<int64_t>());

      // pixel_values: [n_patches, 1176] float32; the same float32 operations in the same order and pure copies,
      // so bit-identical (the 1e-6 bound only makes a failure print the size of the difference).
      const at::Tensor want = reference->tensor(facts.at("key").get<std::string>());
      ASSERT_EQ(got.pixel_values.scalar_type(), at::kFloat);
      ASSERT_TRUE(got.pixel_values.device().is_cpu());
      ASSERT_EQ(got.pixel_values.sizes(), want.sizes());
      EXPECT_EQ(got.pixel_values.size(0), facts.at("n_patches").get<int64_t>());
      const double gap = (got.pixel_values - want).abs().max().item<double>();
      worst = std::max(worst, gap);
      EXPECT_LE(gap, 1e-6);
      EXPECT_TRUE(at::equal(got.pixel_values, want)) << "largest difference " << gap;
      EXPECT_NEAR(got.pixel_values.to(at::kDouble).sum().item<double>(),
                  facts.at("pixel_values_sum_float64").get<double>(), 1e-6);
    }
  }
  EXPECT_EQ(skipped, 1);  // astronaut_224.png at 50176
  std::cout << "[ Qwen2VL  ] pixel_values max |diff| over 10 image/setting pairs: " << worst << "\n";
  RecordProperty("pixel_values_max_abs_diff", std::to_string(worst));
}

TEST(Qwen2VLProcessor, PatchLayoutOfAHandBuiltImage) {
  // 8 x 12 pixels, patch 2, merge 2, 3 frames, no resize/rescale/normalize: every value is its uint8 and tells
  // where it came from, so the layout rule of the README can be checked element by element.
  Qwen2VLProcessorConfig config;
  config.do_resize = false;
  config.do_rescale = false;
  config.do_normalize = false;
  config.patch_size = 2;
  config.merge_size = 2;
  config.temporal_patch_size = 3;
  Image image;
  image.height = 8;
  image.width = 12;
  for (int64_t i = 0; i < 8 * 12 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i % 251));
  const Qwen2VLImage out = preprocess_qwen2_vl(image, config);
  const int64_t P = 2, T = 3, gh = 4, gw = 6;
  EXPECT_EQ(out.grid_t, 1);
  EXPECT_EQ(out.grid_h, gh);
  EXPECT_EQ(out.grid_w, gw);
  EXPECT_EQ(out.tokens(), 6);
  ASSERT_EQ(out.pixel_values.sizes(), (std::vector<int64_t>{gh * gw, 3 * T * P * P}));
  const auto values = out.pixel_values.accessor<float, 2>();
  for (int64_t r = 0; r < gh; ++r) {
    for (int64_t c = 0; c < gw; ++c) {
      const int64_t row = ((r / 2) * (gw / 2) + c / 2) * 4 + (r % 2) * 2 + c % 2;
      for (int64_t ch = 0; ch < 3; ++ch) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t y = 0; y < P; ++y) {
            for (int64_t x = 0; x < P; ++x) {
              const int64_t col = ((ch * T + t) * P + y) * P + x;
              const uint8_t want = image.pixels[static_cast<size_t>(((r * P + y) * image.width + c * P + x) * 3 + ch)];
              ASSERT_EQ(values[row][col], static_cast<float>(want)) << "patch (" << r << ", " << c << ")";
            }
          }
        }
      }
    }
  }
}

TEST(Qwen2VLProcessor, RescaleAndNormalizeInFloat32) {
  // A uniform 56 x 56 image is not resized (56 x 56 is within the class defaults): every value is
  // (float32(float64(v) / 255) - float32(mean)) / float32(std) computed in float32.
  Image image;
  image.height = image.width = 56;
  for (int64_t i = 0; i < 56 * 56; ++i) image.pixels.insert(image.pixels.end(), {200, 17, 255});
  const Qwen2VLProcessorConfig config;
  const Qwen2VLImage out = preprocess_qwen2_vl(image, config);
  EXPECT_EQ(out.grid_h, 4);
  EXPECT_EQ(out.grid_w, 4);
  EXPECT_EQ(out.tokens(), 4);
  const uint8_t rgb[3] = {200, 17, 255};
  for (int ch = 0; ch < 3; ++ch) {
    const float x = static_cast<float>(static_cast<double>(rgb[ch]) * (1.0 / 255.0));
    const float want = (x - static_cast<float>(config.image_mean[ch])) / static_cast<float>(config.image_std[ch]);
    const at::Tensor block = out.pixel_values.narrow(1, ch * 392, 392);
    EXPECT_TRUE(at::equal(block, at::full_like(block, want))) << "channel " << ch;
  }
}

TEST(Qwen2VLProcessor, RefusesWhatItCannotProcess) {
  // smart_resize gives 0 x 1568: refused before anything is allocated for it.
  Image wide;
  wide.height = 28;
  wide.width = 5600;
  wide.pixels.assign(static_cast<size_t>(28 * 5600 * 3), 128);
  const Qwen2VLProcessorConfig config = parse(R"({"min_pixels": 3136, "max_pixels": 12544})");
  expect_error<FormatError>([&] { preprocess_qwen2_vl(wide, config); }, {"28x5600", "0x1568"});
  // Below the factor, and malformed images.
  Image small;
  small.height = small.width = 20;
  small.pixels.assign(20 * 20 * 3, 0);
  expect_error<FormatError>([&] { preprocess_qwen2_vl(small, config); }, {"20x20", "factor 28"});
  Image broken = small;
  broken.pixels.pop_back();
  expect_error<FormatError>([&] { preprocess_qwen2_vl(broken, config); }, {"20x20", "height * width * 3"});
  expect_error<FormatError>([&] { preprocess_qwen2_vl(Image{}, config); }, {"0x0"});
  // Without do_resize the sides must be multiples of 28.
  Qwen2VLProcessorConfig fixed = config;
  fixed.do_resize = false;
  Image odd;
  odd.height = 56;
  odd.width = 60;
  odd.pixels.assign(56 * 60 * 3, 0);
  expect_error<FormatError>([&] { preprocess_qwen2_vl(odd, fixed); }, {"56x60", "28"});
  odd.width = 84;
  odd.pixels.assign(56 * 84 * 3, 0);
  EXPECT_EQ(preprocess_qwen2_vl(odd, fixed).grid_w, 6);
  // A config built in code is checked as the parser checks it.
  Qwen2VLProcessorConfig bad = config;
  bad.min_pixels = bad.max_pixels + 1;
  expect_error<ConfigError>([&] { preprocess_qwen2_vl(odd, bad); }, {"min_pixels", "max_pixels"});
  bad = config;
  bad.merge_size = 0;
  expect_error<ConfigError>([&] { preprocess_qwen2_vl(odd, bad); }, {"merge_size"});
}

// ---------------------------------------------------------------------------------------------------------------
// Configuration

TEST(Qwen2VLProcessor, ClassDefaults) {
  const Qwen2VLProcessorConfig c = parse("{}");
  EXPECT_EQ(c.min_pixels, 3136);
  EXPECT_EQ(c.max_pixels, 1003520);  // 28 * 28 * 1280 (Qwen2-VL-7B-Instruct's own file says 12845056)
  EXPECT_EQ(c.patch_size, 14);
  EXPECT_EQ(c.temporal_patch_size, 2);
  EXPECT_EQ(c.merge_size, 2);
  EXPECT_TRUE(c.do_resize);
  EXPECT_TRUE(c.do_rescale);
  EXPECT_TRUE(c.do_normalize);
  EXPECT_EQ(c.rescale_factor, 1.0 / 255.0);
  EXPECT_EQ(c.resample, Resample::kBicubic);
  EXPECT_EQ(c.image_mean[0], 0.48145466);
  EXPECT_EQ(c.image_std[2], 0.27577711);
}

TEST(Qwen2VLProcessor, ReadsBothSizeSpellings) {
  const fs::path v446 = reference_dir() / "tiny-qwen2-vl" / "preprocessor_config.json";
  const fs::path v449 = test::assets() / "reference" / "qwen2_5_vl" / "tiny-qwen2.5-vl" / "preprocessor_config.json";
  SWIFTCPP_REQUIRE_SHARED(v446);
  SWIFTCPP_REQUIRE_SHARED(v449);
  for (const fs::path& file : {v446, v449}) {
    SCOPED_TRACE(file.string());
    const Qwen2VLProcessorConfig c = parse_qwen2_vl_processor_config(JsonObject::load(file));
    EXPECT_EQ(c.min_pixels, 3136);
    EXPECT_EQ(c.max_pixels, 12544);
    EXPECT_EQ(c.patch_size, 14);
    EXPECT_EQ(c.merge_size, 2);
    EXPECT_EQ(c.temporal_patch_size, 2);
    EXPECT_EQ(c.rescale_factor, 0.00392156862745098);
    EXPECT_EQ(c.image_mean[1], 0.4578275);
  }
  // `size` alone, in either spelling; top-level keys win over it.
  const Qwen2VLProcessorConfig old = parse(R"({"size": {"min_pixels": 1000, "max_pixels": 2000}})");
  EXPECT_EQ(old.min_pixels, 1000);
  EXPECT_EQ(old.max_pixels, 2000);
  const Qwen2VLProcessorConfig edges = parse(R"({"size": {"shortest_edge": 1001, "longest_edge": 2001}})");
  EXPECT_EQ(edges.min_pixels, 1001);
  EXPECT_EQ(edges.max_pixels, 2001);
  const Qwen2VLProcessorConfig both =
      parse(R"({"size": {"shortest_edge": 1001, "longest_edge": 2001}, "max_pixels": 50176})");
  EXPECT_EQ(both.min_pixels, 1001);
  EXPECT_EQ(both.max_pixels, 50176);
}

TEST(Qwen2VLProcessor, ConfigErrorsNameTheFileAndKey) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"min_pixels": 50176, "max_pixels": 12544})", {"pp.json", "min_pixels", "max_pixels", "50176"}},
      {R"({"size": {"shortest_edge": 9000, "longest_edge": 8000}})", {"pp.json", "size", "9000", "8000"}},
      {R"({"max_pixels": "12544"})", {"pp.json", "'max_pixels'", "string"}},
      {R"({"min_pixels": 3136.5})", {"pp.json", "'min_pixels'", "integer"}},
      {R"({"min_pixels": 0})", {"pp.json", "'min_pixels'", "1..4294967296"}},
      {R"({"max_pixels": 4294967297})", {"pp.json", "'max_pixels'", "1..4294967296"}},
      {R"({"size": {"shortest_edge": "3136", "longest_edge": 12544}})", {"pp.json", "'size.shortest_edge'"}},
      {R"({"size": {"min_pixels": 3136}})", {"pp.json", "'size'", "longest_edge"}},
      {R"({"size": {"height": 224, "width": 224}})", {"pp.json", "'size'"}},
      {R"({"patch_size": 0})", {"pp.json", "'patch_size'"}},
      {R"({"merge_size": -2})", {"pp.json", "'merge_size'"}},
      {R"({"temporal_patch_size": 100000})", {"pp.json", "'temporal_patch_size'"}},
      {R"({"patch_size": "14"})", {"pp.json", "'patch_size'", "string"}},
      {R"({"resample": 1})", {"pp.json", "'resample'", "lanczos"}},
      {R"({"do_resize": "yes"})", {"pp.json", "'do_resize'"}},
      {R"({"rescale_factor": "0.5"})", {"pp.json", "'rescale_factor'"}},
      {R"({"image_std": [0.5, 0, 0.5]})", {"pp.json", "'image_std'", "[0.0001, 10000]"}},
      {R"({"rescale_factor": 0})", {"pp.json", "'rescale_factor'", "(0, 1]"}},
      {R"({"image_mean": [0.5, 0.5]})", {"pp.json", "'image_mean'"}},
      {R"({"image_processor_type": "CLIPImageProcessor"})", {"pp.json", "CLIPImageProcessor", "Qwen2VL"}},
  };
  for (const auto& [text, needles] : cases) {
    SCOPED_TRACE(text);
    expect_error<ConfigError>([&] { parse(text); }, needles);
  }
}

}  // namespace
}  // namespace swiftcpp::vision
