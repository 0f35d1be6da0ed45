#include "infer/generate.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "core/error.h"
#include "core/runtime.h"
#include "infer/session.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

Generator::Generator(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {}

std::vector<int64_t> Generator::encode_prompt(const std::string& text) const {
  const std::vector<int> ids = encode_raw_prompt(*tokenizer_, text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

at::Tensor Generator::prompt_logits(const std::vector<int64_t>& prompt, const ImageInputs& images) {
  const int64_t context = model_->config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) > context) {
    fail<ConfigError>("the prompt has {} tokens, more than the model's context of {} positions (max_position_embeddings)",
                      prompt.size(), context);
  }
  c10::InferenceMode guard;
  const at::Tensor ids = at::tensor(prompt, at::kLong).view({1, -1}).to(model_->device());
  ForwardOptions options;
  if (!images.empty()) {
    options.pixel_values = images.pixel_values.to(model_->device());
    options.image_grid_thw = images.image_grid_thw;
  }
  return model_->forward(ids, options).squeeze(0).to(at::kCPU, at::kFloat);  // [T, V]
}

std::vector<GenerationResult> Generator::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const GenerationConfig& config, const TextCallback& on_text,
                                                  const std::vector<ImageInputs>& images,
                                                  const std::vector<at::Tensor>& image_features) {
  if (prompts.empty()) return {};
  if (!image_features.empty() && image_features.size() != prompts.size()) {
    fail<ConfigError>("{} image feature tensors given for {} prompts (one per prompt)", image_features.size(),
                      prompts.size());
  }
  if (!images.empty() && images.size() != prompts.size()) {
    fail<ConfigError>("{} image lists given for {} prompts (one per prompt, empty for none)", images.size(),
                      prompts.size());
  }
  if (config.max_new_tokens < 0) fail<ConfigError>("max_new_tokens must be >= 0, got {}", config.max_new_tokens);
  const int64_t context = model_->config().max_position_embeddings;
  int64_t longest = 0, shortest = INT64_MAX;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    if (p.empty()) fail<ConfigError>("cannot generate from an empty token sequence (start from BOS)");
    if (static_cast<int64_t>(p.size()) > context) {
      fail<ConfigError>("prompt {} has {} tokens, more than the model's context of {} positions "
                        "(max_position_embeddings): shorten it", i, p.size(), context);
    }
    longest = std::max<int64_t>(longest, p.size());
    shortest = std::min<int64_t>(shortest, p.size());
  }
  if (config.max_new_tokens > context - shortest) {
    warn(fmt::format("max_new_tokens {} does not fit the model's context of {} positions (max_position_embeddings) "
                     "after a prompt of {} tokens: generation stops when prompt + new tokens reach {}",
                     config.max_new_tokens, context, shortest, context));
  }
  // Cache rows sized for the longest prompt and its new tokens, never past the context.
  EngineOptions options;
  options.max_sequences = static_cast<int64_t>(prompts.size());
  options.max_model_len = std::min<int64_t>(context, longest + std::max<int64_t>(config.max_new_tokens, 1));
  Engine engine(model_, tokenizer_, options);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceRequest request;
    request.prompt = prompts[i];
    if (!images.empty()) {
      request.pixel_values = images[i].pixel_values;
      request.image_grid_thw = images[i].image_grid_thw;
    }
    if (!image_features.empty()) {
      request.image_features = image_features[i];
      if (image_features[i].defined()) request.pixel_values = at::Tensor();  // the features stand for them
    }
    request.config = config;
    ids.push_back(engine.add(std::move(request)));
  }
  std::vector<GenerationResult> results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) results[i].prompt_ids = prompts[i];
  while (engine.has_work()) {
    for (auto& update : engine.step()) {
      const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), update.id) - ids.begin());
      GenerationResult& r = results[i];
      r.new_ids.insert(r.new_ids.end(), update.new_ids.begin(), update.new_ids.end());
      r.text += update.text;
      if (!update.finish_reason.empty()) r.finish_reason = update.finish_reason;
      if (on_text && !update.text.empty()) on_text(i, update.text);
    }
  }
  return results;
}

}  // namespace swiftcpp
