#include "vision/processor.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace swiftcpp::vision {

namespace {

// ----------------------------------------------------------------------------------------------------------------
// Configuration

// An integer size value in 1..kMaxProcessorSide; `key` names it in messages ("crop_size.height").
int64_t size_value(const JsonObject& json, const std::string& key, const Json& value) {
  if (!value.is_number_integer()) {
    fail<ConfigError>("{}: key '{}' must be an integer in 1..{}, got {}", json.origin(), key, kMaxProcessorSide,
                      describe_json(value));
  }
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(kMaxProcessorSide)
                            : value.get<int64_t>() >= 1 && value.get<int64_t>() <= kMaxProcessorSide;
  if (!in_range || (value.is_number_unsigned() && value.get<uint64_t>() == 0)) {
    fail<ConfigError>("{}: key '{}' must be in 1..{}, got {}", json.origin(), key, kMaxProcessorSide,
                      describe_json(value));
  }
  return value.get<int64_t>();
}

// Whether `object` has exactly the keys `keys`.
bool has_exactly(const Json& object, std::initializer_list<const char*> keys) {
  if (object.size() != keys.size()) return false;
  for (const char* key : keys) {
    if (!object.contains(key)) return false;
  }
  return true;
}

// A size given as {"height": h, "width": w} or [h, w]; false when `value` is neither.
bool height_width(const JsonObject& json, const std::string& key, const Json& value, int64_t& height, int64_t& width) {
  if (value.is_object() && has_exactly(value, {"height", "width"})) {
    height = size_value(json, key + ".height", value.at("height"));
    width = size_value(json, key + ".width", value.at("width"));
    return true;
  }
  if (value.is_array() && value.size() == 2) {
    height = size_value(json, key + "[0]", value.at(0));
    width = size_value(json, key + "[1]", value.at(1));
    return true;
  }
  return false;
}

// `size`: an integer or {"shortest_edge": s} (shortest-edge resize), or {"height": h, "width": w} / [h, w].
void parse_size(const JsonObject& json, ImageProcessorConfig& config) {
  if (!json.has("size")) return;
  const Json& value = json.raw().at("size");
  if (value.is_number_integer()) {
    config.shortest_edge = size_value(json, "size", value);
    return;
  }
  if (value.is_object() && has_exactly(value, {"shortest_edge"})) {
    config.shortest_edge = size_value(json, "size.shortest_edge", value.at("shortest_edge"));
    return;
  }
  if (height_width(json, "size", value, config.resize_height, config.resize_width)) {
    config.shortest_edge = 0;
    return;
  }
  fail<ConfigError>(
      "{}: key 'size' must be an integer, {{\"shortest_edge\": s}} or {{\"height\": h, \"width\": w}}, "
      "got {}",
      json.origin(), describe_json(value));
}

// `crop_size`: an integer (a square), {"height": h, "width": w} or [h, w].
void parse_crop_size(const JsonObject& json, ImageProcessorConfig& config) {
  if (!json.has("crop_size")) return;
  const Json& value = json.raw().at("crop_size");
  if (value.is_number_integer()) {
    config.crop_height = config.crop_width = size_value(json, "crop_size", value);
    return;
  }
  if (height_width(json, "crop_size", value, config.crop_height, config.crop_width)) return;
  fail<ConfigError>("{}: key 'crop_size' must be an integer or {{\"height\": h, \"width\": w}}, got {}", json.origin(),
                    describe_json(value));
}

// ----------------------------------------------------------------------------------------------------------------
// Pillow's resampling (Image.resize without reducing_gap), written from its published algorithm.

constexpr int kPrecisionBits = 32 - 8 - 2;

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Filter {
  double (*weight)(double);
  double support;
};

Filter filter_of(Resample resample) {
  switch (resample) {
    case Resample::kBilinear: return {bilinear_filter, 1.0};
    case Resample::kBicubic: return {bicubic_filter, 2.0};
  }
  fail<ConfigError>("resample filter {} is not supported (supported: 2 bilinear, 3 bicubic)",
                    static_cast<int>(resample));
}

// The taps of one pass, from `in_size` samples to `out_size`: output i reads `count[i]` inputs from `first[i]` on,
// with weights `weights[i * ksize + j]` in fixed point (kPrecisionBits fractional bits).
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

Taps compute_taps(int64_t in_size, int64_t out_size, const Filter& filter) {
  // Pillow passes the source box as C floats (0 and the size) and subtracts them in float.
  const double scale = static_cast<double>(static_cast<float>(in_size)) / static_cast<double>(out_size);
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = filter.support * filterscale;
  Taps taps;
  taps.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(static_cast<size_t>(out_size));
  taps.count.resize(static_cast<size_t>(out_size));
  taps.weights.assign(static_cast<size_t>(out_size * taps.ksize), 0);
  std::vector<double> k(static_cast<size_t>(taps.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // Rounded by truncation toward zero, as a C cast does.
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = filter.weight((static_cast<double>(x + xmin) - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    int32_t* out = taps.weights.data() + xx * taps.ksize;
    for (int64_t x = 0; x < xmax; ++x) {
      double w = k[static_cast<size_t>(x)];
      if (ww != 0.0) w /= ww;
      const double scaled = w * static_cast<double>(1 << kPrecisionBits);
      out[x] = static_cast<int32_t>(w < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    taps.first[static_cast<size_t>(xx)] = xmin;
    taps.count[static_cast<size_t>(xx)] = xmax;
  }
  return taps;
}

// A fixed-point sum (rounding offset included) to uint8: the integer part, clipped to 0..255.
inline uint8_t clip8(int64_t sum) {
  if (sum < 0) return 0;
  const int64_t v = sum >> kPrecisionBits;
  return static_cast<uint8_t>(v > 255 ? 255 : v);
}

constexpr int64_t kRoundingOffset = int64_t{1} << (kPrecisionBits - 1);

// Horizontal pass over source rows [row_begin, row_end): in [rows, in_w, 3] -> out [row_end - row_begin, out_w, 3].
std::vector<uint8_t> horizontal_pass(const uint8_t* in, int64_t in_w, int64_t row_begin, int64_t row_end, int64_t out_w,
                                     const Taps& taps) {
  const int64_t rows = row_end - row_begin;
  std::vector<uint8_t> out(static_cast<size_t>(rows * out_w * 3));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* src = in + (row_begin + y) * in_w * 3;
    uint8_t* dst = out.data() + y * out_w * 3;
    for (int64_t xx = 0; xx < out_w; ++xx) {
      const int32_t* k = taps.weights.data() + xx * taps.ksize;
      const uint8_t* p = src + taps.first[static_cast<size_t>(xx)] * 3;
      const int64_t n = taps.count[static_cast<size_t>(xx)];
      int64_t s0 = kRoundingOffset, s1 = kRoundingOffset, s2 = kRoundingOffset;
      for (int64_t x = 0; x < n; ++x) {
        s0 += int64_t{p[3 * x]} * k[x];
        s1 += int64_t{p[3 * x + 1]} * k[x];
        s2 += int64_t{p[3 * x + 2]} * k[x];
      }
      dst[3 * xx] = clip8(s0);
      dst[3 * xx + 1] = clip8(s1);
      dst[3 * xx + 2] = clip8(s2);
    }
  }
  return out;
}

// Vertical pass: in [in_rows, w, 3] -> out [out_h, w, 3]; tap rows are shifted up by `row_offset` (the first
// source row the horizontal pass kept). Integer sums are exact, so summing row by row gives Pillow's values.
std::vector<uint8_t> vertical_pass(const uint8_t* in, int64_t w, int64_t row_offset, int64_t out_h, const Taps& taps) {
  const int64_t row_bytes = w * 3;
  std::vector<uint8_t> out(static_cast<size_t>(out_h * row_bytes));
  std::vector<int64_t> sums(static_cast<size_t>(row_bytes));
  for (int64_t yy = 0; yy < out_h; ++yy) {
    std::fill(sums.begin(), sums.end(), kRoundingOffset);
    const int32_t* k = taps.weights.data() + yy * taps.ksize;
    const int64_t first = taps.first[static_cast<size_t>(yy)] - row_offset;
    const int64_t n = taps.count[static_cast<size_t>(yy)];
    for (int64_t y = 0; y < n; ++y) {
      const uint8_t* src = in + (first + y) * row_bytes;
      const int64_t weight = k[y];
      for (int64_t i = 0; i < row_bytes; ++i) sums[static_cast<size_t>(i)] += int64_t{src[i]} * weight;
    }
    uint8_t* dst = out.data() + yy * row_bytes;
    for (int64_t i = 0; i < row_bytes; ++i) dst[i] = clip8(sums[static_cast<size_t>(i)]);
  }
  return out;
}

void check_image(const Image& image, const char* what) {
  if (image.height < 0 || image.width < 0 ||
      (image.width > 0 && image.height > static_cast<int64_t>(image.pixels.size()) / image.width / 3) ||
      image.pixels.size() != static_cast<size_t>(image.height * image.width * 3)) {
    fail<FormatError>("{}: image of {}x{} holds {} bytes, expected height * width * 3", what, image.height, image.width,
                      image.pixels.size());
  }
}

void check_target(int64_t height, int64_t width, const char* what) {
  if (height <= 0 || width <= 0) fail<ConfigError>("{}: target size {}x{} must be positive", what, height, width);
}

// floor(a / 2), as Python's a // 2.
int64_t floor_half(int64_t a) { return a >= 0 ? a / 2 : -((-a + 1) / 2); }

// Refuses a step whose output of `height` x `width` would exceed `max_pixels`.
void check_pixels(int64_t height, int64_t width, int64_t max_pixels, const Image& image, const char* step) {
  if (height > max_pixels / width) {
    fail<FormatError>("image of {}x{} pixels: {} to {}x{} would exceed the limit of {} pixels", image.height,
                      image.width, step, height, width, max_pixels);
  }
}

}  // namespace

ImageProcessorConfig parse_image_processor_config(const JsonObject& json) {
  if (auto type = json.find<std::string>("image_processor_type"); type && *type != "CLIPImageProcessor") {
    fail<ConfigError>("{}: image_processor_type '{}' is not supported (supported: CLIPImageProcessor)", json.origin(),
                      *type);
  }
  if (auto type = json.find<std::string>("feature_extractor_type"); type && *type != "CLIPFeatureExtractor") {
    fail<ConfigError>("{}: feature_extractor_type '{}' is not supported (supported: CLIPFeatureExtractor)",
                      json.origin(), *type);
  }
  ImageProcessorConfig config;
  config.do_resize = json.get_or<bool>("do_resize", config.do_resize);
  parse_size(json, config);
  config.resample = parse_resample(json, config.resample);
  config.do_center_crop = json.get_or<bool>("do_center_crop", config.do_center_crop);
  parse_crop_size(json, config);
  parse_pixel_settings(json, config.do_rescale, config.rescale_factor, config.do_normalize, config.image_mean,
                       config.image_std, config.do_convert_rgb);
  return config;
}

Resample parse_resample(const JsonObject& json, Resample fallback) {
  const int64_t resample = json.get_or<int64_t>("resample", static_cast<int64_t>(fallback));
  if (resample == 2) return Resample::kBilinear;
  if (resample == 3) return Resample::kBicubic;
  static const char* const kNames[] = {"nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"};
  const std::string name = resample >= 0 && resample <= 5 ? fmt::format(" ({})", kNames[resample]) : "";
  fail<ConfigError>("{}: key 'resample' = {}{} is not supported (supported: 2 bilinear, 3 bicubic)", json.origin(),
                    resample, name);
}

namespace {
// `image_mean` / `image_std`: a list of 3 numbers, or one number for all channels, each in [low, high]: a mean
// within +-1e4, a std in [1e-4, 1e4] (a pixel (x - mean) / std stays far inside float32 and of one sign per channel).
void parse_channels(const JsonObject& json, const std::string& key, std::array<double, 3>& out, double low,
                    double high) {
  if (!json.has(key)) return;
  const Json& value = json.raw().at(key);
  auto number = [&](const Json& v) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < low || v.get<double>() > high) {
      fail<ConfigError>("{}: key '{}' must be a number or a list of 3 numbers in [{:g}, {:g}], got {}", json.origin(),
                        key, low, high, describe_json(value));
    }
    return v.get<double>();
  };
  if (value.is_number()) {
    out.fill(number(value));
  } else if (value.is_array() && value.size() == 3) {
    for (size_t c = 0; c < 3; ++c) out[c] = number(value.at(c));
  } else {
    number(Json());  // not a number: fails with the message above
  }
}
}  // namespace

void parse_pixel_settings(const JsonObject& json, bool& do_rescale, double& rescale_factor, bool& do_normalize,
                          std::array<double, 3>& image_mean, std::array<double, 3>& image_std, bool& do_convert_rgb) {
  do_rescale = json.get_or<bool>("do_rescale", do_rescale);
  rescale_factor = json.get_or<double>("rescale_factor", rescale_factor);
  // The factor maps 8-bit values into a bounded range (1/255 maps them onto [0, 1]); 0, a negative factor or a huge
  // one would turn every image into zeros, flip it, or overflow float32.
  if (do_rescale && (!std::isfinite(rescale_factor) || rescale_factor <= 0 || rescale_factor > 1)) {
    fail<ConfigError>("{}: key 'rescale_factor' must be in (0, 1] (1/255 = 0.00392 maps 8-bit values onto [0, 1]), "
                      "got {}", json.origin(), rescale_factor);
  }
  do_normalize = json.get_or<bool>("do_normalize", do_normalize);
  parse_channels(json, "image_mean", image_mean, -1e4, 1e4);
  parse_channels(json, "image_std", image_std, 1e-4, 1e4);
  do_convert_rgb = json.get_or<bool>("do_convert_rgb", do_convert_rgb);
}

ImageProcessorConfig load_image_processor_config(const fs::path& model_dir) {
  return parse_image_processor_config(JsonObject::load(model_dir / "preprocessor_config.json"));
}

ImageSize resize_output_size(int64_t height, int64_t width, const ImageProcessorConfig& config) {
  if (height <= 0 || width <= 0)
    fail<ConfigError>("resize_output_size: image size {}x{} must be positive", height, width);
  if (!config.do_resize) return {height, width};
  if (config.shortest_edge <= 0) {
    check_target(config.resize_height, config.resize_width, "resize_output_size");
    return {config.resize_height, config.resize_width};
  }
  // transformers: new_long = int(s * long / short), a float64 division truncated.
  const int64_t s = config.shortest_edge;
  if (std::max(height, width) > INT64_MAX / s) {
    fail<ConfigError>("resize_output_size: image size {}x{} is too large", height, width);
  }
  const bool portrait = width <= height;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const auto new_long = static_cast<int64_t>(static_cast<double>(s * longer) / static_cast<double>(shorter));
  return portrait ? ImageSize{new_long, s} : ImageSize{s, new_long};
}

Image resize_image(const Image& image, int64_t height, int64_t width, Resample resample) {
  check_image(image, "resize_image");
  check_target(height, width, "resize_image");
  if (image.height == 0 || image.width == 0) fail<FormatError>("resize_image: cannot resize an empty image");
  if (height == image.height && width == image.width) return image;
  const Filter filter = filter_of(resample);
  const bool horizontal = width != image.width, vertical = height != image.height;
  const Taps h_taps = horizontal ? compute_taps(image.width, width, filter) : Taps{};
  const Taps v_taps = vertical ? compute_taps(image.height, height, filter) : Taps{};

  Image out;
  out.height = height;
  out.width = width;
  if (!vertical) {
    out.pixels = horizontal_pass(image.pixels.data(), image.width, 0, image.height, width, h_taps);
    return out;
  }
  if (!horizontal) {
    out.pixels = vertical_pass(image.pixels.data(), width, 0, height, v_taps);
    return out;
  }
  // The horizontal pass covers only the source rows the vertical pass reads.
  const int64_t row_begin = v_taps.first.front();
  const int64_t row_end = v_taps.first.back() + v_taps.count.back();
  const std::vector<uint8_t> temp =
      horizontal_pass(image.pixels.data(), image.width, row_begin, row_end, width, h_taps);
  out.pixels = vertical_pass(temp.data(), width, row_begin, height, v_taps);
  return out;
}

Image resize_bicubic(const Image& image, int64_t height, int64_t width) {
  return resize_image(image, height, width, Resample::kBicubic);
}

Image center_crop(const Image& image, int64_t height, int64_t width) {
  check_image(image, "center_crop");
  check_target(height, width, "center_crop");
  const int64_t top = floor_half(image.height - height), left = floor_half(image.width - width);
  Image out;
  out.height = height;
  out.width = width;
  out.pixels.assign(static_cast<size_t>(height * width * 3), 0);
  // Columns of the window that fall inside the image: [c0, c1).
  const int64_t c0 = std::max<int64_t>(0, -left), c1 = std::min<int64_t>(width, image.width - left);
  if (c1 <= c0) return out;
  for (int64_t r = 0; r < height; ++r) {
    const int64_t source_row = r + top;
    if (source_row < 0 || source_row >= image.height) continue;
    const uint8_t* src = image.pixels.data() + (source_row * image.width + left + c0) * 3;
    std::copy(src, src + (c1 - c0) * 3, out.pixels.data() + (r * width + c0) * 3);
  }
  return out;
}

Image prepare_image(const Image& image, const ImageProcessorConfig& config, int64_t max_pixels) {
  if (max_pixels <= 0) fail<ConfigError>("prepare_image: max_pixels must be positive, got {}", max_pixels);
  check_image(image, "prepare_image");
  if (image.height == 0 || image.width == 0) fail<FormatError>("prepare_image: the image is empty");
  const Image* current = &image;
  Image resized;
  if (config.do_resize) {
    const ImageSize size = resize_output_size(image.height, image.width, config);
    if (size.height != image.height || size.width != image.width) {
      check_pixels(size.height, size.width, max_pixels, image, "resizing");
      check_pixels(image.height, size.width, max_pixels, image, "the horizontal resize pass");
      resized = resize_image(image, size.height, size.width, config.resample);
      current = &resized;
    }
  }
  if (!config.do_center_crop) return *current;
  check_pixels(config.crop_height, config.crop_width, max_pixels, image, "center cropping");
  return center_crop(*current, config.crop_height, config.crop_width);
}

at::Tensor to_pixel_values(const Image& image, const ImageProcessorConfig& config) {
  check_image(image, "to_pixel_values");
  // The value of every uint8 per channel, computed in the processor's precision: float64 rescale rounded to
  // float32, then float32 subtract and divide.
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(config.image_mean[c]);
    const float std = static_cast<float>(config.image_std[c]);
    for (int v = 0; v < 256; ++v) {
      float x = config.do_rescale ? static_cast<float>(static_cast<double>(v) * config.rescale_factor)
                                  : static_cast<float>(v);
      if (config.do_normalize) x = (x - mean) / std;
      table[c][v] = x;
    }
  }
  // image: [H, W, 3] uint8 -> out: [3, H, W] float32
  const int64_t plane = image.height * image.width;
  at::Tensor out = at::empty({3, image.height, image.width}, at::kFloat);
  float* dst = out.data_ptr<float>();
  const uint8_t* src = image.pixels.data();
  for (int c = 0; c < 3; ++c) {
    float* channel = dst + c * plane;
    for (int64_t i = 0; i < plane; ++i) channel[i] = table[c][src[3 * i + c]];
  }
  return out;
}

at::Tensor preprocess_image(const Image& image, const ImageProcessorConfig& config, int64_t max_pixels) {
  return to_pixel_values(prepare_image(image, config, max_pixels), config);
}

}  // namespace swiftcpp::vision
