// Chat templates: a conversation rendered to exactly the text a family's Hugging Face Jinja chat template
// produces, cut into segments that say which characters are trained on (SFT labels).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fs.h"

namespace swiftcpp {

/// One message of a conversation. `role` is "system", "user" or "assistant"; tool roles ("tool", "ipython",
/// "function") and assistant tool calls are not supported and are rejected. `loss` overrides whether an
/// assistant turn is trained on (default: yes); on other roles only `false` is accepted (they are never trained).
struct ChatMessage {
  std::string role;
  std::string content;
  std::optional<bool> loss;
};

/// A piece of rendered text. `trainable` marks what the model writes in an assistant turn: the text from where
/// the generation prompt ends (the role header; for llama2 and llava the space after "[/INST]" / "ASSISTANT:")
/// through the content and its end-of-turn marker ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>",
/// " </s>" / "</s>", the EOS text for default and raw). System and user turns, role headers, BOS, the newline
/// after an end-of-turn marker, phi3's closing EOS and the generation prompt are not trainable.
struct TemplateSegment {
  std::string text;
  bool trainable;
};

/// The special-token texts a template writes, as Hugging Face passes the tokenizer's bos_token / eos_token to
/// the Jinja template. An unset field takes the family's own value ("<|begin_of_text|>" for llama3, "<bos>" for
/// gemma, "<s>"/"</s>" for llama2, mistral and llava, "<|endoftext|>" EOS for phi3, empty for default and raw).
struct TemplateTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

/// A chat-template family. Immutable; safe to share between threads.
class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;

  /// The name it was made under (see chat_template_names()).
  virtual const std::string& name() const = 0;

  /// Segments whose concatenated text equals the HF template's render of (messages, add_generation_prompt)
  /// byte for byte; neighbouring segments differ in `trainable` and none is empty. Throws ConfigError naming the
  /// template, the message index and the problem where the Jinja template raises (roles not alternating, a system
  /// message the family does not support), and also, deliberately, for an empty conversation, an unsupported
  /// role, or `loss: true` on a non-assistant message.
  virtual std::vector<TemplateSegment> render(const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) const = 0;

  /// The concatenated text of render(). Throws like render().
  std::string render_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
};

/// The template called `name` (one of chat_template_names()), writing `tokens` where the family writes BOS/EOS.
/// Throws ConfigError listing the valid names when `name` is unknown.
std::shared_ptr<const ChatTemplate> make_chat_template(const std::string& name, const TemplateTokens& tokens = {});

/// The known template names: chatml (no default system message), qwen2 (ChatML with "You are a helpful
/// assistant." when there is no system message), qwen2_5 (ChatML with Qwen2.5's default system message), llama3
/// (Llama 3.1/3.2), llama2, mistral (v0.1/v0.2 [INST] format), gemma (Gemma 1/2), phi3 (Phi-3.5), llava
/// (LLaVA-1.5's Vicuna v1 "USER: ... ASSISTANT: ...</s>" format), default (swiftcpp's "### User:" /
/// "### Assistant:" format for checkpoints without a template) and raw (contents concatenated, for base models).
/// docs/formats.md describes each. Does not throw.
std::vector<std::string> chat_template_names();

/// The template name for a checkpoint folder, from its chat template (chat_template.jinja, else
/// chat_template.json's "chat_template", else tokenizer_config.json's "chat_template": a string, or a list of
/// {name, template} of which the one named "default" is used) matched against the known families by their
/// markers ("<|im_start|>" -> chatml / qwen2 / qwen2_5 by the default system message, "<|start_header_id|>" ->
/// llama3, "<start_of_turn>" -> gemma, "<|assistant|>" with "<|end|>" -> phi3, "[INST]" with "<<SYS>>" -> llama2,
/// without -> mistral, "ASSISTANT:" with "USER: " -> llava). Without a chat template: "llava" when config.json's
/// model_type is "llava" (LLaVA-1.5 checkpoints often ship none), otherwise "" (raw text). Throws IoError when the
/// folder does not exist, FormatError when a file is malformed, ConfigError when a chat template exists but
/// matches no supported family or is a recognisably different variant of one (Qwen3 thinking, Llama 3.0, Gemma 3,
/// Mistral with tool calls); the message says that --template NAME overrides.
std::string detect_chat_template(const fs::path& model_dir);

}  // namespace swiftcpp
