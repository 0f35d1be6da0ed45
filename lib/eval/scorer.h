// Batched log-likelihood scoring: log P(continuation | context) for many (context, continuations) requests, with
// each context run through the model once and its K/V shared by all of its continuations.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/decoder/decoder.h"

namespace swiftcpp::eval {

/// One context and the continuations scored after it (lm-eval's loglikelihood requests sharing a context).
struct LoglikelihoodRequest {
  std::vector<int64_t> context;                     // at least one token (BOS or a prefix token for empty text)
  std::vector<std::vector<int64_t>> continuations;  // each at least one token
  /// Vision-language models: the context's images, [N, C, H, W] float (or the patch rows of variable-size images
  /// with their grids [N, 3]), one per run of image_token_index ids in `context` as long as the image's positions,
  /// in order; undefined for none. Continuations hold no image ids.
  at::Tensor pixel_values{};
  at::Tensor image_grid_thw{};
};

/// Score of one continuation: the sum of its tokens' log-probabilities (natural log, accumulated in float64) and
/// whether greedy decoding would have produced it (lm-eval's is_greedy).
struct ContinuationScore {
  double loglikelihood = 0;
  bool greedy = true;
};

struct ScorerOptions {
  int64_t batch_size = 8;    // requests per forward
  int64_t max_length = 0;    // model input length (0: the model's max_position_embeddings, as lm-eval's default);
                             // longer contexts lose their oldest tokens (as lm-eval does)
};

class Scorer {
 public:
  /// Resolves max_length 0 to the model's max_position_embeddings. Throws ConfigError when batch_size is not
  /// positive or max_length is below 2 or above max_position_embeddings (the model has no positions beyond).
  Scorer(CausalLM model, ScorerOptions options);

  /// Scores every request; results[i][j] belongs to requests[i].continuations[j]. Requests are run longest first
  /// in batches of batch_size: contexts left-padded in one forward that fills a K/V cache, then every continuation
  /// longer than one token in a second forward over that cache, with the lm_head applied only at the positions
  /// scored. A context is cut from the left so that context + longest continuation - 1 fits max_length.
  /// `on_progress(done)` is called after each batch with the number of requests finished. Images of a batch's
  /// contexts are encoded together in the contexts' forward. Throws ConfigError for an empty context or
  /// continuation, an id outside the vocabulary, a continuation longer than max_length, image ids on a text model,
  /// in a continuation or not matching pixel_values (image_seq_length per image), and a context whose cut from the
  /// left would remove image positions (an image never loses part of its run).
  std::vector<std::vector<ContinuationScore>> score(const std::vector<LoglikelihoodRequest>& requests,
                                                    const std::function<void(size_t)>& on_progress = {});

  const ScorerOptions& options() const { return options_; }

 private:
  void score_batch(const std::vector<const LoglikelihoodRequest*>& batch,
                   std::vector<std::vector<ContinuationScore>*>& out);

  CausalLM model_;
  ScorerOptions options_;
};

/// The token windows that score a whole document the way lm-eval's loglikelihood_rolling does when
/// `stride == max_length` (disjoint windows, each predicted token seeing the rest of its window) and the way the
/// Hugging Face perplexity guide does for smaller strides (each window re-reads max_length - stride tokens of the
/// previous one). `tokens[0]` (BOS, or the document's first token) is context only; every later token is predicted
/// exactly once. Throws ConfigError when stride is not in [1, max_length].
std::vector<LoglikelihoodRequest> rolling_windows(const std::vector<int64_t>& tokens, int64_t max_length, int64_t stride);

}  // namespace swiftcpp::eval
