#include "train/chunkflow.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

std::vector<ChunkGroup> plan_chunks(const std::vector<int64_t>& lengths, int64_t chunk_size,
                                    const std::vector<std::vector<TokenSpan>>& image_runs) {
  if (chunk_size < 1) fail<ConfigError>("chunk_size must be at least 1 (got {})", chunk_size);
  if (!image_runs.empty() && image_runs.size() != lengths.size()) {
    fail<ConfigError>("plan_chunks: image runs for {} samples, but {} sample lengths", image_runs.size(),
                      lengths.size());
  }
  std::vector<size_t> long_ones;
  std::vector<size_t> short_ones;
  std::vector<int64_t> short_lengths;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] <= 0) continue;  // nothing to place
    if (lengths[i] > chunk_size) {
      long_ones.push_back(i);
    } else {
      short_ones.push_back(i);
      short_lengths.push_back(lengths[i]);
    }
  }
  std::stable_sort(long_ones.begin(), long_ones.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<ChunkGroup> groups;
  for (size_t i : long_ones) {
    static const std::vector<TokenSpan> kNone;
    const std::vector<TokenSpan>& runs = image_runs.empty() ? kNone : image_runs[i];
    for (const TokenSpan& run : runs) {
      if (run.end - run.begin > chunk_size) {
        fail<ConfigError>("chunk_size {} is smaller than an image's {} tokens (sample {} of {} tokens): chunk_size "
                          "must be at least image_seq_length", chunk_size, run.end - run.begin, i, lengths[i]);
      }
    }
    ChunkGroup g;
    g.dependent = true;
    size_t next_run = 0;  // the first run that does not end before `begin`
    for (int64_t begin = 0, end = 0; begin < lengths[i]; begin = end) {
      end = std::min(lengths[i], begin + chunk_size);
      while (next_run < runs.size() && runs[next_run].end <= begin) ++next_run;
      for (size_t r = next_run; r < runs.size() && runs[r].begin < end; ++r) {
        if (end < runs[r].end) end = runs[r].begin;  // inside the run: the boundary moves to before it
      }
      g.chunks.push_back({ChunkSpan{i, begin, end}});
    }
    groups.push_back(std::move(g));
  }
  for (const auto& row : pack_best_fit_decreasing(short_lengths, chunk_size)) {
    ChunkGroup g;
    g.chunks.emplace_back();
    for (size_t k : row) g.chunks.back().push_back(ChunkSpan{short_ones[k], 0, short_lengths[k]});
    groups.push_back(std::move(g));
  }
  return groups;
}

int64_t ChunkedBatch::chunks() const {
  int64_t n = static_cast<int64_t>(standalone.size());
  for (const auto& s : sequences) n += static_cast<int64_t>(s.size());
  return n;
}

namespace {

// One dependent chunk: tokens [begin, end) of a sample, positions begin..end-1 (M-RoPE: the slice of the whole
// sample's [3, 1, L] positions), no padding, with the images whose runs lie inside it.
Batch slice_batch(const Sample& s, int64_t begin, int64_t end, const std::vector<TokenSpan>& runs,
                  const at::Tensor& mrope) {
  const int64_t T = end - begin;
  Batch b;
  b.input_ids = at::empty({1, T}, at::kLong);
  b.labels = at::empty({1, T}, at::kLong);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto labels = b.labels.accessor<int64_t, 2>();
  for (int64_t t = 0; t < T; ++t) {
    ids[0][t] = s.input_ids[static_cast<size_t>(begin + t)];
    labels[0][t] = s.labels[static_cast<size_t>(begin + t)];
    if (labels[0][t] != kIgnoreIndex) ++b.label_tokens;
  }
  b.position_ids = mrope.defined() ? mrope.narrow(2, begin, T).contiguous() : at::arange(begin, end, at::kLong).unsqueeze(0);
  b.real_tokens = T;
  Sample images;  // the chunk's images, in order
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].begin >= begin && runs[r].end <= end) {
      images.pixel_values.push_back(s.pixel_values[r]);
      if (!s.image_grids.empty()) images.image_grids.push_back(s.image_grids[r]);
      if (!s.image_tokens.empty()) images.image_tokens.push_back(s.image_tokens[r]);
    }
  }
  ImageInputs inputs = batch_images({&images});  // [N, C, H, W] | [patches, C T P P] with grids
  b.pixel_values = std::move(inputs.pixel_values);
  b.image_grid_thw = std::move(inputs.image_grid_thw);
  return b;
}

// M-RoPE families: the whole sample's positions [3, 1, L] (undefined otherwise), computed once per sample.
at::Tensor mrope_of(const Sample& s, const ImageTokenLayout& images) {
  if (images.merge < 1) return {};
  const at::Tensor ids = at::tensor(std::vector<int64_t>(s.input_ids.begin(), s.input_ids.end()), at::kLong).view({1, -1});
  std::vector<int64_t> grids;
  for (const auto& g : s.image_grids) grids.insert(grids.end(), g.begin(), g.end());
  const at::Tensor thw = grids.empty() ? at::Tensor() : at::tensor(grids, at::kLong).view({-1, 3});
  return mrope_positions(ids, thw, {}, {}, images.id, images.merge).first;
}

}  // namespace

