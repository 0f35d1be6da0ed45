// LLaVA-NeXT (LlavaNextForConditionalGeneration, transformers 4.40.2): LLaVA-1.5's CLIP tower, projector and
// language model (models/llava_parts.h), with "anyres" images: each image is its whole-image entry plus the tiles
// of its best pinpoint (lib/vision/llava_next_processor.h), every entry goes through the tower and projector, and
// the tiles' features are packed as Hugging Face does (one grid, unpadded to the image's aspect, `image_newline`
// after every row), so each image takes its own number of positions.
#include <ATen/ATen.h>

#include <vector>

#include "core/json.h"
#include "models/decoder/decoder.h"
#include "models/llava_parts.h"
#include "models/registry.h"
#include "vision/llava_next_processor.h"

namespace swiftcpp {

namespace {

// The largest original image side image_grid_thw may state (far above what kMaxImagePixels lets decode).
constexpr int64_t kMaxImageSide = int64_t{1} << 28;

/// The encoder: LLaVA's tower and projector on every entry, then the anyres packing; and `image_newline` [D].
///
/// image_grid_thw [N, 3] int64 carries, per image, (entries incl. the whole image, original height, original
/// width): not a patch grid, but the per-image size information the packing needs (Hugging Face's image_sizes
/// row, with the entry count so that pixel_values can be split). pixel_values is the concatenation of every
/// image's entries, [sum of entries, C, S, S].
class LlavaNextVisionEncoderImpl : public LlavaVisionEncoderImpl {
 public:
  LlavaNextVisionEncoderImpl(const LlavaSettings& s, std::vector<vision::Pinpoint> pinpoints)
      : LlavaVisionEncoderImpl(s), pinpoints_(std::move(pinpoints)) {
    // Hugging Face's top-level `image_newline` (transformers creates it uninitialised; load_weights fills it).
    image_newline = register_parameter("image_newline", at::empty({s.text_hidden}));
  }

  int64_t feature_rows(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) const override {
    int64_t rows = 0;
    for (const auto& l : layouts(pixel_values, image_grid_thw)) rows += l.tokens();
    return rows;
  }

  at::Tensor encode(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) override {
    const std::vector<vision::AnyresFeatureLayout> images = layouts(pixel_values, image_grid_thw);
    const at::Tensor features = project_entries(pixel_values);  // [E, side^2, D]
    const int64_t side = s_.vision.image_size / s_.vision.patch_size;
    const int64_t D = features.size(2);
    const at::Tensor newline = image_newline.to(features.scalar_type());  // [D]
    std::vector<at::Tensor> out;
    out.reserve(2 * images.size());
    int64_t entry = 0;
    for (const auto& l : images) {
      out.push_back(features[entry]);  // the whole image: [side^2, D]
      // Tiles [th tw, side^2, D] -> one feature map [D, th side, tw side], row-major over tiles and cells.
      const at::Tensor tiles = features.narrow(0, entry + 1, l.tile_rows * l.tile_cols)
                                   .reshape({l.tile_rows, l.tile_cols, side, side, D})
                                   .permute({4, 0, 2, 1, 3})
                                   .reshape({D, l.grid_rows, l.grid_cols});
      const at::Tensor kept = tiles.narrow(1, l.row_begin, l.rows).narrow(2, l.col_begin, l.cols);  // [D, r, c]
      const at::Tensor rows = at::cat({kept, newline.view({D, 1, 1}).expand({D, l.rows, 1})}, 2);  // [D, r, c + 1]
      out.push_back(rows.reshape({D, l.rows * (l.cols + 1)}).t());  // [r (c + 1), D]
      entry += 1 + l.tile_rows * l.tile_cols;
    }
    return at::cat(out, 0);  // [M, D]: every image's rows in order
  }

  at::Tensor image_newline;  // [D]

