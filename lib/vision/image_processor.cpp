#include "vision/image_processor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>
#include <tuple>

#include "core/error.h"
#include "core/json.h"
#include "vision/llava_next_processor.h"
#include "vision/processor.h"
#include "vision/qwen2_vl_processor.h"

namespace swiftcpp::vision {

namespace {

// An image size a header can state: positive, within 2^31 a side.
void check_size(int64_t height, int64_t width) {
  if (height < 1 || width < 1 || height > INT32_MAX || width > INT32_MAX) {
    fail<FormatError>("an image of {}x{} pixels (height x width): sides must be in [1, {}]", height, width, INT32_MAX);
  }
}

void check_tokens(int64_t tokens, int64_t height, int64_t width) {
  if (tokens < 1 || tokens > kMaxTokensPerImage) {
    fail<FormatError>("an image of {}x{} pixels would take {} tokens; [1, {}] are supported", height, width, tokens,
                      kMaxTokensPerImage);
  }
}

class ClipProcessor final : public ImageProcessor {
 public:
  ClipProcessor(ImageProcessorConfig config, int64_t tokens) : config_(std::move(config)), tokens_(tokens) {}
  std::string type() const override { return "CLIPImageProcessor"; }
  bool variable_size() const override { return false; }
  ProcessedImage process(const Image& image, int64_t max_pixels) const override {
    ProcessedImage out;
    out.pixel_values = preprocess_image(image, config_, max_pixels);  // [C, H, W]
    out.tokens = tokens_;
    return out;
  }
  int64_t tokens_for(int64_t height, int64_t width, int64_t) const override {
    check_size(height, width);
    return tokens_;
  }
  std::string fingerprint() const override {
    const ImageProcessorConfig& p = config_;
    // Doubles in their shortest exact form ({}), so equal settings always give equal text.
    return fmt::format("clip;tokens={};resize={}:{}:{}x{}:{};crop={}:{}x{};rescale={}:{};normalize={}:{}:{};rgb={}",
                       tokens_, p.do_resize, p.shortest_edge, p.resize_height, p.resize_width,
                       static_cast<int>(p.resample), p.do_center_crop, p.crop_height, p.crop_width, p.do_rescale,
                       p.rescale_factor, p.do_normalize, fmt::join(p.image_mean, ","), fmt::join(p.image_std, ","),
                       p.do_convert_rgb);
  }

 private:
  ImageProcessorConfig config_;
  int64_t tokens_;
};

class Qwen2VLProcessor final : public ImageProcessor {
 public:
  explicit Qwen2VLProcessor(Qwen2VLProcessorConfig config) : config_(std::move(config)) {}
  std::string type() const override { return "Qwen2VLImageProcessor"; }
  bool variable_size() const override { return true; }
  ProcessedImage process(const Image& image, int64_t max_pixels) const override {
    // The resized size is known before anything is allocated: refused when it exceeds the caller's bound (a
    // min_pixels far above the image upscales it).
    if (image.height >= config_.patch_size * config_.merge_size && image.width >= config_.patch_size * config_.merge_size) {
      tokens_for(image.height, image.width, max_pixels);
    }
    Qwen2VLImage q = preprocess_qwen2_vl(image, config_);
    ProcessedImage out;
    out.pixel_values = std::move(q.pixel_values);  // [patches, C T P P]
    out.grid_thw = {q.grid_t, q.grid_h, q.grid_w};
    out.tokens = q.tokens();
    return out;
  }
  int64_t tokens_for(int64_t height, int64_t width, int64_t max_pixels) const override {
    check_size(height, width);
    const int64_t patch = config_.patch_size, merge = config_.merge_size, factor = patch * merge;
    int64_t h = height, w = width;
    if (config_.do_resize) {
      std::tie(h, w) = smart_resize(height, width, factor, config_.min_pixels, config_.max_pixels);
      if (h == 0 || w == 0) {
        fail<FormatError>("an image of {}x{} pixels (height x width) would be resized to {}x{} (aspect ratio too "
                          "extreme for max_pixels {})", height, width, h, w, config_.max_pixels);
      }
      if (h > max_pixels / w) {
        fail<FormatError>("an image of {}x{} would be resized to {}x{} ({} pixels), more than the {} allowed", height,
                          width, h, w, h * w, max_pixels);
      }
    } else if (h % factor != 0 || w % factor != 0) {
      fail<FormatError>("without do_resize an image of {}x{} pixels must have sides that are multiples of patch_size "
                        "* merge_size = {}", h, w, factor);
    }
    // One token per merge x merge block of patches; h and w are multiples of patch * merge.
    const int64_t tokens = (h / factor) * (w / factor);
    check_tokens(tokens, height, width);
    return tokens;
  }
  std::string fingerprint() const override {
    const Qwen2VLProcessorConfig& p = config_;
    return fmt::format("qwen2_vl;pixels={}..{};patch={}x{}x{};resize={}:{};rescale={}:{};normalize={}:{}:{}",
                       p.min_pixels, p.max_pixels, p.patch_size, p.temporal_patch_size, p.merge_size, p.do_resize,
                       static_cast<int>(p.resample), p.do_rescale, p.rescale_factor, p.do_normalize,
                       fmt::join(p.image_mean, ","), fmt::join(p.image_std, ","));
  }

