// The image processors of the vision-language families behind one interface: the checkpoint's
// preprocessor_config.json chooses one (image_processor_type), and the processor says how many language-model
// tokens each image becomes. CLIP's (LLaVA-1.5) gives every image one size and one count; Qwen2-VL's keeps the
// aspect ratio, so the count varies with the image.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/fs.h"
#include "vision/image.h"

namespace swiftcpp::vision {

/// The most language-model positions one image may take: far beyond any vision tower (LLaVA-1.5 at 336 px has
/// 576; Qwen2-VL at 2^32 pixels about 5.5 million would be refused by a context long before), low enough that
/// expanded lengths cannot overflow.
constexpr int64_t kMaxTokensPerImage = int64_t{1} << 20;

/// One preprocessed image, as the family's vision encoder takes it.
struct ProcessedImage {
  /// Fixed-size processors (CLIP): [C, H, W] float32. Variable-size ones (Qwen2-VL): [patches, C T P P] float32.
  at::Tensor pixel_values;
  /// Variable-size processors: the size triple the encoder needs (Qwen2-VL: (t, h, w) in patches, Hugging Face's
  /// image_grid_thw row; LLaVA-NeXT: (entries, original height, original width)); zeros otherwise.
  std::array<int64_t, 3> grid_thw = {0, 0, 0};
  int64_t tokens = 0;  // language-model positions the image takes
};

/// Settings a recipe or the command line may override (ms-swift's MAX_PIXELS / MIN_PIXELS); unset keeps the file's.
struct ImageProcessorOverrides {
  std::optional<int64_t> min_pixels, max_pixels;
};

/// A family's image processor. Immutable; safe to share between threads.
class ImageProcessor {
 public:
  virtual ~ImageProcessor() = default;
  /// Hugging Face's class name (CLIPImageProcessor, Qwen2VLImageProcessor).
  virtual std::string type() const = 0;
  /// The image as the vision encoder takes it; no intermediate image may exceed `max_pixels`. Throws FormatError
  /// when the image is malformed or its size is refused (an extreme aspect ratio, more than max_pixels),
  /// ConfigError on settings the processor cannot use.
  virtual ProcessedImage process(const Image& image, int64_t max_pixels = kMaxImagePixels) const = 0;
  /// The language-model positions an image of `height` x `width` pixels (its decoded size) takes, from its size
  /// alone: no pixel is read, so a caller can check a prompt's length before decoding and preprocessing its images.
  /// Throws FormatError for every size process() refuses without looking at pixels (an extreme aspect ratio, an
  /// image smaller than a patch block, a resize to more than `max_pixels`) and when the count falls outside
  /// [1, kMaxTokensPerImage].
  virtual int64_t tokens_for(int64_t height, int64_t width, int64_t max_pixels = kMaxImagePixels) const = 0;
  /// Whether images are batched by concatenating patch rows with their grids (true) or stacked (false).
  virtual bool variable_size() const = 0;
  /// A stable text of every setting that changes what process() returns, for cache keys and resume fingerprints.
  virtual std::string fingerprint() const = 0;
};

/// The processor `<model_dir>/preprocessor_config.json` asks for: CLIPImageProcessor (also when the type is
/// absent, or feature_extractor_type CLIPFeatureExtractor), whose images take `fixed_tokens` positions each (the
/// model's image_seq_length), or Qwen2VLImageProcessor, with `overrides` applied. Throws IoError when the file is
/// missing, FormatError when it is not a JSON object, ConfigError naming the file and key for a bad setting, an
/// unsupported image_processor_type (listing the supported ones), a fixed-size processor for a model without a
/// fixed count (fixed_tokens < 1) or overrides outside 1..2^32 or with min_pixels > max_pixels; and, for
/// Qwen2VLImageProcessor, a patch_size / temporal_patch_size / merge_size that disagrees with the model's
/// config.json vision_config (naming both files and keys).
std::shared_ptr<const ImageProcessor> load_image_processor(const fs::path& model_dir, int64_t fixed_tokens,
                                                           const ImageProcessorOverrides& overrides = {});

}  // namespace swiftcpp::vision