 private:
  // Each image's feature layout from image_grid_thw, with every shape checked against pixel_values.
  std::vector<vision::AnyresFeatureLayout> layouts(const at::Tensor& pixel_values, const at::Tensor& grid) const {
    if (!grid.defined() || grid.dim() != 2 || grid.size(1) != 3) {
      fail<ModelError>("LLaVA-NeXT images need image_grid_thw [N, 3] (entries, original height, original width) "
                       "beside pixel_values");
    }
    check_entries(pixel_values, "LLaVA-NeXT");
    const at::Tensor g = grid.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = g.data_ptr<int64_t>();
    const int64_t side = s_.vision.image_size / s_.vision.patch_size;
    std::vector<vision::AnyresFeatureLayout> out;
    out.reserve(static_cast<size_t>(g.size(0)));
    int64_t entries = 0;
    for (int64_t i = 0; i < g.size(0); ++i) {
      const int64_t n = p[i * 3], h = p[i * 3 + 1], w = p[i * 3 + 2];
      if (h < 1 || w < 1 || h > kMaxImageSide || w > kMaxImageSide) {
        fail<ModelError>("image {}: original size {}x{} must be in 1..{}", i, h, w, kMaxImageSide);
      }
      out.push_back(vision::anyres_feature_layout(h, w, pinpoints_, s_.vision.image_size, side));
      const int64_t expected = 1 + out.back().tile_rows * out.back().tile_cols;
      if (n != expected) {
        fail<ModelError>("image {} ({}x{}) has {} entries, but its pinpoint takes the whole image and {}x{} tiles ({})",
                         i, h, w, n, out.back().tile_rows, out.back().tile_cols, expected);
      }
      entries += n;
    }
    if (pixel_values.size(0) != entries) {
      fail<ModelError>("LLaVA-NeXT pixel_values hold {} entries, but image_grid_thw says {}", pixel_values.size(0),
                       entries);
    }
    return out;
  }

  std::vector<vision::Pinpoint> pinpoints_;
};

DecoderConfig parse_llava_next(const JsonObject& json) {
  const std::string origin = json.origin();
  LlavaParts parts = parse_llava_parts(json);
  DecoderConfig c = std::move(parts.text);
  c.model_type = "llava_next";
  c.architecture = "LlavaNextForConditionalGeneration";
  const LlavaSettings s = parts.settings;
  if (!s.drop_cls) {
    // transformers 4.40.2 raises for it too: the whole-image entry must give exactly side^2 features.
    fail<ConfigError>("{}: 'vision_feature_select_strategy' 'full' is not supported by LLaVA-NeXT (anyres packs "
                      "image_size / patch_size squared features per entry); use 'default'", origin);
  }
  const std::vector<vision::Pinpoint> pinpoints =
      json.has("image_grid_pinpoints") ? vision::parse_grid_pinpoints(json, "image_grid_pinpoints", s.vision.image_size)
                                       : vision::default_grid_pinpoints();
  if (json.has("image_seq_length") && json.get<int64_t>("image_seq_length") != s.features_per_entry()) {
    // Later transformers write the whole-image entry's count there.
    fail<ConfigError>("{}: 'image_seq_length' is {}, but the vision tower gives {} features per entry", origin,
                      json.get<int64_t>("image_seq_length"), s.features_per_entry());
  }

  auto mm = std::make_shared<MultimodalConfig>();
  mm->image_token_index = parts.image_token_index;
  mm->image_seq_length = 0;  // per image: the processor counts each image's positions
  mm->image_size = 0;        // images of any size (entries are image_size squared)
  mm->num_channels = s.vision.num_channels;
  CheckedCount n;
  mm->parameter_count = n.add(s.parameter_count(), c.hidden_size);  // + image_newline
  if (n.overflow || s.parameter_count() < 0) {
    fail<ConfigError>("{}: the vision tower's parameter count overflows", origin);
  }
  mm->make_encoder = [s, pinpoints]() -> std::shared_ptr<VisionEncoderImpl> {
    return std::make_shared<LlavaNextVisionEncoderImpl>(s, pinpoints);
  };
  c.multimodal = mm;
  return c;
}

}  // namespace

ArchitectureSpec llava_next_spec() {
  return {"llava_next", {"LlavaNextForConditionalGeneration"},
          "LLaVA-NeXT (anyres tiles through LLaVA's CLIP tower + projector + any registered text family)",
          &parse_llava_next};
}

}  // namespace swiftcpp
