// Generation of a fixed set of prompts to completion, on the step-wise Engine (infer/engine.h): each prompt is a
// sequence of its own (its own cache row, positions and sampler), decoded together with the others.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/collate.h"
#include "infer/engine.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

class TextTokenizer;

struct GenerationResult {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> new_ids;  // includes the EOS token when it ended the sequence
  std::string text;              // decoded new tokens, cut before a stop string
  std::string finish_reason;     // "eos" | "stop" | "length"
};

/// Called with (prompt index, newly visible text) as text becomes final while streaming.
using TextCallback = std::function<void(size_t, const std::string&)>;

class Generator {
 public:
  Generator(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer);

  /// Generates continuations of tokenised prompts (each non-empty), decoded together. Each prompt samples with its
  /// own generator seeded by config.sampling.seed, so its text does not depend on the others. A prompt and its
  /// new tokens never exceed the model's context: a row stops (finish reason "length") after
  /// min(max_new_tokens, max_position_embeddings - prompt length) new tokens, with a warning (core/runtime.h)
  /// when max_new_tokens is cut that way. Vision-language models take `images`: per prompt, its images (empty for
  /// none: pixel values [N_i, C, H, W], or patch rows with their grids), matching the prompt's image-token runs
  /// (ids already expanded); the images are encoded once, in the prefill. `image_features`, when given (one per
  /// prompt, undefined for none), holds each prompt's images already through the vision tower
  /// (SequenceRequest::image_features); `images` then still gives variable-size images' grids. Throws ConfigError
  /// on bad settings, an empty prompt or a prompt longer than max_position_embeddings, ModelError when images do
  /// not fit the prompts or the model.
  std::vector<GenerationResult> generate(const std::vector<std::vector<int64_t>>& prompts,
                                         const GenerationConfig& config, const TextCallback& on_text = {},
                                         const std::vector<ImageInputs>& images = {},
                                         const std::vector<at::Tensor>& image_features = {});

  /// Raw `text` as encode_raw_prompt (infer/session.h) tokenises it.
  std::vector<int64_t> encode_prompt(const std::string& text) const;

  /// Full logits of one prompt without a cache: [T, V] float32 on the CPU; a vision-language model takes the
  /// prompt's images. Throws ConfigError when the prompt is longer than max_position_embeddings.
  at::Tensor prompt_logits(const std::vector<int64_t>& prompt, const ImageInputs& images = {});

  CausalLM& model() { return model_; }
  const TextTokenizer& tokenizer() const { return *tokenizer_; }

 private:
  CausalLM model_;
  std::shared_ptr<const TextTokenizer> tokenizer_;
};

}  // namespace swiftcpp
