// The front door for generation: one call opens a model with everything that turns a request into ids and
// sampling settings (tokenizer, chat template, image preprocessing, EOS ids, the checkpoint's sampling defaults).
// infer and the server open models through it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"
#include "data/encode.h"
#include "infer/sampling.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

class TextTokenizer;
class ChatTemplate;

struct SessionOptions {
  std::string model;          // Hugging Face folder, quantized folder or .gguf file
  std::string tokenizer;      // tokenizer folder of a .gguf model ("" = the file's folder)
  std::string chat_template;  // "" = the checkpoint's (raw text when it has none); "raw" = none
  LoadOptions load;
  vision::ImageProcessorOverrides images;  // min_pixels / max_pixels over the checkpoint's processor settings
};

/// Raw text tokenised as training does, never through a chat template: special-token strings parsed, BOS when the
/// tokenizer adds one; an empty text gives BOS alone. Throws ConfigError when the text is empty and the tokenizer
/// has no BOS.
std::vector<int> encode_raw_prompt(const TextTokenizer& tokenizer, const std::string& text);

/// The sampling defaults a checkpoint ships in generation_config.json (do_sample false means greedy), as Hugging
/// Face generate() and vLLM use them; SamplingParams' own defaults when the file is absent. Throws FormatError
/// naming the file when it is not valid JSON or a value has the wrong type.
SamplingParams generation_defaults(const fs::path& model_dir);

/// Everything but the weights that turns conversations, data rows and requests into model inputs for one
/// checkpoint folder: its tokenizer, chat template, image settings (vision-language models: the processor
/// preprocessor_config.json chooses, the image token and markup) and generation defaults. Every command opens these
/// through open(): infer and deploy (inside ModelSession), train, eval, data and quantize's calibration.
struct ModelAssets {
  /// The assets of `dir` (a Hugging Face folder): the tokenizer, the chat template `chat_template` ("" = the
  /// checkpoint's, raw text when it has none; "raw" = none), image settings when `multimodal` is set (with
  /// `overrides`), generation_config.json's sampling defaults and the tokenizer's EOS ids. Throws the loaders'
  /// errors, ConfigError for an unknown template name or bad image settings.
  static ModelAssets open(const fs::path& dir, const std::string& chat_template,
                          const MultimodalConfig* multimodal, const vision::ImageProcessorOverrides& overrides = {});
  /// The same, with the multimodal settings read from `dir`/config.json when it has one (text only otherwise).
  static ModelAssets open(const fs::path& dir, const std::string& chat_template,
                          const vision::ImageProcessorOverrides& overrides = {});

  std::shared_ptr<const TextTokenizer> tokenizer;
  fs::path assets_dir;                                // where tokenizer, template and generation_config.json came from
  std::string template_name;                          // the resolved name ("" for raw text)
  std::shared_ptr<const ChatTemplate> chat_template;  // null: raw text
  std::optional<ImageEncoding> images;                // vision-language models
  SamplingParams defaults;                            // generation_config.json's
  std::vector<int64_t> eos_ids;                       // the tokenizer's EOS ids
};

class ModelSession : public ModelAssets {
 public:
  /// Loads the model and tokenizer, picks the chat template (detected from the checkpoint unless named) and, for
  /// a vision-language model, its image preprocessing. Throws the loaders' errors, ConfigError for an unknown
  /// template name.
  static ModelSession open(const SessionOptions& options);

  bool chat() const { return chat_template != nullptr; }
  /// A conversation (system prompt first when set) rendered by the chat template with the generation prompt,
  /// encoded as training encodes it; images go with their `<image>` placeholders, or lead the last turn one per
  /// line when the text has none (as ms-swift does). Throws like SampleEncoder::encode_prompt.
  EncodedPrompt prompt(std::vector<ChatMessage> turns, const std::vector<fs::path>& images = {}) const;
  /// The same with images already read into memory (a request's image parts); errors name each image's origin.
  EncodedPrompt prompt(std::vector<ChatMessage> turns, std::vector<vision::EncodedImage> images) const;
  /// One text: a user turn through the chat template when there is one, else the raw text tokenised as training
  /// does (special-token strings parsed, BOS when the tokenizer adds one; an empty text gives BOS alone).
  /// Throws ConfigError when a raw text is empty and the tokenizer has no BOS.
  EncodedPrompt prompt(const std::string& text, const std::vector<fs::path>& images = {}) const;
  /// Raw text through encode_raw_prompt (a completion prompt, never through the chat template).
  std::vector<int> encode_raw(const std::string& text) const { return encode_raw_prompt(*tokenizer, text); }

  CausalLM model{nullptr};
  std::optional<std::string> system;  // system prompt put before every conversation
  EncodeOptions encode;               // with the image settings (ModelAssets::images) for a vision-language model

 private:
  // The system prompt, then `turns`; `images` images lead the last turn one per line when the turns hold no
  // placeholder.
  std::vector<ChatMessage> conversation(std::vector<ChatMessage> turns, size_t images) const;
};

}  // namespace swiftcpp
