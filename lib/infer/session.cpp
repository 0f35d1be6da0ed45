#include "infer/session.h"

#include <algorithm>

#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "models/registry.h"
#include "quant/gguf_model.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

SamplingParams generation_defaults(const fs::path& model_dir) {
  SamplingParams p;
  const fs::path gen = model_dir / "generation_config.json";
  if (!fs::exists(gen)) return p;
  const JsonObject g = JsonObject::load(gen);
  const bool do_sample = g.get_or<bool>("do_sample", true);
  p.temperature = do_sample ? g.get_or<double>("temperature", 1.0) : 0.0;
  p.top_k = g.get_or<int64_t>("top_k", 0);
  p.top_p = g.get_or<double>("top_p", 1.0);
  p.repetition_penalty = g.get_or<double>("repetition_penalty", 1.0);
  return p;
}

namespace {
ModelAssets assets_with(std::shared_ptr<const TextTokenizer> tokenizer, const fs::path& dir,
                        const std::string& chat_template, const MultimodalConfig* multimodal,
                        const vision::ImageProcessorOverrides& overrides) {
  ModelAssets a;
  a.tokenizer = std::move(tokenizer);
  a.assets_dir = dir;
  a.template_name = chat_template.empty() ? detect_chat_template(dir) : chat_template;
  if (a.template_name == "raw") a.template_name.clear();
  a.chat_template = chat_template_for(*a.tokenizer, a.template_name);
  if (multimodal != nullptr) a.images = make_image_encoding(dir, *multimodal, overrides);
  a.defaults = generation_defaults(dir);
  for (int id : a.tokenizer->specials().eos) a.eos_ids.push_back(id);
  return a;
}
}  // namespace

ModelAssets ModelAssets::open(const fs::path& dir, const std::string& chat_template, const MultimodalConfig* multimodal,
                              const vision::ImageProcessorOverrides& overrides) {
  return assets_with(load_tokenizer(dir), dir, chat_template, multimodal, overrides);
}

ModelAssets ModelAssets::open(const fs::path& dir, const std::string& chat_template,
                              const vision::ImageProcessorOverrides& overrides) {
  if (!fs::exists(dir / "config.json")) return open(dir, chat_template, nullptr, overrides);
  const DecoderConfig config = load_decoder_config(dir);
  return open(dir, chat_template, config.multimodal.get(), overrides);
}

ModelSession ModelSession::open(const SessionOptions& options) {
  ModelWithTokenizer loaded = load_model_with_tokenizer(options.model, options.tokenizer, options.load);
  ModelSession s;
  static_cast<ModelAssets&>(s) = assets_with(loaded.tokenizer, loaded.assets_dir, options.chat_template,
                                             loaded.model->config().multimodal.get(), options.images);
  s.model = loaded.model;
  s.encode.images = s.images;
  // A prompt may take the whole context; images are counted against it before any is decoded.
  s.encode.max_length = std::max<int64_t>(2, s.model->config().max_position_embeddings);
  return s;
}

std::vector<ChatMessage> ModelSession::conversation(std::vector<ChatMessage> turns, size_t images) const {
  std::vector<ChatMessage> messages;
  if (system) messages.push_back({"system", *system, std::nullopt});
  int64_t placeholders = 0;
  for (const auto& t : turns) placeholders += count_image_placeholders(t.content);
  if (images > 0 && placeholders == 0 && !turns.empty()) {
    std::string lead;
    for (size_t i = 0; i < images; ++i) lead += std::string(kImagePlaceholder) + "\n";
    turns.back().content = lead + turns.back().content;
  }
  messages.insert(messages.end(), turns.begin(), turns.end());
  return messages;
}

EncodedPrompt ModelSession::prompt(std::vector<ChatMessage> turns, const std::vector<fs::path>& images) const {
  const SampleEncoder encoder(tokenizer, chat_template, encode);
  return encoder.encode_prompt(conversation(std::move(turns), images.size()), images);
}

EncodedPrompt ModelSession::prompt(std::vector<ChatMessage> turns, std::vector<vision::EncodedImage> images) const {
  const SampleEncoder encoder(tokenizer, chat_template, encode);
  const size_t n = images.size();
  return encoder.encode_prompt(conversation(std::move(turns), n), std::move(images));
}

EncodedPrompt ModelSession::prompt(const std::string& text, const std::vector<fs::path>& images) const {
  if (chat() || !images.empty() || encode.images) {
    return prompt(std::vector<ChatMessage>{{"user", text, std::nullopt}}, images);
  }
  EncodedPrompt out;
  out.ids = encode_raw(text);
  return out;
}

std::vector<int> encode_raw_prompt(const TextTokenizer& tokenizer, const std::string& text) {
  std::vector<int> ids = tokenize_rendered(tokenizer, text);
  if (ids.empty()) {
    if (!tokenizer.specials().bos) {
      fail<ConfigError>("the prompt is empty and the tokenizer has no BOS token to start from");
    }
    ids.push_back(*tokenizer.specials().bos);
  }
  return ids;
}

}  // namespace swiftcpp
