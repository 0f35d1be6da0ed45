#include "infer/generate.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "core/error.h"
#include "core/runtime.h"
#include "data/encode.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

namespace {

// Bytes at the end of `text` that might still grow into a stop string (or finish a UTF-8 character), and so
// must not be streamed yet.
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
  static const std::string replacement = "\xEF\xBF\xBD";  // an incomplete byte sequence decodes to U+FFFD
  if (text.size() >= replacement.size() &&
      text.compare(text.size() - replacement.size(), replacement.size(), replacement) == 0) {
    hold = std::max(hold, replacement.size());
  }
  return hold;
}

struct RowState {
  std::vector<int64_t> context;  // last prompt tokens, decoded in front of the new ones so spacing is right
  std::string context_text;
  size_t emitted = 0;
  bool finished = false;
};

// The ids that have text: a model may sample one of the embedding rows it has beyond its tokenizer's vocabulary
// (padding rows); those decode to nothing, as Hugging Face's fast tokenizers skip ids they do not know.
std::vector<int> text_ids(const TextTokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int> out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    if (tokenizer.knows(static_cast<int>(id))) out.push_back(static_cast<int>(id));
  }
  return out;
}

}  // namespace

Generator::Generator(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {}

std::vector<int64_t> Generator::encode_prompt(const std::string& text) const {
  const std::vector<int> ids = tokenize_rendered(*tokenizer_, text);
  if (!ids.empty()) return std::vector<int64_t>(ids.begin(), ids.end());
  if (!tokenizer_->specials().bos) {
    fail<ConfigError>("the prompt is empty and the tokenizer has no BOS token to start from");
  }
  return {static_cast<int64_t>(*tokenizer_->specials().bos)};
}

at::Tensor Generator::prompt_logits(const std::vector<int64_t>& prompt, const at::Tensor& pixel_values) {
  const int64_t context = model_->config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) > context) {
    fail<ConfigError>("the prompt has {} tokens, more than the model's context of {} positions (max_position_embeddings)",
                      prompt.size(), context);
  }
  c10::InferenceMode guard;
  const at::Tensor ids = at::tensor(prompt, at::kLong).view({1, -1}).to(model_->device());
  ForwardOptions options;
  if (pixel_values.defined() && pixel_values.numel() > 0) options.pixel_values = pixel_values.to(model_->device());
  return model_->forward(ids, options).squeeze(0).to(at::kCPU, at::kFloat);  // [T, V]
}

