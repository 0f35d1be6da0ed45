#include "vision/llava_next_processor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace swiftcpp::vision {

namespace {

// The largest integer up to which every integer is a float64: the float64 arithmetic of steps 1 and 2 and of
// unpad_image is Python's only for sizes below it.
constexpr int64_t kMaxExactDouble = int64_t{1} << 53;

void check_size(int64_t height, int64_t width, const char* what) {
  if (height <= 0 || width <= 0 || height > kMaxExactDouble / width) {
    fail<ConfigError>("{}: image size {}x{} must be positive with at most 2^53 pixels", what, height, width);
  }
}

// The checks parse_llava_next_processor_config makes, for a config built in code.
void check_config(const LlavaNextProcessorConfig& config, const char* what) {
  const ImageProcessorConfig& c = config.clip;
  if (c.shortest_edge <= 0 || c.shortest_edge > kMaxProcessorSide) {
    fail<ConfigError>("{}: size.shortest_edge must be in 1..{}, got {}", what, kMaxProcessorSide, c.shortest_edge);
  }
  if (!c.do_center_crop || c.crop_height != c.crop_width || c.crop_height < 1 || c.crop_height > kMaxProcessorSide) {
    fail<ConfigError>("{}: LLaVA-NeXT needs do_center_crop and a square crop_size in 1..{} (the tile side), got {} "
                      "{}x{}", what, kMaxProcessorSide, c.do_center_crop ? "crop" : "no crop", c.crop_height,
                      c.crop_width);
  }
  if (config.image_grid_pinpoints.empty() || config.image_grid_pinpoints.size() > kMaxPinpoints) {
    fail<ConfigError>("{}: image_grid_pinpoints must hold 1..{} pinpoints, got {}", what, kMaxPinpoints,
                      config.image_grid_pinpoints.size());
  }
  for (const Pinpoint& p : config.image_grid_pinpoints) {
    if (p.height < config.tile() || p.width < config.tile() || p.height > kMaxProcessorSide ||
        p.width > kMaxProcessorSide || p.height % config.tile() != 0 || p.width % config.tile() != 0) {
      fail<ConfigError>("{}: pinpoint [{}, {}] must be multiples of the tile side {} up to {}", what, p.height,
                        p.width, config.tile(), kMaxProcessorSide);
    }
  }
}

void check_image(const Image& image) {
  if (image.height <= 0 || image.width <= 0 || image.height > static_cast<int64_t>(image.pixels.size()) / image.width / 3 ||
      image.pixels.size() != static_cast<size_t>(image.height * image.width * 3)) {
    fail<FormatError>("preprocess_llava_next: image of {}x{} holds {} bytes, expected height * width * 3 (and a "
                      "non-empty image)", image.height, image.width, image.pixels.size());
  }
}

// Refuses a step whose output of `height` x `width` would exceed `max_pixels`.
void check_pixels(int64_t height, int64_t width, int64_t max_pixels, const Image& image, const char* step) {
  if (height > max_pixels / width) {
    fail<FormatError>("image of {}x{} pixels: {} to {}x{} would exceed the limit of {} pixels", image.height,
                      image.width, step, height, width, max_pixels);
  }
}

// The `rows` x `cols` window of `image` at (top, left), which lies inside it.
Image window(const Image& image, int64_t top, int64_t left, int64_t rows, int64_t cols) {
  Image out;
  out.height = rows;
  out.width = cols;
  out.pixels.resize(static_cast<size_t>(rows * cols * 3));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = image.pixels.data() + ((top + r) * image.width + left) * 3;
    std::copy(src, src + cols * 3, out.pixels.data() + r * cols * 3);
  }
  return out;
}

}  // namespace

