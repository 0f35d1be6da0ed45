// Hugging Face LlavaNextImageProcessor (transformers 4.40.2, the slow PIL one), the image side of LLaVA-NeXT
// ("anyres"), reproduced bit for bit, and the anyres geometry its model shares (models/llava_next.cpp).
//
// The steps, for an RGB image of h x w (decoding and convert("RGB") are in vision/image.h):
//   1. pick the pinpoint (H, W) of image_grid_pinpoints (select_best_resolution): per pinpoint
//      scale = min(W / w, H / h), effective = min(int(w scale) * int(h scale), w h) in float64; the largest
//      effective wins, ties going to the least wasted area H W - effective (the first of equals stays).
//   2. resize to fit inside (H, W) with the aspect kept: if W / w < H / h then w' = W and
//      h' = min(ceil(h * (W / w)), H), else the mirror; Pillow's resize with the config's resample filter.
//   3. pad with uint8 zeros, p = (H - h') // 2 rows at the top and the same p at the bottom (likewise columns):
//      when H - h' is odd the canvas is one row short of H (transformers' quirk, kept).
//   4. split the canvas into tiles of crop_size, row-major; the last row / column of tiles is short when the
//      canvas is.
//   5. entry 0 is the whole image resized to shortest_edge x shortest_edge (aspect not kept), then the tiles;
//      every entry goes through CLIPImageProcessor's steps (vision/processor.h: shortest-edge resize, center crop,
//      rescale, normalize), which turn a short 55 x 56 tile into 56 x 57 and crop it at top 0, left 0.
// Every function here is thread-safe (no global state).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "vision/image.h"
#include "vision/processor.h"

