// ChunkFlow ("Efficient Long Context Fine-tuning with Chunk Flow", ICML 2025): a global batch reorganised into
// chunks of at most chunk_size tokens. Short samples are packed into standalone chunks; a longer one is split into
// dependent chunks that attend to the stored K/V of the chunks before them. The state-aware schedule keeps the
// autograd graphs of at most `keep` chunks of a split sample alive and recomputes the others, so activation
// memory follows the chunk size, not the longest sample. Gradients equal unchunked training's.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/collate.h"
#include "nn/attention.h"

namespace swiftcpp {

/// Tokens [begin, end) of sample `sample`.
struct ChunkSpan {
  size_t sample = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

/// Chunks run together: one standalone chunk of whole samples packed side by side, or the consecutive dependent
/// chunks of one split sample (one span each).
struct ChunkGroup {
  bool dependent = false;
  std::vector<std::vector<ChunkSpan>> chunks;
};

/// Plans a global batch from its sample lengths: samples of at most `chunk_size` tokens are packed best fit
/// decreasing into standalone chunks of at most `chunk_size`; a longer sample of length L becomes ceil(L / C)
/// dependent chunks (the last one shorter). Split samples come first, longest first; then standalone chunks.
/// Every token of every sample lies in exactly one chunk. `image_runs`, when not empty, holds per sample the
/// token spans of its images (ascending, not overlapping): a chunk boundary never falls inside one, it moves back
/// to where the run starts (so a sample with images may take more than ceil(L / C) chunks). Throws ConfigError
/// when chunk_size < 1, when image_runs is neither empty nor one list per sample, or when an image run of a
/// sample to be split is longer than chunk_size (chunk_size must be at least image_seq_length).
std::vector<ChunkGroup> plan_chunks(const std::vector<int64_t>& lengths, int64_t chunk_size,
                                    const std::vector<std::vector<TokenSpan>>& image_runs = {});

/// One global batch as ChunkFlow runs it.
struct ChunkedBatch {
  std::vector<Batch> standalone;               // [1, <=C] rows of packed whole samples
  std::vector<std::vector<Batch>> sequences;   // per split sample its chunks in order: [1, <=C] slices whose
                                               // position_ids continue from the slice's start
  int64_t label_tokens = 0;
  int64_t real_tokens = 0;
  int64_t chunks() const;
};

/// Builds the chunks of `samples` (plan_chunks on their lengths). Labels are shifted before splitting (Sample's
/// labels[t] already names token t + 1), so a chunk's last position predicts the next chunk's first token.
/// Samples with images need `images` (the model's image token id and image_seq_length): chunk boundaries then
/// never cut an image's run, and each chunk's Batch carries the pixel_values of exactly the runs it holds
/// ([N, C, H, W], undefined when none). Throws ConfigError as plan_chunks does, when a sample has images and
/// `images` is unset, or when a sample's image runs and pixel_values differ in number.
ChunkedBatch build_chunked_batch(const std::vector<const Sample*>& samples, int64_t chunk_size, int32_t pad_id,
                                 const ImageTokenLayout& images = {});

/// Forwards the state-aware schedule runs for a sample of n chunks keeping k graphs: n + max(0, n - k).
int64_t chunkflow_forward_count(int64_t n, int64_t k);

struct ChunkFlowOptions {
  int64_t keep = 1;                  // K: chunks of a split sample whose graphs stay alive
  bool ascending_recompute = false;  // wrong on purpose (tests only): recompute in ascending order
};

struct ChunkFlowCounters {
  int64_t forwards = 0;
  int64_t backwards = 0;
  int64_t chunks = 0;
};

/// The summed token loss of one chunk. `state` is null for standalone chunks; for dependent chunks it carries the
/// earlier chunks' K/V and receives this chunk's. With need_loss false only the K/V are wanted (the forward of a
/// chunk whose graph is not kept): the function may skip the head and return an undefined tensor.
using ChunkLossFn = std::function<at::Tensor(const Batch& chunk, nn::ChunkKV* state, bool need_loss)>;

/// Forward and backward of every chunk of `batch` with the state-aware schedule, accumulating
/// d(scale * sum of chunk losses)/d(parameters) into the parameters' .grad:
/// - a standalone chunk: forward, backward;
/// - a split sample of N chunks with K = min(keep, N): forward chunks 0..N-1 in order, the first N-K without
///   autograd (only their K/V are stored, as leaves that require grad), then backward the kept ones from last to
///   first, then for i = N-K-1 down to 0 recompute chunk i (same random state) and back-propagate it at once.
///   Each backward has several roots: the chunk's loss and the K/V it produced, seeded with the gradients later
///   chunks left on the corresponding leaves.
/// Returns the sum of the chunk losses (detached, on the model's device; undefined when there was none).
at::Tensor chunkflow_backward(const ChunkedBatch& batch, const ChunkLossFn& loss, double scale,
                              const ChunkFlowOptions& options, const at::Device& device,
                              ChunkFlowCounters* counters = nullptr);

}  // namespace swiftcpp