std::vector<Pinpoint> default_grid_pinpoints() {
  return {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
}

std::vector<Pinpoint> parse_grid_pinpoints(const JsonObject& json, const std::string& key, int64_t tile) {
  const Json& value = json.raw().at(key);
  if (!value.is_array() || value.empty() || value.size() > kMaxPinpoints) {
    fail<ConfigError>("{}: key '{}' must be a list of 1..{} [height, width] pairs, got {}", json.origin(), key,
                      kMaxPinpoints, describe_json(value));
  }
  std::vector<Pinpoint> out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& pair = value[i];
    const std::string where = fmt::format("{}[{}]", key, i);
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() || !pair[1].is_number_integer()) {
      fail<ConfigError>("{}: key '{}' must be a [height, width] pair of integers, got {}", json.origin(), where,
                        describe_json(pair));
    }
    const auto side = [&](const Json& v) -> int64_t {
      const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(kMaxProcessorSide)
                                                   : v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxProcessorSide;
      const int64_t s = in_range ? v.get<int64_t>() : 0;
      if (s < tile || s % tile != 0) {
        fail<ConfigError>("{}: key '{}' = {} must hold multiples of the tile side {} in {}..{} (a pinpoint that is "
                          "not a whole number of tiles gives partial tiles the model cannot place)", json.origin(),
                          where, describe_json(pair), tile, tile, kMaxProcessorSide);
      }
      return s;
    };
    out.push_back({side(pair[0]), side(pair[1])});
  }
  return out;
}

LlavaNextProcessorConfig parse_llava_next_processor_config(const JsonObject& json) {
  if (auto type = json.find<std::string>("image_processor_type"); type && *type != "LlavaNextImageProcessor") {
    fail<ConfigError>("{}: image_processor_type '{}' is not supported here (expected LlavaNextImageProcessor)",
                      json.origin(), *type);
  }
  // The keys shared with CLIPImageProcessor go through its parser, which checks the type it reads.
  Json clip = json.raw();
  clip.erase("image_processor_type");
  LlavaNextProcessorConfig config;
  config.clip = parse_image_processor_config(JsonObject(std::move(clip), json.origin()));
  if (config.clip.shortest_edge <= 0) {
    fail<ConfigError>("{}: key 'size' must give shortest_edge: LlavaNextImageProcessor resizes the whole image to "
                      "shortest_edge x shortest_edge, got {}", json.origin(), describe_json(json.raw().at("size")));
  }
  if (!config.clip.do_center_crop) {
    fail<ConfigError>("{}: key 'do_center_crop' must be true for LLaVA-NeXT: without it a short tile keeps another "
                      "size than the others and the entries cannot be stacked", json.origin());
  }
  if (config.clip.crop_height != config.clip.crop_width) {
    fail<ConfigError>("{}: key 'crop_size' must be square for LLaVA-NeXT (its side is the tile side), got {}x{}",
                      json.origin(), config.clip.crop_height, config.clip.crop_width);
  }
  if (json.has("image_grid_pinpoints")) {
    config.image_grid_pinpoints = parse_grid_pinpoints(json, "image_grid_pinpoints", config.tile());
  }
  check_config(config, json.origin().c_str());
  return config;
}

int64_t llava_next_features_per_side(const JsonObject& model_config, const LlavaNextProcessorConfig& processor,
                                     const std::string& processor_origin) {
  const std::string origin = model_config.origin();
  const Json vision_raw = model_config.has("vision_config") ? model_config.raw().at("vision_config") : Json::object();
  if (!vision_raw.is_object()) {
    fail<ConfigError>("{}: 'vision_config' must be an object, got {}", origin, describe_json(vision_raw));
  }
  const JsonObject vision(vision_raw, origin + " (vision_config)");
  // CLIPVisionConfig's class defaults, as models/vision/clip.h fills them.
  const int64_t image_size = vision.get_or<int64_t>("image_size", 224);
  const int64_t patch_size = vision.get_or<int64_t>("patch_size", 32);
  if (image_size < 1 || image_size > kMaxProcessorSide || patch_size < 1 || image_size % patch_size != 0) {
    fail<ConfigError>("{}: 'vision_config.image_size' {} must be a multiple of 'vision_config.patch_size' {} in "
                      "1..{}", origin, image_size, patch_size, kMaxProcessorSide);
  }
  if (image_size != processor.tile()) {
    fail<ConfigError>("{}: crop_size {} (the tile side) must equal the vision tower's 'vision_config.image_size' {} "
                      "({})", processor_origin, processor.tile(), image_size, origin);
  }
  const std::vector<Pinpoint> model_pinpoints = model_config.has("image_grid_pinpoints")
                                                    ? parse_grid_pinpoints(model_config, "image_grid_pinpoints", image_size)
                                                    : default_grid_pinpoints();
  if (model_pinpoints != processor.image_grid_pinpoints) {
    const auto text = [](const std::vector<Pinpoint>& list) {
      std::string s;
      for (const Pinpoint& p : list) s += fmt::format("{}[{}, {}]", s.empty() ? "" : ", ", p.height, p.width);
      return "[" + s + "]";
    };
    fail<ConfigError>("{}: 'image_grid_pinpoints' {} differ from the model's {} ({}): the model would place the "
                      "tiles on another grid", processor_origin, text(processor.image_grid_pinpoints),
                      text(model_pinpoints), origin);
  }
  return image_size / patch_size;
}