namespace swiftcpp::vision {

/// A resolution anyres may tile an image at, in pixels (one [height, width] of image_grid_pinpoints).
struct Pinpoint {
  int64_t height = 0, width = 0;
  bool operator==(const Pinpoint& o) const { return height == o.height && width == o.width; }
  bool operator!=(const Pinpoint& o) const { return !(*this == o); }
};

/// The most pinpoints a config may list.
constexpr size_t kMaxPinpoints = 1024;

/// LlavaNextImageProcessor's and LlavaNextConfig's default image_grid_pinpoints (transformers 4.40.2).
std::vector<Pinpoint> default_grid_pinpoints();

/// Reads `json[key]` (which must be present) as image_grid_pinpoints: a list of 1..kMaxPinpoints [height, width] pairs of integers in
/// tile..kMaxProcessorSide that are multiples of `tile` (the tile side: a pinpoint that is not gives partial tiles
/// the model cannot place). Throws ConfigError naming the file and the key (with the element's index).
std::vector<Pinpoint> parse_grid_pinpoints(const JsonObject& json, const std::string& key, int64_t tile);

/// A LlavaNextImageProcessor configuration (preprocessor_config.json). `clip` holds the keys it shares with
/// CLIPImageProcessor (size, crop_size, resample, rescale, normalize, ...), class defaults as there.
struct LlavaNextProcessorConfig {
  ImageProcessorConfig clip;
  std::vector<Pinpoint> image_grid_pinpoints = default_grid_pinpoints();
  /// The tile side: crop_size (square).
  int64_t tile() const { return clip.crop_height; }
};

/// Reads a LlavaNextImageProcessor configuration from preprocessor_config.json's object; keys it does not use
/// are ignored, keys it uses are checked strictly. Throws ConfigError naming the file and key: what
/// parse_image_processor_config refuses, an image_processor_type other than LlavaNextImageProcessor, a `size`
/// without shortest_edge (the whole-image entry is resized to shortest_edge squared), a crop_size that is not
/// square, do_center_crop false (entries of different sizes cannot be stacked), a bad image_grid_pinpoints.
LlavaNextProcessorConfig parse_llava_next_processor_config(const JsonObject& json);

/// Features per tile side the model gives (vision_config.image_size / patch_size, CLIPVisionConfig's defaults 224
/// and 32 where absent), read from the model's config.json object `model_config`, which must agree with
/// `processor` (read from `processor_origin`): vision_config.image_size equal to the tile side and
/// image_grid_pinpoints (LlavaNextConfig's default when absent) equal to the processor's. The image processor
/// needs it for the token count, which depends on the vision tower's patch grid. Throws ConfigError naming both
/// origins and the key when they disagree or the sizes are out of range.
int64_t llava_next_features_per_side(const JsonObject& model_config, const LlavaNextProcessorConfig& processor,
                                     const std::string& processor_origin);

/// Step 1: the pinpoint an image of `height` x `width` is tiled at. Throws ConfigError when the list is empty or
/// a size is not positive.
Pinpoint select_best_resolution(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints);

/// Steps 1 to 4 for an image of `height` x `width`, in pixels.
struct AnyresLayout {
  Pinpoint best;                               // step 1
  int64_t resized_height = 0, resized_width = 0;  // step 2
  int64_t pad_top = 0, pad_left = 0;           // step 3 (the same at the bottom and right)
  int64_t canvas_height = 0, canvas_width = 0;
  int64_t tile_rows = 0, tile_cols = 0;        // step 4: ceil(canvas / tile)
  int64_t entries() const { return 1 + tile_rows * tile_cols; }
};

/// The layout of an image of `height` x `width` (positive) with tiles of `tile`. Throws ConfigError as
/// select_best_resolution does, and when `tile` is not positive.
AnyresLayout anyres_layout(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints, int64_t tile);

/// Where an image's features go in the language model (transformers 4.40.2's LLaVA-NeXT merge): the whole
/// image's side^2 features, then the tiles' features as one grid of (H / tile) side x (W / tile) side cells, cut
/// back to the image's aspect (unpad_image: if w / h > cols / rows, new = int(h * (cols / w)) and
/// (rows - new) // 2 rows go from the top and from the bottom; else the same on columns, in float64), each
/// remaining row followed by image_newline.
struct AnyresFeatureLayout {
  int64_t base = 0;                    // features of the whole-image entry (side^2)
  int64_t tile_rows = 0, tile_cols = 0;  // tiles the model reads: H / tile, W / tile
  int64_t grid_rows = 0, grid_cols = 0;  // feature cells before unpadding
  int64_t row_begin = 0, rows = 0;     // rows kept: [row_begin, row_begin + rows)
  int64_t col_begin = 0, cols = 0;     // columns kept
  /// Language-model positions the image takes: base + rows (cols + 1).
  int64_t tokens() const { return base + rows * (cols + 1); }
};

/// The feature layout of an image of `height` x `width` (its original size) with tiles of `tile` pixels giving
/// `side` x `side` features each. Throws ConfigError when a size is not positive or the pinpoints are empty.
AnyresFeatureLayout anyres_feature_layout(int64_t height, int64_t width, const std::vector<Pinpoint>& pinpoints,
                                          int64_t tile, int64_t side);

/// One preprocessed image.
struct LlavaNextImage {
  at::Tensor pixel_values;  // [entries, 3, crop, crop] float32, CPU: the whole image, then the tiles
  int64_t height = 0, width = 0;  // the original size (Hugging Face's image_sizes row)
  AnyresLayout layout;
  int64_t tokens = 0;       // AnyresFeatureLayout::tokens() for `side` features per tile side
};

/// The whole processor on one image (steps 1 to 5 above); `side` is the model's features per tile side
/// (llava_next_features_per_side), for the token count. Throws FormatError when the image is malformed or an
/// intermediate image (the pinpoint canvas, a resize's horizontal pass, an entry's CLIP steps) would exceed
/// `max_pixels`; ConfigError when `side` or `max_pixels` is not positive or the config holds values
/// parse_llava_next_processor_config refuses.
LlavaNextImage preprocess_llava_next(const Image& image, const LlavaNextProcessorConfig& config, int64_t side,
                                     int64_t max_pixels = kMaxImagePixels);

}  // namespace swiftcpp::vision