std::vector<GenerationResult> Generator::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const GenerationConfig& config, const TextCallback& on_text,
                                                  const std::vector<at::Tensor>& images) {
  if (prompts.empty()) return {};
  if (!images.empty() && images.size() != prompts.size()) {
    fail<ConfigError>("{} image lists given for {} prompts (one per prompt, empty for none)", images.size(),
                      prompts.size());
  }
  const int64_t image_id = model_->config().multimodal ? model_->config().multimodal->image_token_index : -1;
  if (config.max_new_tokens < 0) fail<ConfigError>("max_new_tokens must be >= 0, got {}", config.max_new_tokens);
  for (const auto& stop : config.stop_strings) {
    if (stop.empty()) fail<ConfigError>("stop strings must not be empty");
  }
  Sampler sampler(config.sampling);
  c10::InferenceMode guard;

  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t V = model_->config().vocab_size;
  const int64_t context = model_->config().max_position_embeddings;
  int64_t longest = 0, shortest = INT64_MAX;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    if (p.empty()) fail<ConfigError>("cannot generate from an empty token sequence (start from BOS)");
    if (static_cast<int64_t>(p.size()) > context) {
      fail<ConfigError>("prompt {} has {} tokens, more than the model's context of {} positions "
                        "(max_position_embeddings): shorten it", i, p.size(), context);
    }
    for (int64_t id : p) {
      if ((id < 0 || id >= V) && id != image_id) fail<ConfigError>("prompt token id {} is outside the vocabulary (0..{})", id, V - 1);
    }
    longest = std::max<int64_t>(longest, p.size());
    shortest = std::min<int64_t>(shortest, p.size());
  }
  // Prompt + new tokens never exceed the model's context: a row stops ("length") after
  // min(max_new_tokens, max_position_embeddings - its prompt length) new tokens.
  std::vector<int64_t> limit(B);
  int64_t most = 0;
  for (int64_t b = 0; b < B; ++b) {
    limit[b] = std::min<int64_t>(config.max_new_tokens, context - static_cast<int64_t>(prompts[b].size()));
    most = std::max(most, limit[b]);
  }
  if (config.max_new_tokens > context - shortest) {
    warn(fmt::format("max_new_tokens {} does not fit the model's context of {} positions (max_position_embeddings) "
                     "after a prompt of {} tokens: generation stops when prompt + new tokens reach {}",
                     config.max_new_tokens, context, shortest, context));
  }
  const bool padded = longest != shortest;
  const int64_t capacity = longest + std::max<int64_t>(most, 1);
  const at::Device device = model_->device();

  // Left padding: ids [B, L], key_valid [B, capacity], positions restart at 0 at each row's first real token.
  std::vector<int64_t> flat(B * longest, 0), pos(B * longest, 0), offsets(B);
  at::Tensor key_valid_cpu = at::ones({B, capacity}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[b];
    const int64_t pad = longest - static_cast<int64_t>(p.size());
    offsets[b] = pad;
    for (int64_t j = 0; j < static_cast<int64_t>(p.size()); ++j) {
      flat[b * longest + pad + j] = p[j];
      pos[b * longest + pad + j] = j;
    }
    if (pad > 0) key_valid_cpu[b].narrow(0, 0, pad).fill_(false);
  }
  const at::Tensor key_valid = padded ? key_valid_cpu.to(device) : at::Tensor();
  at::Tensor seen;
  if (config.sampling.repetition_penalty != 1.0) {
    seen = at::zeros({B, V}, at::kBool);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t id : prompts[b]) {
        if (id < V) seen[b][id] = true;
      }
    }
  }

  std::vector<GenerationResult> results(B);
  std::vector<RowState> rows(B);
  for (int64_t b = 0; b < B; ++b) {
    results[b].prompt_ids = prompts[b];
    const auto& p = prompts[b];
    // The last few prompt tokens, images left out (they are positions for features, not text).
    for (auto it = p.rbegin(); it != p.rend() && rows[b].context.size() < 8; ++it) {
      if (*it != image_id) rows[b].context.insert(rows[b].context.begin(), *it);
    }
    rows[b].context_text = tokenizer_->decode(text_ids(*tokenizer_, rows[b].context));
  }
  if (most == 0) {  // max_new_tokens 0, or every prompt fills the context
    for (auto& r : results) r.finish_reason = "length";
    return results;
  }

  nn::KVCache cache = model_->make_cache(B, capacity);
  ForwardOptions options;
  options.cache = &cache;
  options.last_token_only = true;
  if (padded) {
    options.position_ids = at::tensor(pos, at::kLong).view({B, longest}).to(device);
    options.key_valid = key_valid.narrow(1, 0, longest);
  }
  std::vector<at::Tensor> pixels;  // every prompt's images, in row order: [N, C, H, W]
  for (const auto& im : images) {
    if (im.defined() && im.numel() > 0) pixels.push_back(im);
  }
  if (!pixels.empty()) options.pixel_values = at::cat(pixels).to(device);
  at::Tensor logits = model_->forward(at::tensor(flat, at::kLong).view({B, longest}).to(device), options);

  std::vector<int64_t> next_pos(B);
  for (int64_t b = 0; b < B; ++b) next_pos[b] = static_cast<int64_t>(prompts[b].size());
  int64_t active = B;
  for (int64_t b = 0; b < B; ++b) {
    if (limit[b] > 0) continue;  // this prompt fills the context: nothing to generate
    rows[b].finished = true;
    results[b].finish_reason = "length";
    --active;
  }
  for (int64_t step = 0; step < most && active > 0; ++step) {
    const at::Tensor next = sampler.sample(logits.select(1, 0), seen);  // [B] int64 CPU
    const int64_t* next_ids = next.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      RowState& row = rows[b];
      if (row.finished) continue;
      GenerationResult& res = results[b];
      const int64_t id = next_ids[b];
      res.new_ids.push_back(id);
      if (seen.defined()) seen[b][id] = true;
      const bool is_eos = std::find(config.eos_ids.begin(), config.eos_ids.end(), id) != config.eos_ids.end();
      std::vector<int64_t> visible = row.context;
      visible.insert(visible.end(), res.new_ids.begin(), res.new_ids.end() - (is_eos ? 1 : 0));
      std::string text = tokenizer_->decode(text_ids(*tokenizer_, visible));
      text = text.compare(0, row.context_text.size(), row.context_text) == 0 ? text.substr(row.context_text.size())
                                                                             : tokenizer_->decode(text_ids(*tokenizer_, std::vector<int64_t>(res.new_ids.begin(), res.new_ids.end() - (is_eos ? 1 : 0))));
      size_t stop_at = std::string::npos;
      for (const auto& stop : config.stop_strings) {
        const size_t found = text.find(stop, row.emitted > stop.size() ? row.emitted - stop.size() : 0);
        if (found != std::string::npos) stop_at = std::min(stop_at, found);
      }
      if (stop_at != std::string::npos) {
        text.resize(stop_at);
        res.finish_reason = "stop";
      } else if (is_eos) {
        res.finish_reason = "eos";
      } else if (static_cast<int64_t>(res.new_ids.size()) >= limit[b]) {
        res.finish_reason = "length";
      }
      row.finished = !res.finish_reason.empty();
      const size_t safe = row.finished ? text.size() : text.size() - holdback(text, config.stop_strings);
      if (on_text && safe > row.emitted) on_text(static_cast<size_t>(b), text.substr(row.emitted, safe - row.emitted));
      row.emitted = std::max(row.emitted, safe);
      res.text = std::move(text);
      if (row.finished) --active;
    }
    if (active == 0 || step + 1 == most) break;
    ForwardOptions step_options;
    step_options.cache = &cache;
    step_options.last_token_only = true;
    if (padded) {
      step_options.position_ids = at::tensor(next_pos, at::kLong).view({B, 1}).to(device);
      step_options.key_valid = key_valid.narrow(1, 0, cache.length + 1);
      for (auto& p : next_pos) ++p;
    }
    logits = model_->forward(next.view({B, 1}).to(device), step_options);
  }
  return results;
}

}  // namespace swiftcpp