 private:
  Qwen2VLProcessorConfig config_;
};

class LlavaNextProcessor final : public ImageProcessor {
 public:
  LlavaNextProcessor(LlavaNextProcessorConfig config, int64_t side) : config_(std::move(config)), side_(side) {}
  std::string type() const override { return "LlavaNextImageProcessor"; }
  bool variable_size() const override { return true; }
  int64_t tokens_for(int64_t height, int64_t width, int64_t) const override {
    check_size(height, width);
    const int64_t tokens =
        anyres_feature_layout(height, width, config_.image_grid_pinpoints, config_.tile(), side_).tokens();
    check_tokens(tokens, height, width);
    return tokens;
  }
  ProcessedImage process(const Image& image, int64_t max_pixels) const override {
    LlavaNextImage n = preprocess_llava_next(image, config_, side_, max_pixels);
    ProcessedImage out;
    out.pixel_values = std::move(n.pixel_values);  // [entries, C, crop, crop]
    // Not a patch grid: (entries incl. the whole image, original height, original width), what the encoder needs
    // to place the tiles (Hugging Face's image_sizes row, with the entry count).
    out.grid_thw = {n.layout.entries(), n.height, n.width};
    out.tokens = n.tokens;
    return out;
  }
  std::string fingerprint() const override {
    const ImageProcessorConfig& p = config_.clip;
    std::string pins;
    for (const Pinpoint& q : config_.image_grid_pinpoints) pins += fmt::format("{}{}x{}", pins.empty() ? "" : ",", q.height, q.width);
    return fmt::format("llava_next;side={};pinpoints={};resize={}:{}:{};crop={}x{};rescale={}:{};normalize={}:{}:{}",
                       side_, pins, p.do_resize, p.shortest_edge, static_cast<int>(p.resample), p.crop_height,
                       p.crop_width, p.do_rescale, p.rescale_factor, p.do_normalize, fmt::join(p.image_mean, ","),
                       fmt::join(p.image_std, ","));
  }