ChunkedBatch build_chunked_batch(const std::vector<const Sample*>& samples, int64_t chunk_size, int32_t pad_id,
                                 const ImageTokenLayout& images) {
  std::vector<int64_t> lengths;
  lengths.reserve(samples.size());
  for (const Sample* s : samples) lengths.push_back(static_cast<int64_t>(s->input_ids.size()));
  std::vector<std::vector<TokenSpan>> runs;  // per sample, its images' token spans (empty for text batches)
  const bool any_images =
      std::any_of(samples.begin(), samples.end(), [](const Sample* s) { return !s->pixel_values.empty(); });
  const bool counted = std::all_of(samples.begin(), samples.end(), [](const Sample* s) {
    return s->image_tokens.size() == s->pixel_values.size();
  });
  if (any_images || images.per_image > 0 || images.merge > 0) {
    if (images.per_image < 1 && images.merge < 1 && !counted) {
      fail<ConfigError>("ChunkFlow: the samples hold images, so chunking needs the model's image token id and "
                        "image_seq_length");
    }
    for (size_t i = 0; i < samples.size(); ++i) {
      if (images.per_image < 1) {  // each image's own count, as its processor said
        std::vector<int64_t> counts = samples[i]->image_tokens;
        if (counts.size() != samples[i]->pixel_values.size()) {
          if (images.merge < 1) {
            fail<ConfigError>("ChunkFlow: sample {} holds {} images without their token counts", i,
                              samples[i]->pixel_values.size());
          }
          counts.clear();
          for (const auto& g : samples[i]->image_grids) counts.push_back(g[0] * g[1] * g[2] / (images.merge * images.merge));
        }
        runs.push_back(image_token_runs(samples[i]->input_ids, images.id, counts));
      } else {
        runs.push_back(image_token_runs(samples[i]->input_ids, images));
      }
      if (runs.back().size() != samples[i]->pixel_values.size()) {
        fail<ConfigError>("ChunkFlow: sample {} holds {} image-token runs but {} images", i, runs.back().size(),
                          samples[i]->pixel_values.size());
      }
    }
  }
  static const std::vector<TokenSpan> kNone;
  ChunkedBatch out;
  for (const auto& group : plan_chunks(lengths, chunk_size, runs)) {
    if (group.dependent) {
      std::vector<Batch> chunks;
      for (const auto& chunk : group.chunks) {
        const ChunkSpan& span = chunk.front();
        const std::vector<TokenSpan>& sample_runs = runs.empty() ? kNone : runs[span.sample];
        chunks.push_back(slice_batch(*samples[span.sample], span.begin, span.end, sample_runs,
                                     mrope_of(*samples[span.sample], images)));
      }
      out.sequences.push_back(std::move(chunks));
    } else {
      std::vector<const Sample*> row;
      for (const auto& span : group.chunks.front()) row.push_back(samples[span.sample]);
      Batch b = collate_packed({row}, pad_id);
      if (row.size() == 1) b.segment_ids = at::Tensor();  // one sample: causal alone suffices
      out.standalone.push_back(std::move(b));
    }
  }
  for (const Sample* s : samples) {
    out.label_tokens += s->label_tokens();
    out.real_tokens += static_cast<int64_t>(s->input_ids.size());
  }
  return out;
}

int64_t chunkflow_forward_count(int64_t n, int64_t k) { return n + std::max<int64_t>(0, n - k); }

namespace {

struct ChunkGraph {
  at::Tensor loss;                     // summed token loss, attached to the chunk's graph
  std::vector<at::Tensor> keys, values;  // per layer, the chunk's K/V as its graph produced them
};

class SequenceRunner {
 public:
  SequenceRunner(const std::vector<Batch>& chunks, const ChunkLossFn& loss, double scale,
                 const ChunkFlowOptions& options, const at::Device& device, ChunkFlowCounters& counters)
      : chunks_(chunks), loss_(loss), scale_(scale), options_(options), counters_(counters),
        generator_(at::globalContext().defaultGenerator(device)) {}

