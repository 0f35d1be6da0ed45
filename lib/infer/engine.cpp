#include "infer/engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "core/error.h"
#include "nn/row_adapters.h"
#include "peft/adapter_bank.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // an incomplete UTF-8 sequence decodes to U+FFFD

bool ends_with_replacement(const std::string& s) {
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}

// Bytes at the end of `text` that might still grow into a stop string, and so must not be streamed yet.
size_t holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& stop : stops) {
    for (size_t n = std::min(stop.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

struct Engine::Sequence {
  uint64_t id = 0;
  SequenceRequest request;
  std::unique_ptr<Sampler> sampler;
  int64_t limit = 0;   // new tokens at most
  int64_t row = -1;    // KV cache row while running
  int64_t filled = 0;  // positions written to the cache row
  std::vector<int64_t> new_ids;
  at::Tensor seen;    // [1, V] bool: prompt and generated tokens (repetition penalty)
  at::Tensor counts;  // [1, V] float: generated tokens (presence and frequency penalties)
  bool cancelled = false;
  std::string finish_reason;
  // Incremental detokenisation: `ids` are a few prompt tokens followed by the generated ones that have text;
  // decoding ids[prefix, read) and ids[prefix, end) and keeping the difference yields each token's text with the
  // spacing its neighbours give it, without decoding the whole sequence again.
  std::vector<int> ids;
  size_t prefix = 0, read = 0;
  std::string text;    // visible text so far (cut before a stop string once one is found)
  size_t emitted = 0;  // bytes of text handed out
};

Engine::Engine(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer, EngineOptions options)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), options_(options) {
  const int64_t context = model_->config().max_position_embeddings;
  if (options_.max_model_len == 0) options_.max_model_len = context;
  if (options_.max_sequences < 1) fail<ConfigError>("max_sequences must be >= 1, got {}", options_.max_sequences);
  if (options_.max_model_len < 1 || options_.max_model_len > context) {
    fail<ConfigError>("max_model_len must be in [1, {}] (the model's max_position_embeddings), got {}", context,
                      options_.max_model_len);
  }
  if (options_.prefill_chunk < 1) fail<ConfigError>("prefill_chunk must be >= 1, got {}", options_.prefill_chunk);
  row_used_.assign(options_.max_sequences, false);
}

Engine::~Engine() = default;

void Engine::validate(const SequenceRequest& request) const {
  const DecoderConfig& config = model_->config();
  const int64_t V = config.vocab_size;
  const int64_t image_id = config.multimodal ? config.multimodal->image_token_index : -1;
  const auto& prompt = request.prompt;
  if (prompt.empty()) fail<ConfigError>("cannot generate from an empty token sequence (start from BOS)");
  if (static_cast<int64_t>(prompt.size()) > options_.max_model_len) {
    fail<ConfigError>("the prompt has {} tokens, more than the {} positions a sequence may hold (max_model_len)",
                      prompt.size(), options_.max_model_len);
  }
  for (int64_t id : prompt) {
    // The image token may lie past the text vocabulary; for a text model there is none (image_id -1).
    if ((id < 0 || id >= V) && (image_id < 0 || id != image_id)) {
      fail<ConfigError>("prompt token id {} is outside the vocabulary (0..{})", id, V - 1);
    }
  }
  const bool has_features = request.image_features.defined() && request.image_features.numel() > 0;
  if (((request.pixel_values.defined() && request.pixel_values.numel() > 0) || has_features) && !config.multimodal) {
    fail<ModelError>("images were given, but this model ({}) takes text only", config.model_type);
  }
  if (has_features && request.adapter != 0) {
    fail<ConfigError>("precomputed image features are the base model's; a request with adapter {} needs pixel values",
                      request.adapter);
  }
  const GenerationConfig& gen = request.config;
  if (gen.max_new_tokens < 0) fail<ConfigError>("max_new_tokens must be >= 0, got {}", gen.max_new_tokens);
  for (const auto& stop : gen.stop_strings) {
    if (stop.empty()) fail<ConfigError>("stop strings must not be empty");
  }
  if (request.top_logprobs < -1 || request.top_logprobs > 20) {
    fail<ConfigError>("top_logprobs must be in [0, 20], got {}", request.top_logprobs);
  }
  const int64_t adapters = options_.adapters ? options_.adapters->size() : 0;
  if (request.adapter < 0 || request.adapter > adapters) {
    fail<ConfigError>("adapter {} does not exist (0 = the base model, 1..{} the loaded adapters)", request.adapter, adapters);
  }
  gen.sampling.validate();
}

uint64_t Engine::add(SequenceRequest request) {
  validate(request);
  const DecoderConfig& config = model_->config();
  const int64_t V = config.vocab_size;
  const int64_t image_id = config.multimodal ? config.multimodal->image_token_index : -1;
  const auto& prompt = request.prompt;
  const GenerationConfig& gen = request.config;
  auto seq = std::make_unique<Sequence>();
  seq->sampler = std::make_unique<Sampler>(gen.sampling);
  seq->id = next_id_++;
  seq->limit = std::min<int64_t>(gen.max_new_tokens, options_.max_model_len - static_cast<int64_t>(prompt.size()));
  const SamplingParams& s = gen.sampling;
  if (s.repetition_penalty != 1.0) {
    seq->seen = at::zeros({1, V}, at::kBool);
    bool* seen = seq->seen.data_ptr<bool>();
    for (int64_t id : prompt) {
      if (id >= 0 && id < V) seen[id] = true;
    }
  }
  if (s.presence_penalty != 0.0 || s.frequency_penalty != 0.0) seq->counts = at::zeros({1, V}, at::kFloat);
  // The last few prompt tokens with text lead the decoding window, so the first new token gets its spacing.
  for (auto it = prompt.rbegin(); it != prompt.rend() && seq->ids.size() < 8; ++it) {
    if (*it != image_id) seq->ids.insert(seq->ids.begin(), static_cast<int>(*it));
  }
  seq->ids.erase(std::remove_if(seq->ids.begin(), seq->ids.end(), [&](int id) { return !tokenizer_->knows(id); }),
                 seq->ids.end());
  seq->read = seq->ids.size();
  seq->request = std::move(request);
  const uint64_t id = seq->id;
  waiting_.push_back(std::move(seq));
  return id;
}

void Engine::cancel(uint64_t id) {
  for (auto& s : waiting_) {
    if (s->id == id) s->cancelled = true;
  }
  for (auto& s : running_) {
    if (s->id == id) s->cancelled = true;
  }
}

bool Engine::has_work() const { return !waiting_.empty() || !running_.empty(); }
int64_t Engine::running() const { return static_cast<int64_t>(running_.size()); }
int64_t Engine::waiting() const { return static_cast<int64_t>(waiting_.size()); }

void Engine::release(Sequence& seq) {
  if (seq.row >= 0) row_used_[seq.row] = false;
  seq.row = -1;
}

void Engine::admit() {
  while (!waiting_.empty()) {
    const auto free_row = std::find(row_used_.begin(), row_used_.end(), false);
    if (free_row == row_used_.end()) return;
    if (!cache_) cache_.emplace(model_->make_cache(options_.max_sequences, options_.max_model_len));
    std::unique_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    *free_row = true;
    seq->row = free_row - row_used_.begin();
    seq->filled = 0;
    running_.push_back(std::move(seq));
  }
}

void Engine::accept(Sequence& seq, const at::Tensor& logits, SequenceUpdate& update) {
  // logits: [V] float32 CPU, as the model gives them
  const GenerationConfig& config = seq.request.config;
  int64_t id;
  if (config.sampling.plain_greedy()) {
    id = logits.argmax().item<int64_t>();
  } else {
    id = seq.sampler->sample(logits.view({1, -1}), seq.seen, seq.counts)[0].item<int64_t>();
  }
  if (seq.request.top_logprobs >= 0) {
    const at::Tensor lp = logits.log_softmax(-1);
    TokenLogprob entry;
    entry.id = id;
    entry.logprob = lp[id].item<float>();
    if (seq.request.top_logprobs > 0) {
      const auto [values, indices] = lp.topk(std::min<int64_t>(seq.request.top_logprobs, lp.size(0)));
      for (int64_t i = 0; i < values.size(0); ++i) {
        entry.top.emplace_back(indices[i].item<int64_t>(), values[i].item<float>());
      }
    }
    update.logprobs.push_back(std::move(entry));
  }
  seq.new_ids.push_back(id);
  update.new_ids.push_back(id);
  if (seq.seen.defined()) seq.seen.data_ptr<bool>()[id] = true;
  if (seq.counts.defined()) seq.counts.data_ptr<float>()[id] += 1;
  const bool is_eos = std::find(config.eos_ids.begin(), config.eos_ids.end(), id) != config.eos_ids.end();
  const bool at_limit = static_cast<int64_t>(seq.new_ids.size()) >= seq.limit;
  // A token the tokenizer does not know (an embedding row beyond its vocabulary) decodes to nothing, as Hugging
  // Face's fast tokenizers skip ids they do not know.
  if (!is_eos && tokenizer_->knows(static_cast<int>(id))) seq.ids.push_back(static_cast<int>(id));
  const auto window = [&](size_t from, size_t to) {
    return tokenizer_->decode(std::vector<int>(seq.ids.begin() + from, seq.ids.begin() + to));
  };
  const bool ending = is_eos || at_limit;
  if (seq.read < seq.ids.size()) {
    const std::string before = window(seq.prefix, seq.read);
    const std::string after = window(seq.prefix, seq.ids.size());
    // Wait while the newest bytes do not yet form a whole character, unless the sequence ends here.
    if (after.size() > before.size() && (ending || !ends_with_replacement(after))) {
      seq.text += after.substr(before.size());
      seq.prefix = seq.read;
      seq.read = seq.ids.size();
    }
  }
  size_t stop_at = std::string::npos;
  for (const auto& stop : config.stop_strings) {
    const size_t found = seq.text.find(stop, seq.emitted > stop.size() ? seq.emitted - stop.size() : 0);
    if (found != std::string::npos) stop_at = std::min(stop_at, found);
  }
  if (stop_at != std::string::npos) {
    seq.text.resize(stop_at);
    seq.finish_reason = "stop";
  } else if (is_eos) {
    seq.finish_reason = "eos";
  } else if (at_limit) {
    seq.finish_reason = "length";
  }
  const bool finished = !seq.finish_reason.empty();
  const size_t safe = finished ? seq.text.size() : seq.text.size() - holdback(seq.text, config.stop_strings);
  if (safe > seq.emitted) update.text += seq.text.substr(seq.emitted, safe - seq.emitted);
  seq.emitted = std::max(seq.emitted, safe);
  update.finish_reason = seq.finish_reason;
  update.completion_tokens = static_cast<int64_t>(seq.new_ids.size());
}

void Engine::prefill(std::vector<SequenceUpdate>& updates) {
  int64_t budget = options_.prefill_chunk;
  for (auto& seq : running_) {
    const auto& prompt = seq->request.prompt;
    const int64_t total = static_cast<int64_t>(prompt.size());
    if (seq->filled >= total || seq->cancelled) continue;
    if (budget <= 0) break;
    const bool images = (seq->request.pixel_values.defined() && seq->request.pixel_values.numel() > 0) ||
                        (seq->request.image_features.defined() && seq->request.image_features.numel() > 0);
    // A prompt with images is prefilled whole: its image-token runs take the vision features in one forward.
    const int64_t n = images ? total : std::min(total - seq->filled, budget);
    const at::Device device = model_->device();
    const at::Tensor ids = at::tensor(std::vector<int64_t>(prompt.begin() + seq->filled, prompt.begin() + seq->filled + n),
                                      at::kLong).view({1, n}).to(device);
    cache_->rows = {seq->row};
    cache_->lengths = {seq->filled};
    ForwardOptions options;
    options.cache = &*cache_;
    options.last_token_only = true;
    if (images) {
      options.image_features = image_features(*seq);
      options.image_grid_thw = seq->request.image_grid_thw;
    }
    const at::Tensor logits = forward(ids, options, {seq->request.adapter});  // [1, 1, V]
    seq->filled += n;
    budget -= n;
    if (seq->filled < total) continue;
    SequenceUpdate update;
    update.id = seq->id;
    update.prompt_tokens = total;
    accept(*seq, logits.view({-1}).to(at::kCPU, at::kFloat), update);
    updates.push_back(std::move(update));
  }
}

at::Tensor Engine::image_features(const Sequence& seq) {
  const SequenceRequest& r = seq.request;
  if (r.image_features.defined() && r.image_features.numel() > 0) return r.image_features.to(model_->device());
  // Entries no sequence refers to any more (only this list holds their tensor) are dropped first.
  shared_features_.erase(std::remove_if(shared_features_.begin(), shared_features_.end(),
                                        [](const SharedFeatures& f) { return f.pixel_values.use_count() <= 1; }),
                         shared_features_.end());
  for (const SharedFeatures& f : shared_features_) {
    if (f.pixel_values.is_same(r.pixel_values) && f.adapter == r.adapter) return f.features;
  }
  const at::Tensor pixels = r.pixel_values.to(model_->device());
  at::Tensor features;
  if (r.adapter == 0) {
    features = model_->vision()->encode(pixels, r.image_grid_thw);
  } else {
    const std::unique_ptr<nn::RowAdapters> selection = options_.adapters->select({r.adapter});
    const nn::RowAdaptersScope scope(selection.get());
    features = model_->vision()->encode(pixels, r.image_grid_thw);
  }
  shared_features_.push_back({r.pixel_values, r.adapter, features});
  return features;
}

at::Tensor Engine::forward(const at::Tensor& ids, const ForwardOptions& options, const std::vector<int64_t>& adapters) {
  const bool any = std::any_of(adapters.begin(), adapters.end(), [](int64_t a) { return a != 0; });
  if (!any) return model_->forward(ids, options);
  const std::unique_ptr<nn::RowAdapters> selection = options_.adapters->select(adapters);
  const nn::RowAdaptersScope scope(selection.get());
  return model_->forward(ids, options);
}

void Engine::decode(std::vector<SequenceUpdate>& updates) {
  std::vector<Sequence*> batch;
  for (auto& seq : running_) {
    const bool prefilled = seq->filled >= static_cast<int64_t>(seq->request.prompt.size());
    if (prefilled && !seq->new_ids.empty() && seq->finish_reason.empty() && !seq->cancelled) batch.push_back(seq.get());
  }
  if (batch.empty()) return;
  std::sort(batch.begin(), batch.end(), [](const Sequence* a, const Sequence* b) { return a->row < b->row; });
  const int64_t B = static_cast<int64_t>(batch.size());
  std::vector<int64_t> last(B);
  cache_->rows.assign(B, 0);
  cache_->lengths.assign(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    last[b] = batch[b]->new_ids.back();
    cache_->rows[b] = batch[b]->row;
    cache_->lengths[b] = batch[b]->filled;
  }
  ForwardOptions options;
  options.cache = &*cache_;
  options.last_token_only = true;
  std::vector<int64_t> adapters(B);
  for (int64_t b = 0; b < B; ++b) adapters[b] = batch[b]->request.adapter;
  const at::Tensor logits = forward(at::tensor(last, at::kLong).view({B, 1}).to(model_->device()), options, adapters)
                                .view({B, -1})
                                .to(at::kCPU, at::kFloat);  // [B, V]
  for (int64_t b = 0; b < B; ++b) {
    Sequence& seq = *batch[b];
    seq.filled += 1;
    SequenceUpdate update;
    update.id = seq.id;
    update.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
    accept(seq, logits[b], update);
    updates.push_back(std::move(update));
  }
}

std::vector<SequenceUpdate> Engine::step() {
  c10::InferenceMode guard;
  std::vector<SequenceUpdate> updates;
  const auto ended = [&](Sequence& seq, const std::string& reason) {
    SequenceUpdate update;
    update.id = seq.id;
    update.finish_reason = reason;
    update.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
    update.completion_tokens = static_cast<int64_t>(seq.new_ids.size());
    updates.push_back(std::move(update));
  };
  // Cancelled sequences end first; so do waiting ones with nothing to generate (max_new_tokens 0, or a prompt that
  // fills max_model_len).
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled || (*it)->limit <= 0) {
      ended(**it, (*it)->cancelled ? "cancelled" : "length");
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->cancelled) {
      ended(**it, "cancelled");
      release(**it);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  admit();
  // Sequences running before this step decode in one forward; those whose prompt completes in this step's prefill
  // got their first token from it and join the next decode.
  std::vector<SequenceUpdate> decoded;
  decode(decoded);
  prefill(updates);
  updates.insert(updates.end(), std::make_move_iterator(decoded.begin()), std::make_move_iterator(decoded.end()));
  for (auto it = running_.begin(); it != running_.end();) {
    if (!(*it)->finish_reason.empty()) {
      release(**it);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return updates;
}

}  // namespace swiftcpp