Pinpoint select_best_resolution(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints) {
  check_size(height, width, "select_best_resolution");
  if (pinpoints.empty()) fail<ConfigError>("select_best_resolution: no pinpoints to choose from");
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  Pinpoint best;
  int64_t max_effective = 0;
  int64_t min_wasted = std::numeric_limits<int64_t>::max();
  bool found = false;
  for (const Pinpoint& p : pinpoints) {
    const double scale = std::min(static_cast<double>(p.width) / w, static_cast<double>(p.height) / h);
    const auto down_w = static_cast<int64_t>(w * scale), down_h = static_cast<int64_t>(h * scale);  // int(): truncation
    const int64_t effective = std::min(down_w * down_h, height * width);
    const int64_t wasted = p.height * p.width - effective;
    if (!found || effective > max_effective || (effective == max_effective && wasted < min_wasted)) {
      max_effective = effective;
      min_wasted = wasted;
      best = p;
      found = true;
    }
  }
  return best;
}

AnyresLayout anyres_layout(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints, int64_t tile) {
  if (tile < 1) fail<ConfigError>("anyres_layout: the tile side must be positive, got {}", tile);
  AnyresLayout l;
  l.best = select_best_resolution(height, width, pinpoints);
  // _get_patch_output_size, in Python's float64 order: h * (W / w), not h * W / w.
  const double scale_w = static_cast<double>(l.best.width) / static_cast<double>(width);
  const double scale_h = static_cast<double>(l.best.height) / static_cast<double>(height);
  if (scale_w < scale_h) {
    l.resized_width = l.best.width;
    l.resized_height = std::min(static_cast<int64_t>(std::ceil(static_cast<double>(height) * scale_w)), l.best.height);
  } else {
    l.resized_height = l.best.height;
    l.resized_width = std::min(static_cast<int64_t>(std::ceil(static_cast<double>(width) * scale_h)), l.best.width);
  }
  l.pad_top = (l.best.height - l.resized_height) / 2;
  l.pad_left = (l.best.width - l.resized_width) / 2;
  l.canvas_height = l.resized_height + 2 * l.pad_top;
  l.canvas_width = l.resized_width + 2 * l.pad_left;
  l.tile_rows = (l.canvas_height + tile - 1) / tile;
  l.tile_cols = (l.canvas_width + tile - 1) / tile;
  return l;
}