 private:
  LlavaNextProcessorConfig config_;
  int64_t side_;  // the model's features per tile side, for the token count
};

}  // namespace

std::shared_ptr<const ImageProcessor> load_image_processor(const fs::path& model_dir, int64_t fixed_tokens,
                                                           const ImageProcessorOverrides& overrides) {
  const fs::path path = model_dir / "preprocessor_config.json";
  if (!fs::exists(path)) {
    fail<IoError>("'{}' not found: a vision-language model folder needs the preprocessor_config.json of its image "
                  "processor", path.string());
  }
  const JsonObject json = JsonObject::load(path);
  const std::string type = json.get_or<std::string>("image_processor_type", "CLIPImageProcessor");
  if (type == "Qwen2VLImageProcessor") {
    Qwen2VLProcessorConfig config = parse_qwen2_vl_processor_config(json);
    const auto check = [&](const std::optional<int64_t>& v, const char* name) {
      if (v && (*v < 1 || *v > kMaxQwen2VLPixels)) {
        fail<ConfigError>("{} must be in [1, {}], got {}", name, kMaxQwen2VLPixels, *v);
      }
    };
    check(overrides.min_pixels, "min_pixels");
    check(overrides.max_pixels, "max_pixels");
    if (overrides.min_pixels) config.min_pixels = *overrides.min_pixels;
    if (overrides.max_pixels) config.max_pixels = *overrides.max_pixels;
    if (config.min_pixels > config.max_pixels) {
      fail<ConfigError>("{}: min_pixels {} is larger than max_pixels {} (after the recipe's or command line's "
                        "overrides)", path.string(), config.min_pixels, config.max_pixels);
    }
    // The processor cuts the patches the tower embeds: its patch sizes and merge size are the tower's.
    const fs::path model_config = model_dir / "config.json";
    if (fs::exists(model_config)) {
      const JsonObject model = JsonObject::load(model_config);
      if (model.has("vision_config") && model.raw().at("vision_config").is_object()) {
        const JsonObject vision(model.raw().at("vision_config"), model_config.string());
        const auto agree = [&](const char* key, int64_t ours, const char* tower_key, int64_t fallback) {
          const int64_t tower = vision.get_or<int64_t>(tower_key, fallback);
          if (ours != tower) {
            fail<ConfigError>("{}: '{}' {} disagrees with {}: 'vision_config.{}' {} (the vision tower embeds the "
                              "processor's patches)", path.string(), key, ours, model_config.string(), tower_key, tower);
          }
        };
        agree("patch_size", config.patch_size, "patch_size", 14);
        agree("temporal_patch_size", config.temporal_patch_size, "temporal_patch_size", 2);
        agree("merge_size", config.merge_size, "spatial_merge_size", 2);
      }
    }
    return std::make_shared<Qwen2VLProcessor>(config);
  }
  if (type == "LlavaNextImageProcessor") {
    if (overrides.min_pixels || overrides.max_pixels) {
      fail<ConfigError>("{}: min_pixels / max_pixels apply to Qwen2-VL's image processor; LlavaNextImageProcessor "
                        "tiles images at its image_grid_pinpoints", path.string());
    }
    LlavaNextProcessorConfig config = parse_llava_next_processor_config(json);
    // The token count depends on the vision tower's patch grid, which only the model's config.json states.
    const fs::path model_config = model_dir / "config.json";
    if (!fs::exists(model_config)) {
      fail<IoError>("'{}' not found: LlavaNextImageProcessor counts an image's tokens from the model's vision_config",
                    model_config.string());
    }
    const int64_t side = llava_next_features_per_side(JsonObject::load(model_config), config, path.string());
    return std::make_shared<LlavaNextProcessor>(std::move(config), side);
  }
  if (type != "CLIPImageProcessor") {
    fail<ConfigError>("{}: image_processor_type '{}' is not supported (supported: CLIPImageProcessor, "
                      "Qwen2VLImageProcessor, LlavaNextImageProcessor)", path.string(), type);
  }
  if (overrides.min_pixels || overrides.max_pixels) {
    fail<ConfigError>("{}: min_pixels / max_pixels apply to Qwen2-VL's image processor; CLIPImageProcessor resizes "
                      "every image to one size", path.string());
  }
  if (fixed_tokens < 1) {
    fail<ConfigError>("{}: CLIPImageProcessor needs a model with a fixed number of tokens per image", path.string());
  }
  const ImageProcessorConfig config = parse_image_processor_config(json);
  // The tower embeds images of one size: the processor's output (the crop, or with do_center_crop off a resize to
  // a fixed height and width) must be the tower's vision_config.image_size square.
  const fs::path model_config = model_dir / "config.json";
  if (fs::exists(model_config)) {
    const JsonObject model = JsonObject::load(model_config);
    if (model.has("vision_config") && model.raw().at("vision_config").is_object()) {
      const JsonObject vision(model.raw().at("vision_config"), model_config.string());
      const int64_t side = vision.get_or<int64_t>("image_size", 224);  // CLIPVisionConfig's default
      if (config.do_center_crop) {
        if (config.crop_height != side || config.crop_width != side) {
          fail<ConfigError>("{}: 'crop_size' {}x{} (the processor's output; 224x224 when the key is absent) disagrees "
                            "with {}: 'vision_config.image_size' {} (the tower embeds images of that size)",
                            path.string(), config.crop_height, config.crop_width, model_config.string(), side);
        }
      } else if (!config.do_resize || config.resize_height != side || config.resize_width != side) {
        fail<ConfigError>("{}: with 'do_center_crop' false the processor must resize to 'size' {{\"height\": {}, "
                          "\"width\": {}}}, the tower's {}: 'vision_config.image_size' (images of any other or varying "
                          "size cannot be embedded)", path.string(), side, side, model_config.string());
      }
    }
  }
  return std::make_shared<ClipProcessor>(config, fixed_tokens);
}

}  // namespace swiftcpp::vision
