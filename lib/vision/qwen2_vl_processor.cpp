#include "vision/qwen2_vl_processor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace swiftcpp::vision {

namespace {

// The largest integer up to which every integer is a float64: smart_resize's arithmetic is exact in its inputs
// only below it.
constexpr int64_t kMaxExactDouble = int64_t{1} << 53;

// ----------------------------------------------------------------------------------------------------------------
// Configuration

// An integer in lo..hi; `key` names it in messages ("size.longest_edge").
int64_t int_value(const JsonObject& json, const std::string& key, const Json& value, int64_t lo, int64_t hi) {
  if (!value.is_number_integer()) {
    fail<ConfigError>("{}: key '{}' must be an integer in {}..{}, got {}", json.origin(), key, lo, hi,
                      describe_json(value));
  }
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                  value.get<uint64_t>() >= static_cast<uint64_t>(std::max<int64_t>(lo, 0))
                            : value.get<int64_t>() >= lo && value.get<int64_t>() <= hi;
  if (!in_range) {
    fail<ConfigError>("{}: key '{}' must be in {}..{}, got {}", json.origin(), key, lo, hi, describe_json(value));
  }
  return value.get<int64_t>();
}

// An optional top-level integer key in lo..hi, or `fallback`.
int64_t int_or(const JsonObject& json, const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!json.has(key)) return fallback;
  return int_value(json, key, json.raw().at(key), lo, hi);
}

// Whether `object` has exactly the keys `keys`.
bool has_exactly(const Json& object, std::initializer_list<const char*> keys) {
  if (object.size() != keys.size()) return false;
  for (const char* key : keys) {
    if (!object.contains(key)) return false;
  }
  return true;
}

// `size`: {"min_pixels", "max_pixels"} (transformers 4.46) or {"shortest_edge", "longest_edge"} (4.49, pixel
// counts under edge names). Sets the pixel bounds; top-level keys override them afterwards.
void parse_size(const JsonObject& json, Qwen2VLProcessorConfig& config) {
  if (!json.has("size")) return;
  const Json& value = json.raw().at("size");
  if (value.is_object() && has_exactly(value, {"min_pixels", "max_pixels"})) {
    config.min_pixels = int_value(json, "size.min_pixels", value.at("min_pixels"), 1, kMaxQwen2VLPixels);
    config.max_pixels = int_value(json, "size.max_pixels", value.at("max_pixels"), 1, kMaxQwen2VLPixels);
    return;
  }
  if (value.is_object() && has_exactly(value, {"shortest_edge", "longest_edge"})) {
    config.min_pixels = int_value(json, "size.shortest_edge", value.at("shortest_edge"), 1, kMaxQwen2VLPixels);
    config.max_pixels = int_value(json, "size.longest_edge", value.at("longest_edge"), 1, kMaxQwen2VLPixels);
    return;
  }
  fail<ConfigError>(
      "{}: key 'size' must be {{\"min_pixels\": m, \"max_pixels\": M}} or {{\"shortest_edge\": m, "
      "\"longest_edge\": M}} (pixel counts), got {}",
      json.origin(), describe_json(value));
}

// The checks parse_qwen2_vl_processor_config makes, for a config built in code; `what` names the caller.
void check_config(const Qwen2VLProcessorConfig& config, const char* what) {
  auto check = [&](const char* name, int64_t value, int64_t hi) {
    if (value < 1 || value > hi) fail<ConfigError>("{}: {} must be in 1..{}, got {}", what, name, hi, value);
  };
  check("patch_size", config.patch_size, kMaxQwen2VLPatchParameter);
  check("merge_size", config.merge_size, kMaxQwen2VLPatchParameter);
  check("temporal_patch_size", config.temporal_patch_size, kMaxQwen2VLPatchParameter);
  check("min_pixels", config.min_pixels, kMaxQwen2VLPixels);
  check("max_pixels", config.max_pixels, kMaxQwen2VLPixels);
  if (config.min_pixels > config.max_pixels) {
    fail<ConfigError>("{}: min_pixels {} must not exceed max_pixels {}", what, config.min_pixels, config.max_pixels);
  }
  if (config.resample != Resample::kBicubic && config.resample != Resample::kBilinear) {
    fail<ConfigError>("{}: resample filter {} is not supported (supported: 2 bilinear, 3 bicubic)", what,
                      static_cast<int>(config.resample));
  }
}

// ----------------------------------------------------------------------------------------------------------------
// smart_resize

// Python's round() on a float: to the nearest integer, ties to even. Written out rather than std::nearbyint so
// that it does not depend on the calling thread's rounding mode. x - floor(x) is exact for every double.
double round_half_even(double x) {
  const double r = std::floor(x);
  const double d = x - r;
  if (d > 0.5) return r + 1.0;
  if (d < 0.5) return r;
  return std::fmod(r, 2.0) == 0.0 ? r : r + 1.0;
}

}  // namespace