  at::Tensor run() {
    const int64_t N = static_cast<int64_t>(chunks_.size());
    const int64_t K = std::min<int64_t>(std::max<int64_t>(1, options_.keep), N);
    leaf_keys_.assign(N, {});
    leaf_values_.assign(N, {});
    starts_.assign(N, 0);
    for (int64_t i = 1; i < N; ++i) starts_[i] = starts_[i - 1] + chunks_[i - 1].input_ids.size(1);
    std::vector<at::Tensor> rng(N);
    std::vector<ChunkGraph> kept(N);
    // Forward every chunk in order; only the last K keep their graphs.
    for (int64_t i = 0; i < N; ++i) {
      rng[i] = generator_.get_state();
      nn::ChunkKV state = state_for(i);
      if (i >= N - K) {
        kept[i].loss = loss_(chunks_[i], &state, true);
        add(kept[i].loss);
        kept[i].keys = state.keys;
        kept[i].values = state.values;
      } else {
        at::NoGradGuard no_grad;
        loss_(chunks_[i], &state, false);
      }
      ++counters_.forwards;
      if (i + 1 < N) store(i, state);
    }
    // Backward the kept chunks, last first.
    for (int64_t i = N - 1; i >= N - K; --i) {
      backward(i, kept[i]);
      kept[i] = ChunkGraph{};
    }
    // Recompute and back-propagate the others. Descending: chunk i's K/V gradients are complete only once every
    // later chunk has run its backward.
    const auto recompute = [&](int64_t i) {
      const at::Tensor now = generator_.get_state();
      generator_.set_state(rng[i]);
      nn::ChunkKV state = state_for(i);
      ChunkGraph graph;
      graph.loss = loss_(chunks_[i], &state, true);
      generator_.set_state(now);
      ++counters_.forwards;
      add(graph.loss);
      graph.keys = state.keys;
      graph.values = state.values;
      backward(i, graph);
    };
    if (options_.ascending_recompute) {
      for (int64_t i = 0; i < N - K; ++i) recompute(i);
    } else {
      for (int64_t i = N - K - 1; i >= 0; --i) recompute(i);
    }
    return loss_sum_;
  }

 private:
  nn::ChunkKV state_for(int64_t i) const {
    nn::ChunkKV state;
    state.past_length = starts_[i];
    if (i == 0) return state;
    const size_t layers = leaf_keys_[0].size();
    state.past_keys.assign(layers, {});
    state.past_values.assign(layers, {});
    for (size_t l = 0; l < layers; ++l) {
      for (int64_t j = 0; j < i; ++j) {
        state.past_keys[l].push_back(leaf_keys_[j][l]);
        state.past_values[l].push_back(leaf_values_[j][l]);
      }
    }
    return state;
  }

  // The chunk's K/V become leaves that later chunks read and leave their gradients on.
  void store(int64_t i, const nn::ChunkKV& state) {
    leaf_keys_[i].clear();
    leaf_values_[i].clear();
    for (size_t l = 0; l < state.keys.size(); ++l) {
      leaf_keys_[i].push_back(state.keys[l].detach().requires_grad_(true));
      leaf_values_[i].push_back(state.values[l].detach().requires_grad_(true));
    }
  }

  void add(const at::Tensor& loss) {
    if (!loss.defined()) return;
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
  }

  void backward(int64_t i, const ChunkGraph& graph) {
    std::vector<at::Tensor> roots{graph.loss}, seeds{at::full_like(graph.loss, scale_)};
    for (size_t l = 0; l < leaf_keys_[i].size(); ++l) {
      // A K/V that depends on nothing trainable (layer 0 when LoRA leaves k_proj alone) is no root.
      if (leaf_keys_[i][l].grad().defined() && graph.keys[l].requires_grad()) {
        roots.push_back(graph.keys[l]);
        seeds.push_back(leaf_keys_[i][l].grad());
      }
      if (leaf_values_[i][l].grad().defined() && graph.values[l].requires_grad()) {
        roots.push_back(graph.values[l]);
        seeds.push_back(leaf_values_[i][l].grad());
      }
    }
    torch::autograd::backward(roots, seeds);
    ++counters_.backwards;
    if (!options_.ascending_recompute) {  // no later chunk remains to read them
      leaf_keys_[i].clear();
      leaf_values_[i].clear();
    }
  }

  const std::vector<Batch>& chunks_;
  const ChunkLossFn& loss_;
  double scale_;
  const ChunkFlowOptions& options_;
  ChunkFlowCounters& counters_;
  at::Generator generator_;
  std::vector<std::vector<at::Tensor>> leaf_keys_, leaf_values_;  // [chunk][layer]
  std::vector<int64_t> starts_;
  at::Tensor loss_sum_;
};

}  // namespace

at::Tensor chunkflow_backward(const ChunkedBatch& batch, const ChunkLossFn& loss, double scale,
                              const ChunkFlowOptions& options, const at::Device& device, ChunkFlowCounters* counters) {
  ChunkFlowCounters local;
  ChunkFlowCounters& count = counters != nullptr ? *counters : local;
  at::Tensor sum;
  const auto add = [&](const at::Tensor& l) {
    if (l.defined()) sum = sum.defined() ? sum + l : l;
  };
  for (const Batch& chunk : batch.standalone) {
    ++count.chunks;
    if (chunk.label_tokens == 0) continue;
    const at::Tensor l = loss(chunk, nullptr, true);
    ++count.forwards;
    (l * scale).backward();
    ++count.backwards;
    add(l.detach());
  }
  for (const auto& chunks : batch.sequences) {
    count.chunks += static_cast<int64_t>(chunks.size());
    int64_t labels = 0;
    for (const auto& c : chunks) labels += c.label_tokens;
    if (labels == 0) continue;
    add(SequenceRunner(chunks, loss, scale, options, device, count).run());
  }
  return sum;
}

}  // namespace swiftcpp
