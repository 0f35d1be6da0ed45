#include "data/encode.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace swiftcpp {

TruncationStrategy parse_truncation_strategy(const std::string& name) {
  if (name == "delete") return TruncationStrategy::kDelete;
  if (name == "left") return TruncationStrategy::kLeft;
  if (name == "right") return TruncationStrategy::kRight;
  fail<ConfigError>("truncation_strategy '{}' is not one of delete, left, right", name);
}

LossScale parse_loss_scale(const std::string& name) {
  if (name == "default") return LossScale::kDefault;
  if (name == "last_round") return LossScale::kLastRound;
  fail<ConfigError>("loss_scale '{}' is not one of default, last_round", name);
}

SampleEncoder::SampleEncoder(std::shared_ptr<const TextTokenizer> tokenizer,
                             std::shared_ptr<const ChatTemplate> chat_template, EncodeOptions options)
    : tokenizer_(std::move(tokenizer)), template_(std::move(chat_template)), options_(options) {
  if (options_.max_length < 2) fail<ConfigError>("max_length must be >= 2, got {}", options_.max_length);
}

std::shared_ptr<const ChatTemplate> chat_template_for(const TextTokenizer& tokenizer, const std::string& name) {
  if (name.empty() || name == "raw") return nullptr;
  TemplateTokens tokens;
  const auto& sp = tokenizer.specials();
  if (sp.bos) tokens.bos_token = tokenizer.id_to_piece(*sp.bos);
  if (!sp.eos.empty()) tokens.eos_token = tokenizer.id_to_piece(sp.eos.front());
  return make_chat_template(name, tokens);
}

std::vector<int> tokenize_rendered(const TextTokenizer& tokenizer, const std::string& text) {
  std::vector<int> ids = tokenizer.encode_with_special_tokens(text);
  const auto& sp = tokenizer.specials();
  if (sp.add_bos && sp.bos && (ids.empty() || ids.front() != *sp.bos)) ids.insert(ids.begin(), *sp.bos);
  return ids;
}

std::vector<int> SampleEncoder::encode_prompt(const std::vector<ChatMessage>& messages) const {
  if (!template_) {
    std::string text;
    for (const auto& m : messages) text += m.content;
    return tokenize_rendered(*tokenizer_, text);
  }
  return tokenize_rendered(*tokenizer_, template_->render_text(messages, /*add_generation_prompt=*/true));
}

std::optional<Sample> SampleEncoder::encode(const Conversation& c) const {
  std::vector<int> ids;
  std::vector<char> trained;  // per token
  std::string prefix;
  // Appends `text` to the rendered prefix. The whole prefix is tokenised again and the tokens past its common
  // part with what we had are the new text's, so every id is what tokenising the full text gives.
  auto append = [&](const std::string& text, bool train) {
    prefix += text;
    const std::vector<int> upto = tokenize_rendered(*tokenizer_, prefix);
    size_t common = 0;
    while (common < ids.size() && common < upto.size() && ids[common] == upto[common]) ++common;
    ids.resize(common);
    trained.resize(common);
    for (size_t j = common; j < upto.size(); ++j) {
      ids.push_back(upto[j]);
      trained.push_back(train ? 1 : 0);
    }
  };
  const auto& specials = tokenizer_->specials();
  auto append_eos = [&] {
    if (specials.eos.empty()) return;
    ids.push_back(specials.eos.front());
    trained.push_back(1);
  };

  if (c.format == RowFormat::kText) {
    append(c.text, true);
    append_eos();
  } else if (!template_) {
    // Raw text for a base model: the turns joined by newlines (separators untrained), trained where the
    // assistant speaks, then EOS.
    for (size_t i = 0; i < c.messages.size(); ++i) {
      const auto& m = c.messages[i];
      if (i > 0) append("\n", false);
      append(m.content, m.role == "assistant" && m.loss.value_or(true));
    }
    append_eos();
  } else {
    std::vector<TemplateSegment> segments;
    try {
      segments = template_->render(c.messages, /*add_generation_prompt=*/false);
    } catch (const ConfigError& e) {
      throw BadRowError(c.where, "rejected by the chat template", e.what());
    }
    // Runs of trainable segments map, in order, onto the assistant messages.
    std::vector<size_t> assistants;
    for (size_t i = 0; i < c.messages.size(); ++i) {
      if (c.messages[i].role == "assistant") assistants.push_back(i);
    }
    size_t run = 0;
    bool in_run = false;
    for (const auto& seg : segments) {
      if (seg.trainable && !in_run) ++run;
      in_run = seg.trainable;
      bool train = seg.trainable;
      if (train && run <= assistants.size()) {
        const ChatMessage& owner = c.messages[assistants[run - 1]];
        if (!owner.loss.value_or(true)) train = false;
        if (options_.loss_scale == LossScale::kLastRound && run != assistants.size()) train = false;
      }
      append(seg.text, train);
    }
  }

  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t begin = 0, end = n;
  if (n > options_.max_length) {
    if (options_.truncation == TruncationStrategy::kDelete) return std::nullopt;
    if (options_.truncation == TruncationStrategy::kLeft) begin = n - options_.max_length;
    else end = options_.max_length;
  }
  Sample s;
  s.input_ids.assign(ids.begin() + begin, ids.begin() + end);
  s.labels.assign(s.input_ids.size(), kIgnoreIndex);
  for (int64_t t = begin; t + 1 < end; ++t) {
    if (trained[t + 1]) s.labels[t - begin] = ids[t + 1];
  }
  if (s.label_tokens() == 0) return std::nullopt;
  return s;
}

}  // namespace swiftcpp
