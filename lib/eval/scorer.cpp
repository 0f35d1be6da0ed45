#include "eval/scorer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/error.h"

namespace swiftcpp::eval {

namespace {

// Rows of hidden states pushed through the lm_head at once: bounds the [rows, V] logits buffer.
constexpr int64_t kLogitRows = 2048;

// log-softmax(logits)[target] per row and whether target is the argmax: hidden [N, D], targets [N] ->
// (logprob [N] float64, greedy [N] bool), both on the CPU.
std::pair<at::Tensor, at::Tensor> token_scores(CausalLM& model, const at::Tensor& hidden, const at::Tensor& targets) {
  std::vector<at::Tensor> logprobs, greedy;
  for (int64_t start = 0; start < hidden.size(0); start += kLogitRows) {
    const int64_t n = std::min(kLogitRows, hidden.size(0) - start);
    at::Tensor logits = model->logits(hidden.narrow(0, start, n));  // [n, V]
    if (logits.scalar_type() != at::kDouble) logits = logits.to(at::kFloat);  // float32 softmax for 16-bit models
    const at::Tensor t = targets.narrow(0, start, n).view({n, 1});
    const at::Tensor lp = at::log_softmax(logits, -1).gather(1, t).squeeze(1);            // [n]
    const at::Tensor best = logits.argmax(-1);                                            // [n]
    logprobs.push_back(lp.to(at::kCPU, at::kDouble));
    greedy.push_back(best.eq(t.squeeze(1)).to(at::kCPU));
  }
  return {at::cat(logprobs), at::cat(greedy)};
}

}  // namespace

Scorer::Scorer(CausalLM model, ScorerOptions options) : model_(std::move(model)), options_(options) {
  if (options_.batch_size < 1) fail<ConfigError>("batch size must be >= 1, got {}", options_.batch_size);
  const int64_t context = model_->config().max_position_embeddings;
  if (options_.max_length == 0) options_.max_length = context;
  if (options_.max_length < 2) fail<ConfigError>("max length must be >= 2, got {}", options_.max_length);
  if (options_.max_length > context) {
    fail<ConfigError>("max length {} exceeds the model's context of {} positions (max_position_embeddings); use at "
                      "most {}", options_.max_length, context, context);
  }
}

std::vector<std::vector<ContinuationScore>> Scorer::score(const std::vector<LoglikelihoodRequest>& requests,
                                                          const std::function<void(size_t)>& on_progress) {
  const int64_t V = model_->config().vocab_size;
  const MultimodalConfig* mm = model_->config().multimodal.get();
  const int64_t image_id = mm != nullptr ? mm->image_token_index : -1;  // may lie outside the text vocabulary
  // Checks the ids of one context or continuation; returns its image positions.
  auto check_ids = [&](const std::vector<int64_t>& ids, size_t index, const char* what) {
    if (ids.empty()) fail<ConfigError>("log-likelihood request {}: empty {}", index, what);
    int64_t images = 0;
    for (int64_t id : ids) {
      if (mm != nullptr && id == image_id) {
        ++images;
      } else if (id < 0 || id >= V) {
        fail<ConfigError>("log-likelihood request {}: token id {} outside the vocabulary (0..{})", index, id, V - 1);
      }
    }
    return images;
  };
  std::vector<int64_t> length(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const LoglikelihoodRequest& r = requests[i];
    const int64_t image_positions = check_ids(r.context, i, "context");
    const bool has_pixels = r.pixel_values.defined() && r.pixel_values.numel() > 0;
    if (has_pixels && mm == nullptr) {
      fail<ConfigError>("log-likelihood request {}: images given, but the {} model is a text model", i,
                        model_->config().model_type);
    }
    if (mm != nullptr) {
      int64_t expected = 0;
      if (has_pixels) {
        try {
          expected = model_->vision()->feature_rows(r.pixel_values, r.image_grid_thw);
        } catch (const ModelError& e) {
          fail<ConfigError>("log-likelihood request {}: {}", i, e.what());
        }
      }
      if (image_positions != expected) {
        fail<ConfigError>("log-likelihood request {}: the context holds {} image positions (id {}), but its images take "
                          "{}", i, image_positions, image_id, expected);
      }
    }
    if (r.continuations.empty()) fail<ConfigError>("log-likelihood request {}: no continuations", i);
    size_t longest = 0;
    for (const auto& c : r.continuations) {
      if (check_ids(c, i, "continuation") > 0) {
        fail<ConfigError>("log-likelihood request {}: a continuation holds the image token {}", i, image_id);
      }
      longest = std::max(longest, c.size());
    }
    if (static_cast<int64_t>(longest) > options_.max_length) {
      fail<ConfigError>("log-likelihood request {}: a continuation of {} tokens does not fit max length {}", i, longest,
                        options_.max_length);
    }
    // The cut score_batch makes must not reach an image's positions.
    const int64_t keep = std::min<int64_t>(r.context.size(), options_.max_length + 1 - static_cast<int64_t>(longest));
    if (image_positions > 0 && keep < static_cast<int64_t>(r.context.size()) &&
        std::find(r.context.begin(), r.context.end() - keep, image_id) != r.context.end() - keep) {
      fail<ConfigError>("log-likelihood request {}: the context of {} tokens must lose {} from the left to fit max length "
                        "{} with its longest continuation, which would cut into its images; raise the max length",
                        i, r.context.size(), r.context.size() - keep, options_.max_length);
    }
    length[i] = static_cast<int64_t>(r.context.size() + longest);
  }
  // Longest first (lm-eval's order: an out-of-memory shows at once), stable for equal lengths.
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length[a] > length[b]; });

  std::vector<std::vector<ContinuationScore>> results(requests.size());
  c10::InferenceMode guard;
  for (size_t start = 0; start < order.size(); start += options_.batch_size) {
    const size_t end = std::min(order.size(), start + static_cast<size_t>(options_.batch_size));
    std::vector<const LoglikelihoodRequest*> batch;
    std::vector<std::vector<ContinuationScore>*> out;
    for (size_t i = start; i < end; ++i) {
      batch.push_back(&requests[order[i]]);
      out.push_back(&results[order[i]]);
    }
    score_batch(batch, out);
    if (on_progress) on_progress(end);
  }
  return results;
}

