// Conversations -> (input_ids, labels): the chat template renders the text, the tokenizer encodes it, and the
// template's trainable parts (assistant turns and their end-of-turn markers) become labels.
#pragma once

#include <memory>
#include <optional>

#include "data/collate.h"
#include "data/dataset.h"

namespace swiftcpp {

class TextTokenizer;

/// Tokenises rendered text exactly as training and inference both do: special-token strings become their ids,
/// and BOS is prepended when the tokenizer adds one and the text does not already start with it (chat templates
/// that write their own BOS string, as Hugging Face's apply_chat_template does). Throws like the tokenizer.
std::vector<int> tokenize_rendered(const TextTokenizer& tokenizer, const std::string& text);

/// The chat template `name` writing the tokenizer's own BOS/EOS strings (as Hugging Face passes bos_token and
/// eos_token to the Jinja template); null for "" or "raw" (raw text). Throws ConfigError for an unknown name.
std::shared_ptr<const ChatTemplate> chat_template_for(const TextTokenizer& tokenizer, const std::string& name);

enum class TruncationStrategy { kDelete, kLeft, kRight };
enum class LossScale { kDefault, kLastRound };

/// Parses "delete" | "left" | "right"; throws ConfigError listing the choices.
TruncationStrategy parse_truncation_strategy(const std::string& name);
/// Parses "default" | "last_round"; throws ConfigError listing the choices.
LossScale parse_loss_scale(const std::string& name);

struct EncodeOptions {
  int64_t max_length = 2048;
  TruncationStrategy truncation = TruncationStrategy::kDelete;
  LossScale loss_scale = LossScale::kDefault;  // default: every assistant turn; last_round: the last one only
};

/// Encodes conversations the way inference will see them: the exact text the template renders (byte-identical
/// to the Hugging Face chat template), tokenised as one string with special-token strings parsed, so training
/// and `swiftcpp infer` feed the model the same ids. Labels are shifted (labels[t] is what position t predicts)
/// and cover each trained assistant turn including its end-of-turn marker; a message with "loss": false (or
/// loss_weight 0) is not trained. Plain-text rows become [BOS] text [EOS] with every token trained.
class SampleEncoder {
 public:
  /// `chat_template` null means raw text (a base model without a chat template).
  SampleEncoder(std::shared_ptr<const TextTokenizer> tokenizer, std::shared_ptr<const ChatTemplate> chat_template,
                EncodeOptions options);

  /// The sample, or nullopt when it is longer than max_length and truncation is "delete", or when it has no
  /// trained token left (e.g. every assistant turn has loss false). Throws BadRowError for a conversation the
  /// template rejects.
  std::optional<Sample> encode(const Conversation& conversation) const;

  /// The ids of a prompt for generation: the rendered conversation (ending with a user turn) plus the
  /// template's generation prompt, tokenised exactly as encode() tokenises training text.
  std::vector<int> encode_prompt(const std::vector<ChatMessage>& messages) const;

  const EncodeOptions& options() const { return options_; }

 private:
  std::shared_ptr<const TextTokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> template_;
  EncodeOptions options_;
};

}  // namespace swiftcpp