Qwen2VLProcessorConfig parse_qwen2_vl_processor_config(const JsonObject& json) {
  if (auto type = json.find<std::string>("image_processor_type"); type && *type != "Qwen2VLImageProcessor") {
    fail<ConfigError>("{}: image_processor_type '{}' is not supported (supported: Qwen2VLImageProcessor)",
                      json.origin(), *type);
  }
  Qwen2VLProcessorConfig config;
  config.do_resize = json.get_or<bool>("do_resize", config.do_resize);
  parse_size(json, config);
  config.min_pixels = int_or(json, "min_pixels", config.min_pixels, 1, kMaxQwen2VLPixels);
  config.max_pixels = int_or(json, "max_pixels", config.max_pixels, 1, kMaxQwen2VLPixels);
  if (config.min_pixels > config.max_pixels) {
    const char* source = json.has("min_pixels") || json.has("max_pixels") ? "min_pixels' / 'max_pixels" : "size";
    fail<ConfigError>("{}: key '{}': min_pixels {} must not exceed max_pixels {}", json.origin(), source,
                      config.min_pixels, config.max_pixels);
  }
  config.patch_size = int_or(json, "patch_size", config.patch_size, 1, kMaxQwen2VLPatchParameter);
  config.temporal_patch_size =
      int_or(json, "temporal_patch_size", config.temporal_patch_size, 1, kMaxQwen2VLPatchParameter);
  config.merge_size = int_or(json, "merge_size", config.merge_size, 1, kMaxQwen2VLPatchParameter);
  config.resample = parse_resample(json, config.resample);
  parse_pixel_settings(json, config.do_rescale, config.rescale_factor, config.do_normalize, config.image_mean,
                       config.image_std, config.do_convert_rgb);
  return config;
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels) {
  if (factor <= 0 || factor > kMaxExactDouble) {
    fail<ConfigError>("smart_resize: factor must be in 1..2^53, got {}", factor);
  }
  if (min_pixels <= 0 || min_pixels > kMaxExactDouble || max_pixels <= 0 || max_pixels > kMaxExactDouble) {
    fail<ConfigError>("smart_resize: min_pixels {} and max_pixels {} must be in 1..2^53", min_pixels, max_pixels);
  }
  if (height < factor || width < factor) {
    fail<FormatError>(
        "smart_resize: image of {}x{} pixels (height x width): height and width must be at least the factor {} "
        "(patch_size * merge_size)",
        height, width, factor);
  }
  if (height > kMaxExactDouble / width) {
    fail<FormatError>("smart_resize: image of {}x{} pixels is too large (more than 2^53 pixels)", height, width);
  }
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  const double aspect = std::max(h, w) / std::min(h, w);
  if (aspect > 200.0) {
    fail<FormatError>("smart_resize: image of {}x{} pixels: absolute aspect ratio must be at most 200, got {}", height,
                      width, aspect);
  }
  // Every value below is an integer of at most about 2^53, so the int64 products do not overflow.
  int64_t h_bar = static_cast<int64_t>(round_half_even(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(round_half_even(w / f)) * factor;
  const double area = static_cast<double>(height * width);  // exact: at most 2^53
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(area / static_cast<double>(max_pixels));
    h_bar = static_cast<int64_t>(std::floor(h / beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::floor(w / beta / f)) * factor;
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / area);
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

Qwen2VLImage preprocess_qwen2_vl(const Image& image, const Qwen2VLProcessorConfig& config) {
  check_config(config, "preprocess_qwen2_vl");
  if (image.height < 0 || image.width < 0 ||
      (image.width > 0 && image.height > static_cast<int64_t>(image.pixels.size()) / image.width) ||
      static_cast<int64_t>(image.pixels.size()) != image.height * image.width * 3) {
    fail<FormatError>("preprocess_qwen2_vl: image of {}x{} pixels holds {} bytes, not height * width * 3",
                      image.height, image.width, image.pixels.size());
  }
  const int64_t patch = config.patch_size, merge = config.merge_size, frames = config.temporal_patch_size;
  const int64_t factor = patch * merge;

  // 1. resize: [H, W, 3] uint8 -> [rh, rw, 3] uint8
  int64_t rh = image.height, rw = image.width;
  if (config.do_resize) {
    std::tie(rh, rw) = smart_resize(image.height, image.width, factor, config.min_pixels, config.max_pixels);
    if (rh == 0 || rw == 0) {
      fail<FormatError>(
          "preprocess_qwen2_vl: image of {}x{} pixels (height x width) would be resized to {}x{} (aspect ratio too "
          "extreme for max_pixels {})",
          image.height, image.width, rh, rw, config.max_pixels);
    }
  } else if (rh == 0 || rw == 0 || rh % factor != 0 || rw % factor != 0) {
    fail<FormatError>(
        "preprocess_qwen2_vl: without do_resize the image of {}x{} pixels must have sides that are positive "
        "multiples of patch_size * merge_size = {}",
        rh, rw, factor);
  }
  const Image* current = &image;
  Image resized;
  if (rh != image.height || rw != image.width) {
    resized = resize_image(image, rh, rw, config.resample);
    current = &resized;
  }

  // 2-3. rescale and normalize, exactly as the CLIP processor: [rh, rw, 3] uint8 -> [3, rh, rw] float32
  ImageProcessorConfig values;
  values.do_rescale = config.do_rescale;
  values.rescale_factor = config.rescale_factor;
  values.do_normalize = config.do_normalize;
  values.image_mean = config.image_mean;
  values.image_std = config.image_std;
  const at::Tensor chw = to_pixel_values(*current, values);

  // 4. patchify: [3, rh, rw] -> frames [T, C, gh/m, m, P, gw/m, m, P]
  //    -> [gh/m, gw/m, m, m, C, T, P, P] -> [gh * gw, C * T * P * P]
  const int64_t channels = 3, gh = rh / patch, gw = rw / patch;
  const at::Tensor blocks = chw.unsqueeze(0)
                                .expand({frames, channels, rh, rw})
                                .reshape({frames, channels, gh / merge, merge, patch, gw / merge, merge, patch})
                                .permute({2, 5, 3, 6, 1, 0, 4, 7});
  Qwen2VLImage out;
  out.pixel_values = blocks.contiguous().reshape({gh * gw, channels * frames * patch * patch});
  out.grid_t = 1;
  out.grid_h = gh;
  out.grid_w = gw;
  out.merge_size = merge;
  return out;
}

}  // namespace swiftcpp::vision
