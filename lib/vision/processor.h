// Hugging Face CLIPImageProcessor (transformers 4.40.2), the image side of LLaVA-1.5: shortest-edge resize with
// Pillow's resampling, center crop, rescale and normalize, reproduced bit for bit.
//
// The steps, for an RGB image (decoding and convert("RGB") are in vision/image.h):
//   1. resize (do_resize) so that the short side is `shortest_edge` and the long side int(s * long / short),
//      truncated, with Pillow 9.4's Image.resize (reducing_gap None); an image already at that size is not
//      resampled. A size given as height and width resizes to exactly that.
//   2. center crop (do_center_crop) at top = (h - crop_height) // 2, left = (w - crop_width) // 2 (floor
//      division), padding with zeros where the image is smaller than the crop, as transformers' center_crop does.
//   3. rescale (do_rescale): float32(float64(u8) * rescale_factor).
//   4. normalize (do_normalize): (x - float32(mean[c])) / float32(std[c]) in float32.
//   5. channels first: [3, H, W] float32.
// Every function here is thread-safe (no global state).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "core/fs.h"
#include "core/json.h"
#include "vision/image.h"

namespace swiftcpp::vision {

/// Pillow's resampling filters that are supported, with Pillow's numbering (the `resample` key).
enum class Resample : int {
  kBilinear = 2,  // triangle filter, support 1
  kBicubic = 3,   // cubic convolution a = -0.5, support 2
};

/// The largest value a size in an image processor config may have (size, crop_size).
constexpr int64_t kMaxProcessorSide = 65536;

/// A CLIPImageProcessor configuration (preprocessor_config.json). Defaults are the class defaults of
/// transformers 4.40.2, which apply to keys the file leaves out.
struct ImageProcessorConfig {
  bool do_resize = true;
  int64_t shortest_edge = 224;                  // size {"shortest_edge": s} (or a plain integer); 0 when size
                                                // gives height and width instead
  int64_t resize_height = 0, resize_width = 0;  // size {"height": h, "width": w}; 0 when shortest_edge is used
  Resample resample = Resample::kBicubic;
  bool do_center_crop = true;
  int64_t crop_height = 224, crop_width = 224;  // crop_size {"height", "width"} (or a plain integer)
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};
  bool do_convert_rgb = true;  // decoded images are always RGB, so this changes nothing
};

/// Reads a CLIPImageProcessor configuration from preprocessor_config.json's object. Keys it does not use are
/// ignored (processor_class, _valid_processor_keys, ...); keys it uses are checked strictly. Throws ConfigError
/// naming the file and the key on a wrong type, an out-of-range value (sizes must be 1..kMaxProcessorSide, std
/// non-zero, numbers finite), a size that is neither {shortest_edge} nor {height, width}, a resample filter other
/// than 2 (bilinear) or 3 (bicubic), and an image_processor_type other than CLIPImageProcessor (or
/// feature_extractor_type other than CLIPFeatureExtractor).
ImageProcessorConfig parse_image_processor_config(const JsonObject& json);

/// The `resample` key (Pillow's filter number; `fallback` when absent) shared by the processors. Throws ConfigError
/// naming the file and key for a filter other than 2 (bilinear) or 3 (bicubic).
Resample parse_resample(const JsonObject& json, Resample fallback);

/// The rescale / normalize keys the processors share (do_rescale, rescale_factor, do_normalize, image_mean,
/// image_std as a number or 3 numbers, do_convert_rgb), each left as given when absent. Throws ConfigError naming
/// the file and key on a wrong type, a non-finite number or a zero std.
void parse_pixel_settings(const JsonObject& json, bool& do_rescale, double& rescale_factor, bool& do_normalize,
                          std::array<double, 3>& image_mean, std::array<double, 3>& image_std, bool& do_convert_rgb);

/// Loads `<model_dir>/preprocessor_config.json` (parse_image_processor_config). Throws IoError when the file is
/// missing or unreadable, FormatError when it is not a JSON object, ConfigError as the parser does.
ImageProcessorConfig load_image_processor_config(const fs::path& model_dir);

/// Height and width of an image after step 1 (the input size when do_resize is off).
struct ImageSize {
  int64_t height = 0, width = 0;
};

/// The size step 1 gives an image of `height` x `width`. Throws ConfigError when either is not positive.
ImageSize resize_output_size(int64_t height, int64_t width, const ImageProcessorConfig& config);

/// Resizes with Pillow 9.4's Image.resize(size, filter) on an RGB image, bit-identical to it: separable,
/// horizontal pass then vertical pass, each skipped when that dimension does not change; 8-bit fixed-point
/// coefficients with 22 fractional bits, rounded and clipped to uint8 after each pass. Returns a copy when the
/// size is unchanged. Throws ConfigError when `height` or `width` is not positive, FormatError when `image` is
/// empty or its pixels do not hold height * width * 3 bytes.
Image resize_image(const Image& image, int64_t height, int64_t width, Resample resample);

/// resize_image with Resample::kBicubic (Pillow's Image.BICUBIC). Throws as resize_image does.
Image resize_bicubic(const Image& image, int64_t height, int64_t width);

/// The `height` x `width` window at top = (h - height) // 2, left = (w - width) // 2 (floor division), with zeros
/// where it falls outside the image (transformers' center_crop). Throws ConfigError when `height` or `width` is
/// not positive, FormatError when the image's pixels do not hold height * width * 3 bytes.
Image center_crop(const Image& image, int64_t height, int64_t width);

/// Steps 1 and 2 on uint8 pixels: the image that rescale and normalize see. Throws FormatError when the image is
/// malformed (see resize_image) or when the resized image (or the intermediate of its horizontal pass) or the crop
/// would exceed `max_pixels` pixels (an extreme aspect ratio resized by its short side); ConfigError when
/// `max_pixels` is not positive.
Image prepare_image(const Image& image, const ImageProcessorConfig& config, int64_t max_pixels = kMaxImagePixels);

/// Steps 3 to 5: an RGB image -> pixel values [3, H, W] float32 on the CPU (without rescale and normalize, the
/// uint8 values as float32). Throws FormatError when the image is malformed.
at::Tensor to_pixel_values(const Image& image, const ImageProcessorConfig& config);

/// The whole processor: `image` (H x W RGB) -> pixel_values [3, crop_height, crop_width] float32 on the CPU (with
/// do_center_crop off, the resized size). Throws what prepare_image throws.
at::Tensor preprocess_image(const Image& image, const ImageProcessorConfig& config,
                            int64_t max_pixels = kMaxImagePixels);

}  // namespace swiftcpp::vision