AnyresFeatureLayout anyres_feature_layout(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints,
                                          int64_t tile, int64_t side) {
  if (tile < 1 || side < 1) {
    fail<ConfigError>("anyres_feature_layout: tile {} and features per side {} must be positive", tile, side);
  }
  const Pinpoint best = select_best_resolution(height, width, pinpoints);
  AnyresFeatureLayout f;
  f.base = side * side;
  f.tile_rows = best.height / tile;  // get_anyres_image_grid_shape: floor division
  f.tile_cols = best.width / tile;
  f.grid_rows = f.tile_rows * side;
  f.grid_cols = f.tile_cols * side;
  f.rows = f.grid_rows;
  f.cols = f.grid_cols;
  // unpad_image in float64, Python's order of operations.
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  const double gr = static_cast<double>(f.grid_rows), gc = static_cast<double>(f.grid_cols);
  if (w / h > gc / gr) {
    const auto new_rows = static_cast<int64_t>(h * (gc / w));
    const int64_t padding = (f.grid_rows - new_rows) / 2;
    f.row_begin = padding;
    f.rows = std::max<int64_t>(0, f.grid_rows - 2 * padding);
  } else {
    const auto new_cols = static_cast<int64_t>(w * (gr / h));
    const int64_t padding = (f.grid_cols - new_cols) / 2;
    f.col_begin = padding;
    f.cols = std::max<int64_t>(0, f.grid_cols - 2 * padding);
  }
  return f;
}

LlavaNextImage preprocess_llava_next(const Image& image, const LlavaNextProcessorConfig& config, int64_t side,
                                     int64_t max_pixels) {
  check_config(config, "preprocess_llava_next");
  if (side < 1) fail<ConfigError>("preprocess_llava_next: features per tile side must be positive, got {}", side);
  if (max_pixels <= 0) fail<ConfigError>("preprocess_llava_next: max_pixels must be positive, got {}", max_pixels);
  check_image(image);
  const ImageProcessorConfig& clip = config.clip;
  const int64_t tile = config.tile();
  LlavaNextImage out;
  out.height = image.height;
  out.width = image.width;
  out.layout = anyres_layout(image.height, image.width, config.image_grid_pinpoints, tile);
  const AnyresLayout& l = out.layout;

  // Steps 2 and 3: resized to fit the pinpoint, then pasted on a zero canvas at (pad_top, pad_left).
  check_pixels(l.best.height, l.best.width, max_pixels, image, "tiling");
  if (l.resized_width != image.width) {
    check_pixels(image.height, l.resized_width, max_pixels, image, "the horizontal resize pass");
  }
  const Image resized = resize_image(image, l.resized_height, l.resized_width, clip.resample);
  Image canvas;
  canvas.height = l.canvas_height;
  canvas.width = l.canvas_width;
  canvas.pixels.assign(static_cast<size_t>(canvas.height * canvas.width * 3), 0);
  for (int64_t r = 0; r < resized.height; ++r) {
    const uint8_t* src = resized.pixels.data() + r * resized.width * 3;
    std::copy(src, src + resized.width * 3,
              canvas.pixels.data() + ((l.pad_top + r) * canvas.width + l.pad_left) * 3);
  }

  // Step 5's first entry: the whole image at shortest_edge squared, aspect not kept.
  const int64_t s = clip.shortest_edge;
  check_pixels(s, s, max_pixels, image, "resizing the whole image");
  if (s != image.width) check_pixels(image.height, s, max_pixels, image, "the horizontal resize pass");
  std::vector<Image> entries;
  entries.reserve(static_cast<size_t>(l.entries()));
  entries.push_back(resize_image(image, s, s, clip.resample));
  // Step 4: the tiles, row-major; the last row and column are short when the canvas is.
  for (int64_t r = 0; r < l.tile_rows; ++r) {
    for (int64_t c = 0; c < l.tile_cols; ++c) {
      const int64_t top = r * tile, left = c * tile;
      entries.push_back(window(canvas, top, left, std::min(tile, canvas.height - top), std::min(tile, canvas.width - left)));
    }
  }
  // Step 5: CLIPImageProcessor's steps per entry: [3, crop, crop] each.
  std::vector<at::Tensor> values;
  values.reserve(entries.size());
  for (const Image& entry : entries) values.push_back(preprocess_image(entry, clip, max_pixels));
  out.pixel_values = at::stack(values);  // [entries, 3, crop, crop]
  out.tokens = anyres_feature_layout(image.height, image.width, config.image_grid_pinpoints, tile, side).tokens();
  return out;
}

}  // namespace swiftcpp::vision
