// The step-wise generation engine: sequences join and leave a running batch between decode steps (continuous
// batching). Each sequence owns a row of one preallocated KV cache, its positions, its sampler and seed, its stop
// strings and its incrementally decoded text; a step prefills newcomers (in chunks) and decodes every running
// sequence in one batched forward. One thread drives an Engine; nothing in it is shared with other threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "infer/sampling.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

class TextTokenizer;
class AdapterBank;

struct GenerationConfig {
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence of any
  std::vector<int64_t> eos_ids;           // generation ends on any of these (not included in the text)
};

/// One sequence to generate.
struct SequenceRequest {
  std::vector<int64_t> prompt;  // token ids, non-empty (image-token runs already expanded)
  at::Tensor pixel_values;      // vision-language models: the prompt's images [N, C, H, W]; undefined for none
  at::Tensor image_grid_thw;    // variable-size images: [N, 3] (pixel_values then [patches, C T P P])
  /// The vision tower's output for the prompt's images, computed beforehand ([N, F, D] or the rows of every image
  /// [M, D]; used instead of pixel_values, with image_grid_thw still giving variable-size images' grids), so a
  /// caller that shows one image to many prompts encodes it once. Base model only (adapter 0).
  at::Tensor image_features;
  GenerationConfig config;
  /// Log-probabilities of the model's own distribution (log_softmax of the logits, before penalties and
  /// sampling filters): -1 none; 0..20 the chosen token's and that many most likely tokens'.
  int64_t top_logprobs = -1;
  /// The LoRA adapter of EngineOptions::adapters this sequence runs with (0: the base model).
  int64_t adapter = 0;
};

struct TokenLogprob {
  int64_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int64_t, float>> top;  // most likely first
};

/// What one sequence produced in one step.
struct SequenceUpdate {
  uint64_t id = 0;
  std::vector<int64_t> new_ids;         // sampled this step (an ending EOS included)
  std::vector<TokenLogprob> logprobs;   // one per new id when asked for
  std::string text;                     // text that became final this step (held back while it may still turn
                                        // into a stop string or finish a UTF-8 character)
  std::string finish_reason;            // "" while running; "eos", "stop", "length" or "cancelled"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;        // generated so far (an ending EOS included)
};

struct EngineOptions {
  int64_t max_sequences = 8;      // sequences decoded together (KV cache rows)
  int64_t max_model_len = 0;      // positions per sequence, prompt included; 0: the model's max_position_embeddings
  int64_t prefill_chunk = 512;    // prompt tokens prefilled per step (a longer prompt takes several steps)
  /// Adapters sequences may choose (SequenceRequest::adapter); sequences of different adapters share a batch.
  std::shared_ptr<const AdapterBank> adapters;
};

class Engine {
 public:
  /// Throws ConfigError when an option is out of range.
  Engine(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Throws ConfigError on an empty prompt, a prompt longer than max_model_len, a token outside the vocabulary,
  /// bad sampling values, a negative max_new_tokens, an empty stop string, top_logprobs out of range or an adapter
  /// index the bank does not have; ModelError
  /// when images come for a text model. Reads only what never changes, so any thread may call it.
  void validate(const SequenceRequest& request) const;
  /// Validates (as validate()) and queues a sequence; returns its id.
  uint64_t add(SequenceRequest request);
  /// Ends a waiting or running sequence at the next step (finish reason "cancelled"); unknown ids are ignored.
  void cancel(uint64_t id);

  /// One step: frees finished and cancelled sequences, admits waiting ones into free rows, prefills up to
  /// prefill_chunk prompt tokens, and decodes every sequence that was running before the step in one forward.
  /// Returns an update for each sequence that produced something or ended (an ended one's last update carries its
  /// finish reason; it is then forgotten).
  std::vector<SequenceUpdate> step();

  bool has_work() const;
  int64_t running() const;  // sequences holding a cache row
  int64_t waiting() const;  // sequences queued for a row
  const EngineOptions& options() const { return options_; }
  CausalLM& model() { return model_; }
  const TextTokenizer& tokenizer() const { return *tokenizer_; }

 private:
  struct Sequence;
  void admit();
  void prefill(std::vector<SequenceUpdate>& updates);
  void decode(std::vector<SequenceUpdate>& updates);
  // Samples from logits [V] (float32 CPU) for `seq`, appends the token and its text to `update`.
  void accept(Sequence& seq, const at::Tensor& logits, SequenceUpdate& update);
  void release(Sequence& seq);
  // A forward with each batch row's adapter (0: none) selected.
  at::Tensor forward(const at::Tensor& ids, const ForwardOptions& options, const std::vector<int64_t>& adapters);

  // The vision features of `seq`'s images: encoded once for every sequence whose request carries the same
  // pixel tensor (a request's n choices) with the same adapter, kept while such a sequence may still prefill.
  at::Tensor image_features(const Sequence& seq);

  struct SharedFeatures {
    at::Tensor pixel_values;  // the requests' tensor itself (its identity is the key)
    int64_t adapter = 0;
    at::Tensor features;
  };

  CausalLM model_;
  std::shared_ptr<const TextTokenizer> tokenizer_;
  EngineOptions options_;
  std::vector<SharedFeatures> shared_features_;
  std::optional<nn::KVCache> cache_;        // allocated at the first admission
  std::vector<bool> row_used_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  uint64_t next_id_ = 1;
};

}  // namespace swiftcpp
