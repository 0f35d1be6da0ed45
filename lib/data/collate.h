// Batching: right-padded batches and best-fit-decreasing packing with block-diagonal attention.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

namespace swiftcpp {

constexpr int32_t kIgnoreIndex = -100;

/// One tokenised example. labels are already shifted: labels[t] is the token position t must predict
/// (input_ids[t + 1]) or kIgnoreIndex, so samples can be concatenated without predicting across them.
struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length as input_ids; the last is always kIgnoreIndex
  /// One per image, in the order of the image-token runs: [C, H, W] float32 (fixed-size processors) or
  /// [patches, C T P P] float32 (Qwen2-VL).
  std::vector<at::Tensor> pixel_values;
  /// Variable-size images: each image's size triple (Qwen2-VL: (t, h, w) in patches; LLaVA-NeXT: (entries, height,
  /// width)); empty for fixed-size processors.
  std::vector<std::array<int64_t, 3>> image_grids;
  /// Each image's token count (the length of its run), as the processor said; empty for samples built without it.
  std::vector<int64_t> image_tokens;
  int64_t label_tokens() const;
};

/// The image tokens of a sequence: each image fills `per_image` consecutive positions holding `id` (fixed-count
/// families), or, with `per_image` 0 and `merge` set (Qwen2-VL), as many as its grid says (t h w / merge^2, from
/// Sample::image_grids); such families also take M-RoPE positions.
struct ImageTokenLayout {
  int32_t id = -1;
  int64_t per_image = 0;
  int64_t merge = 0;
};

/// Tokens [begin, end) of a sequence.
struct TokenSpan {
  int64_t begin = 0;
  int64_t end = 0;
};

/// The run of each image in `ids`, in order: consecutive images (an unbroken stretch of k * per_image image
/// tokens) are k runs. Throws ConfigError when layout.per_image < 1 or a stretch of image tokens is not a
/// multiple of per_image long (an image cut in part).
std::vector<TokenSpan> image_token_runs(const std::vector<int32_t>& ids, const ImageTokenLayout& layout);

/// The run of each image in `ids` for images of `counts[i]` tokens each, in order (variable-size images).
/// Throws ConfigError when the image tokens do not split into runs of those lengths.
std::vector<TokenSpan> image_token_runs(const std::vector<int32_t>& ids, int32_t id, const std::vector<int64_t>& counts);

/// Tensors for one micro-batch, on the CPU.
struct Batch {
  at::Tensor input_ids;     // [B, T] int64
  at::Tensor labels;        // [B, T] int64, kIgnoreIndex on padding and untrained tokens
  at::Tensor key_valid;     // [B, T] bool, false on padding (undefined when nothing is padded)
  at::Tensor position_ids;  // [B, T] int64, restarting at 0 for every packed sample
  at::Tensor segment_ids;   // [B, T] int64, packed batches only: which sample each token belongs to
  at::Tensor pixel_values;  // [N, C, H, W] float32: the images of every row, in row-major order of their
                            // image-token runs; undefined when no sample has an image. Variable-size images:
                            // [sum of patches, C T P P], their patch rows concatenated in the same order
  at::Tensor image_grid_thw;  // [N, 3] int64 with variable-size images; undefined otherwise
  int64_t label_tokens = 0;
  int64_t real_tokens = 0;  // tokens that are not padding
};

/// Right-pads samples to the longest one with `pad_id` (labels kIgnoreIndex, key_valid false), and stacks the
/// samples' images in order. Throws ConfigError when images of different sizes meet in one batch.
Batch collate_padded(const std::vector<const Sample*>& samples, int32_t pad_id);

/// Groups sample lengths into rows of at most `capacity` tokens, best fit decreasing: longest first, each into
/// the row with the least room that still fits it (a new row when none does). Returns sample indices per row,
/// longest rows first. Throws ConfigError when a length exceeds the capacity.
std::vector<std::vector<size_t>> pack_best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

/// Concatenates the samples of each row (as pack_best_fit_decreasing grouped them), pads rows to the longest,
/// and sets positions restarting at 0 and segment ids so packed samples never attend to each other. The samples'
/// images are stacked rows first, within a row in the order its samples are concatenated, so they follow the
/// row-major order of the image-token runs. Throws ConfigError when images of different sizes meet in one batch.
Batch collate_packed(const std::vector<std::vector<const Sample*>>& rows, int32_t pad_id);

/// The images of `samples` stacked in order into [N, C, H, W] float32 (undefined when there are none). Throws
/// ConfigError naming the two shapes when the images differ in size.
at::Tensor stack_pixel_values(const std::vector<const Sample*>& samples);

/// The images of one forward, as ForwardOptions takes them.
struct ImageInputs {
  at::Tensor pixel_values;    // [N, C, H, W] (fixed-size) or [sum of patches, C T P P] (variable-size); may be undefined
  at::Tensor image_grid_thw;  // [N, 3] int64 for variable-size images; undefined otherwise
  bool empty() const { return !pixel_values.defined() || pixel_values.numel() == 0; }
};

/// The images of `samples` in order as a model forward takes them: stacked [N, C, H, W] for fixed-size images;
/// for variable-size ones (Sample::image_grids) the patch rows concatenated and the grids [N, 3] int64. Both
/// undefined when there are no images. Throws ConfigError as stack_pixel_values does, and when fixed-size and
/// variable-size images meet.
ImageInputs batch_images(const std::vector<const Sample*>& samples);

/// Sum of token cross-entropies of logits [B, T, V] against labels [B, T] (kIgnoreIndex skipped), computed in
/// float32 or wider. Divide by the global batch's label-token count for the training loss.
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace swiftcpp
