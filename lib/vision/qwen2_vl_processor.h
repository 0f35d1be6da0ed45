// Hugging Face Qwen2VLImageProcessor (the slow, PIL one; transformers 4.46 and 4.49 agree), the image side of
// Qwen2-VL and Qwen2.5-VL: smart_resize, Pillow's bicubic resize, rescale and normalize, and the patch layout the
// vision tower reads, reproduced bit for bit.
//
// The steps, for an RGB image (decoding and convert("RGB") are in vision/image.h):
//   1. (rh, rw) = smart_resize(h, w, patch_size * merge_size, min_pixels, max_pixels) (do_resize), then Pillow 9.4's
//      Image.resize((rw, rh), resample) on the uint8 image; an image already at that size is not resampled.
//   2. rescale (do_rescale): float32(float64(u8) * rescale_factor).
//   3. normalize (do_normalize): (x - float32(mean[c])) / float32(std[c]) in float32.
//   4. patchify: grid (gh, gw) = (rh / patch_size, rw / patch_size); the frame is repeated temporal_patch_size
//      times; rows are ordered by merge_size x merge_size block (blocks in raster order, patches in raster order
//      inside a block), each row [channel][frame][y][x] flattened.
// Steps 2 and 3 are vision/processor.h's, shared with the CLIP processor. Every function here is thread-safe (no
// global state; nothing depends on the floating-point environment).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <utility>

#include "core/json.h"
#include "vision/image.h"
#include "vision/processor.h"

namespace swiftcpp::vision {

/// The largest min_pixels / max_pixels a Qwen2-VL processor config may have (2^32).
constexpr int64_t kMaxQwen2VLPixels = int64_t{1} << 32;

/// The largest patch_size, merge_size and temporal_patch_size a config may have.
constexpr int64_t kMaxQwen2VLPatchParameter = 1024;

/// A Qwen2VLImageProcessor configuration (preprocessor_config.json). Defaults are the class defaults of
/// transformers 4.46 / 4.49, which apply to keys the file leaves out (Qwen2-VL-7B-Instruct's file itself says
/// max_pixels 12845056; the class default is 28 * 28 * 1280 = 1003520).
struct Qwen2VLProcessorConfig {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  bool do_resize = true;
  Resample resample = Resample::kBicubic;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};
  bool do_convert_rgb = true;  // decoded images are always RGB, so this changes nothing
};

/// Reads a Qwen2VLImageProcessor configuration from preprocessor_config.json's object. Keys it does not use are
/// ignored (processor_class, ...); keys it uses are checked strictly. The pixel bounds come from the top-level
/// `min_pixels` / `max_pixels` when present, else from `size`, spelled {"min_pixels", "max_pixels"}
/// (transformers 4.46) or {"shortest_edge": min_pixels, "longest_edge": max_pixels} (4.49: pixel counts under
/// edge names). Throws ConfigError naming the file and the key on a wrong type or an out-of-range value
/// (min_pixels and max_pixels must be in 1..kMaxQwen2VLPixels with min_pixels <= max_pixels; patch_size,
/// merge_size and temporal_patch_size in 1..kMaxQwen2VLPatchParameter; rescale_factor finite; image_mean finite
/// and image_std finite and non-zero), a `size` that is neither spelling, a resample filter other than 2
/// (bilinear) or 3 (bicubic), and an image_processor_type other than Qwen2VLImageProcessor.
Qwen2VLProcessorConfig parse_qwen2_vl_processor_config(const JsonObject& json);

/// transformers' smart_resize(height, width, factor, min_pixels, max_pixels) with Python's semantics: both sides
/// rounded to a multiple of `factor` (half to even on the float64 quotient), then scaled down by
/// beta = sqrt(h * w / max_pixels) (floor) when that exceeds max_pixels, or up by sqrt(min_pixels / (h * w))
/// (ceil) when it falls below min_pixels, in IEEE float64 in Python's order. The result is not re-checked: it can
/// be 0 or fall below min_pixels, as in transformers. Returns {resized height, resized width}. Throws FormatError
/// when height or width is below `factor` or max(h, w) / min(h, w) > 200 (transformers' ValueErrors), or when
/// height * width exceeds 2^53 (beyond exact float64 integers); ConfigError when `factor`, `min_pixels` or
/// `max_pixels` is not positive.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels);

/// One preprocessed image: what Qwen2VLImageProcessor returns as pixel_values and image_grid_thw.
struct Qwen2VLImage {
  at::Tensor pixel_values;  // [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size^2] float32, CPU
  int64_t grid_t = 0, grid_h = 0, grid_w = 0;  // image_grid_thw, in patches
  int64_t merge_size = 2;                      // the config's merge_size
  /// The number of LLM tokens the image becomes (one per merge_size x merge_size block of patches).
  int64_t tokens() const { return grid_t * grid_h * grid_w / (merge_size * merge_size); }
};

/// The whole processor on one image (`image`, H x W RGB): steps 1 to 4 of the top of this header. With do_resize
/// off the image is used at its own size, which must then be a multiple of patch_size * merge_size. With
/// do_rescale and do_normalize off the values are the uint8 values as float32. Throws FormatError when smart_resize
/// refuses the size (see there), when it gives a side of 0 (an extreme aspect ratio), when the image is malformed
/// (its pixels do not hold height * width * 3 bytes) or, without do_resize, when a side is not a multiple of
/// patch_size * merge_size; ConfigError when the config holds values parse_qwen2_vl_processor_config refuses.
Qwen2VLImage preprocess_qwen2_vl(const Image& image, const Qwen2VLProcessorConfig& config);

}  // namespace swiftcpp::vision