void Scorer::score_batch(const std::vector<const LoglikelihoodRequest*>& batch,
                         std::vector<std::vector<ContinuationScore>*>& out) {
  const at::Device device = model_->device();
  const int64_t B = static_cast<int64_t>(batch.size());

  // Contexts, cut from the left so that context + longest continuation - 1 tokens fit max_length.
  std::vector<std::vector<int64_t>> contexts(B);
  int64_t Lc = 0, T2 = 0;
  for (int64_t b = 0; b < B; ++b) {
    size_t longest = 0;
    for (const auto& c : batch[b]->continuations) longest = std::max(longest, c.size());
    const auto& ctx = batch[b]->context;
    const int64_t keep = std::min<int64_t>(ctx.size(), options_.max_length + 1 - static_cast<int64_t>(longest));
    contexts[b].assign(ctx.end() - keep, ctx.end());
    Lc = std::max<int64_t>(Lc, keep);
    T2 = std::max<int64_t>(T2, static_cast<int64_t>(longest) - 1);
  }

  // Pass 1: contexts left-padded to Lc ([B, Lc]); positions restart at 0 on each row's first real token. The
  // last position's logits score every continuation's first token.
  std::vector<int64_t> ids(B * Lc, 0), pos(B * Lc, 0), pad(B);
  at::Tensor key_valid = at::ones({B, Lc + T2}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    pad[b] = Lc - static_cast<int64_t>(contexts[b].size());
    for (size_t j = 0; j < contexts[b].size(); ++j) {
      ids[b * Lc + pad[b] + j] = contexts[b][j];
      pos[b * Lc + pad[b] + j] = static_cast<int64_t>(j);
    }
    if (pad[b] > 0) key_valid[b].narrow(0, 0, pad[b]).fill_(false);
  }
  key_valid = key_valid.to(device);
  // The K/V cache only when some continuation needs a second pass (MMLU's one-token answers never do).
  std::optional<nn::KVCache> cache;
  if (T2 > 0) cache.emplace(model_->make_cache(B, Lc + T2));
  ForwardOptions first;
  first.cache = cache ? &*cache : nullptr;
  first.position_ids = at::tensor(pos, at::kLong).view({B, Lc}).to(device);
  first.key_valid = key_valid.narrow(1, 0, Lc);
  std::vector<at::Tensor> pixels, grids;  // the batch's images in row order, matching the order of their runs
  for (const LoglikelihoodRequest* r : batch) {
    if (r->pixel_values.defined() && r->pixel_values.numel() > 0) pixels.push_back(r->pixel_values);
    if (r->image_grid_thw.defined()) grids.push_back(r->image_grid_thw);
  }
  if (!pixels.empty()) first.pixel_values = at::cat(pixels).to(device);  // [N, C, H, W] | [patches, C T P P]
  if (!grids.empty()) first.image_grid_thw = at::cat(grids);              // [N, 3]
  const at::Tensor last_hidden = model_->hidden_states(at::tensor(ids, at::kLong).view({B, Lc}).to(device), first)
                                     .select(1, Lc - 1);  // [B, D]

  // Every continuation's first token against the context's last position.
  std::vector<int64_t> first_rows, first_targets;
  for (int64_t b = 0; b < B; ++b) {
    out[b]->assign(batch[b]->continuations.size(), ContinuationScore{});
    for (const auto& c : batch[b]->continuations) {
      first_rows.push_back(b);
      first_targets.push_back(c[0]);
    }
  }
  {
    const at::Tensor rows = at::tensor(first_rows, at::kLong).to(device);
    const auto [lp, greedy] = token_scores(model_, last_hidden.index_select(0, rows),
                                           at::tensor(first_targets, at::kLong).to(device));
    const double* l = lp.data_ptr<double>();
    const bool* g = greedy.data_ptr<bool>();
    size_t k = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (auto& s : *out[b]) {
        s.loglikelihood = l[k];
        s.greedy = g[k];
        ++k;
      }
    }
  }
  if (T2 == 0) return;

  // Pass 2: every continuation of more than one token, over a copy of its context's cache rows. Inputs are the
  // continuation without its last token, right-padded to T2 ([R, T2]); position t predicts token t + 1.
  std::vector<int64_t> row_of, ids2, pos2, targets, flat_index;
  std::vector<std::pair<int64_t, size_t>> owner;  // (b, j) per row
  int64_t R = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (size_t j = 0; j < batch[b]->continuations.size(); ++j) {
      const auto& c = batch[b]->continuations[j];
      if (c.size() < 2) continue;
      row_of.push_back(b);
      owner.emplace_back(b, j);
      for (int64_t t = 0; t < T2; ++t) {
        const bool real = t + 1 < static_cast<int64_t>(c.size());
        ids2.push_back(real ? c[t] : 0);
        pos2.push_back(static_cast<int64_t>(contexts[b].size()) + t);
        if (real) {
          targets.push_back(c[t + 1]);
          flat_index.push_back(R * T2 + t);
        }
      }
      ++R;
    }
  }
  const at::Tensor rows = at::tensor(row_of, at::kLong).to(device);
  nn::KVCache expanded = *cache;
  for (size_t l = 0; l < cache->keys.size(); ++l) {
    expanded.keys[l] = cache->keys[l].index_select(0, rows);
    expanded.values[l] = cache->values[l].index_select(0, rows);
  }
  if (!cache->position_offsets.empty()) {  // M-RoPE: each copied row keeps its context's offset
    expanded.position_offsets.assign(static_cast<size_t>(R), 0);
    for (int64_t r = 0; r < R; ++r) {
      const auto b = static_cast<size_t>(row_of[static_cast<size_t>(r)]);
      if (b < cache->position_offsets.size()) expanded.position_offsets[static_cast<size_t>(r)] = cache->position_offsets[b];
    }
  }
  cache.reset();  // the copies are all pass 2 reads
  at::Tensor valid2 = key_valid.index_select(0, rows).clone();  // [R, Lc + T2]
  {
    at::Tensor valid_cpu = at::ones({R, T2}, at::kBool);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t real = static_cast<int64_t>(batch[owner[r].first]->continuations[owner[r].second].size()) - 1;
      if (real < T2) valid_cpu[r].narrow(0, real, T2 - real).fill_(false);
    }
    valid2.narrow(1, Lc, T2).copy_(valid_cpu.to(device));
  }
  ForwardOptions second;
  second.cache = &expanded;
  second.position_ids = at::tensor(pos2, at::kLong).view({R, T2}).to(device);
  second.key_valid = valid2;
  const at::Tensor hidden = model_->hidden_states(at::tensor(ids2, at::kLong).view({R, T2}).to(device), second);
  const at::Tensor picked = hidden.reshape({R * T2, -1}).index_select(0, at::tensor(flat_index, at::kLong).to(device));
  const auto [lp, greedy] = token_scores(model_, picked, at::tensor(targets, at::kLong).to(device));
  const double* l = lp.data_ptr<double>();
  const bool* g = greedy.data_ptr<bool>();
  size_t k = 0;
  for (int64_t r = 0; r < R; ++r) {
    ContinuationScore& s = (*out[owner[r].first])[owner[r].second];
    const size_t n = batch[owner[r].first]->continuations[owner[r].second].size() - 1;
    for (size_t t = 0; t < n; ++t, ++k) {
      s.loglikelihood += l[k];
      s.greedy = s.greedy && g[k];
    }
  }
}

std::vector<LoglikelihoodRequest> rolling_windows(const std::vector<int64_t>& tokens, int64_t max_length, int64_t stride) {
  if (stride < 1 || stride > max_length) fail<ConfigError>("stride must be in [1, max length {}], got {}", max_length, stride);
  std::vector<LoglikelihoodRequest> windows;
  const int64_t N = static_cast<int64_t>(tokens.size());
  // Window targets [a, b); its input is tokens[max(0, b - 1 - max_length), b - 1): at most max_length tokens.
  for (int64_t a = 1; a < N;) {
    const int64_t b = std::min(N, a == 1 ? 1 + max_length : a + stride);
    const int64_t start = std::max<int64_t>(0, b - 1 - max_length);
    LoglikelihoodRequest w;
    w.context.assign(tokens.begin() + start, tokens.begin() + a);
    w.continuations.emplace_back(tokens.begin() + a, tokens.begin() + b);
    windows.push_back(std::move(w));
    a = b;
  }
  return windows;
}

}  // namespace swiftcpp::eval
