#include "template/template.h"

#include <fmt/ranges.h>

#include <functional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/json.h"

namespace swiftcpp {

std::string ChatTemplate::render_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string text;
  for (const TemplateSegment& segment : render(messages, add_generation_prompt)) text += segment.text;
  return text;
}

namespace {

constexpr std::string_view kAlternate = "Conversation roles must alternate user/assistant/user/assistant/...";

// Python's str.isspace() code points: what Jinja's trim filter and str.strip() remove.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 code point starting at text[pos] into *cp and returns its length in bytes, or 0 when the
// bytes there are not a well-formed code point (such bytes are never whitespace).
size_t decode_utf8(std::string_view text, size_t pos, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  size_t length = 0;
  char32_t value = 0;
  if (lead < 0x80) return *cp = lead, 1;
  if ((lead & 0xE0) == 0xC0) length = 2, value = lead & 0x1F;
  else if ((lead & 0xF0) == 0xE0) length = 3, value = lead & 0x0F;
  else if ((lead & 0xF8) == 0xF0) length = 4, value = lead & 0x07;
  else return 0;
  if (pos + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(pos + i) & 0x3F);
  }
  *cp = value;
  return length;
}

// Python's str.strip() with no argument (Jinja's `trim` filter), on UTF-8 text.
std::string python_strip(std::string_view text) {
  size_t begin = 0;
  char32_t cp = 0;
  while (begin < text.size()) {
    const size_t n = decode_utf8(text, begin, &cp);
    if (n == 0 || !is_python_space(cp)) break;
    begin += n;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the lead byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    const size_t n = decode_utf8(text, start, &cp);
    if (n != end - start || !is_python_space(cp)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

bool is_trained(const ChatMessage& message) { return message.role == "assistant" && message.loss.value_or(true); }

// Builds the segment list: merges neighbours with the same flag and drops empty text.
class Segments {
 public:
  void add(std::string_view text, bool trainable) {
    if (text.empty()) return;
    if (!segments_.empty() && segments_.back().trainable == trainable) {
      segments_.back().text += text;
    } else {
      segments_.push_back({std::string(text), trainable});
    }
  }
  void text(std::string_view text) { add(text, false); }
  // header, then content + end-of-turn marker (trained when `trained`), then the text after the marker.
  void turn(std::string_view header, std::string_view content, std::string_view end, std::string_view after,
            bool trained) {
    text(header);
    add(content, trained);
    add(end, trained);
    text(after);
  }
  std::vector<TemplateSegment> take() { return std::move(segments_); }

 private:
  std::vector<TemplateSegment> segments_;
};

// What all families share: name, BOS/EOS texts, input checks, and the errors the Jinja templates raise.
class Family : public ChatTemplate {
 public:
  Family(std::string name, std::string bos, std::string eos)
      : name_(std::move(name)), bos_(std::move(bos)), eos_(std::move(eos)) {}

  const std::string& name() const override { return name_; }

  std::vector<TemplateSegment> render(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const final {
    if (messages.empty()) fail<ConfigError>("chat template '{}': the conversation has no messages", name_);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role != "system" && m.role != "user" && m.role != "assistant") {
        fail<ConfigError>("chat template '{}': message {} has role '{}'; supported roles are system, user and "
                          "assistant (tool messages are not supported)", name_, i, m.role);
      }
      if (m.role != "assistant" && m.loss.value_or(false)) {
        fail<ConfigError>("chat template '{}': message {} (role '{}') sets loss: true, but only assistant "
                          "messages are trained on", name_, i, m.role);
      }
    }
    Segments out;
    emit(messages, add_generation_prompt, out);
    return out.take();
  }

 protected:
  virtual void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const = 0;

  // The error the Jinja template raises, with where.
  [[noreturn]] void raise(const std::vector<ChatMessage>& messages, size_t index, std::string_view what) const {
    fail<ConfigError>("chat template '{}': {} (message {} has role '{}')", name_, what, index, messages[index].role);
  }
  // The families' alternation rule counted from `first`: user at even positions, any other role at odd ones.
  void check_alternates(const std::vector<ChatMessage>& messages, size_t index, size_t first) const {
    if ((messages[index].role == "user") != ((index - first) % 2 == 0)) raise(messages, index, kAlternate);
  }

  std::string name_;
  std::string bos_;
  std::string eos_;
};

// ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, with a default system message when the
// conversation does not start with one (Qwen2: "You are a helpful assistant.", Qwen2.5: its own; plain: none).
class ChatML : public Family {
 public:
  ChatML(std::string name, std::optional<std::string> default_system)
      : Family(std::move(name), "", ""), default_system_(std::move(default_system)) {}

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    if (default_system_ && messages[0].role != "system") {
      out.text("<|im_start|>system\n" + *default_system_ + "<|im_end|>\n");
    }
    for (const ChatMessage& m : messages) {
      out.turn("<|im_start|>" + m.role + "\n", m.content, "<|im_end|>", "\n", is_trained(m));
    }
    if (add_generation_prompt) out.text("<|im_start|>assistant\n");
  }

  std::optional<std::string> default_system_;
};

// Llama 3.1/3.2: BOS, a system header that always carries the knowledge-cutoff and date lines (the template's
// fixed fallback date; HF's newer strftime_now would write today's) then the first system message trimmed, then
// every other message as "<|start_header_id|>{role}<|end_header_id|>\n\n{trimmed}<|eot_id|>".
class Llama3 : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    const bool has_system = messages[0].role == "system";
    out.text(bos_ + "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
             "Today Date: 26 Jul 2024\n\n" + (has_system ? python_strip(messages[0].content) : "") + "<|eot_id|>");
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      out.turn("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", python_strip(m.content), "<|eot_id|>", "",
               is_trained(m));
    }
    if (add_generation_prompt) out.text("<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
};

// Gemma 1/2: no system message as the first turn, strict user/model alternation, contents trimmed.
class Gemma : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    if (messages[0].role == "system") raise(messages, 0, "System role not supported");
    out.text(bos_);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      check_alternates(messages, i, 0);
      const std::string role = m.role == "assistant" ? "model" : m.role;
      out.turn("<start_of_turn>" + role + "\n", python_strip(m.content), "<end_of_turn>", "\n", is_trained(m));
    }
    if (add_generation_prompt) out.text("<start_of_turn>model\n");
  }
};

// Phi-3.5: "<|{role}|>\n{content}<|end|>\n" per message (system messages only when non-empty), then the
// generation prompt or, without one, EOS.
class Phi3 : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    for (const ChatMessage& m : messages) {
      if (m.role == "system" && m.content.empty()) continue;
      out.turn("<|" + m.role + "|>\n", m.content, "<|end|>", "\n", is_trained(m));
    }
    out.text(add_generation_prompt ? "<|assistant|>\n" : eos_);
  }
};

// Llama-2-chat: "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>" per round; the
// system block is part of the first user content and each content is stripped; no generation prompt.
class Llama2 : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool, Segments& out) const override {
    const bool has_system = messages[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      check_alternates(messages, i, first);
      const std::string content =
          has_system && i == first ? "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + m.content : m.content;
      if (m.role == "user") {
        out.text(bos_ + "[INST] " + python_strip(content) + " [/INST]");
      } else if (m.role == "assistant") {
        // The space after "[/INST]" is trained: it is where the model starts writing (in sentencepiece it is
        // part of the answer's first token).
        out.turn("", " " + python_strip(content), " " + eos_, "", is_trained(m));
      }  // a system message at an assistant position is dropped, as the Jinja template does
    }
  }
};

// Mistral Instruct v0.1/v0.2: "<s>[INST] {user} [/INST]{assistant}</s>...", contents unchanged, strict
// user/assistant alternation, no system role; no generation prompt.
class Mistral : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool, Segments& out) const override {
    out.text(bos_);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      check_alternates(messages, i, 0);
      if (m.role == "user") {
        out.text("[INST] " + m.content + " [/INST]");
      } else if (m.role == "assistant") {
        out.turn("", m.content, eos_, "", is_trained(m));
      } else {
        raise(messages, i, "Only user and assistant roles are supported!");
      }
    }
  }
};

// swiftcpp's own format (tests/data/chat_templates/default.jinja): BOS, "{system}\n\n" (first message only),
// "### User:\n{user}\n\n", "### Assistant:\n{assistant}{EOS}\n\n"; generation prompt "### Assistant:\n".
class Default : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    out.text(bos_);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "system") {
        if (i != 0) raise(messages, i, "A system message is only allowed as the first message");
        out.text(m.content + "\n\n");
      } else if (m.role == "user") {
        out.text("### User:\n" + m.content + "\n\n");
      } else {
        out.turn("### Assistant:\n", m.content, eos_, "\n\n", is_trained(m));
      }
    }
    if (add_generation_prompt) out.text("### Assistant:\n");
  }
};

// No markup (tests/data/chat_templates/raw.jinja): BOS, then the contents in order, EOS after each assistant
// content; the generation prompt adds nothing.
class Raw : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool, Segments& out) const override {
    out.text(bos_);
    for (const ChatMessage& m : messages) {
      if (m.role == "assistant") {
        out.turn("", m.content, eos_, "", is_trained(m));
      } else {
        out.text(m.content);
      }
    }
  }
};

// LLaVA-1.5 (the Vicuna v1 conversation LLaVA was trained with, as llava-hf's model cards prompt it): BOS, a system
// message written as "{system} ", then "USER: {user} " and "ASSISTANT: {assistant}{EOS}" per turn, turns
// concatenated directly; generation prompt "ASSISTANT:". Images stay "<image>" placeholders in the user text.
class Llava : public Family {
 public:
  using Family::Family;

 private:
  void emit(const std::vector<ChatMessage>& messages, bool add_generation_prompt, Segments& out) const override {
    out.text(bos_);
    for (const ChatMessage& m : messages) {
      if (m.role == "system") {
        out.text(m.content + " ");
      } else if (m.role == "user") {
        out.text("USER: " + m.content + " ");
      } else {
        // The space after "ASSISTANT:" is trained, as llama2's after "[/INST]": in sentencepiece it is part of the
        // answer's first token.
        out.turn("ASSISTANT:", " " + m.content, eos_, "", is_trained(m));
      }
    }
    if (add_generation_prompt) out.text("ASSISTANT:");
  }
};

using Maker = std::function<std::shared_ptr<const ChatTemplate>(const std::string& bos, const std::string& eos)>;

struct FamilyEntry {
  const char* name;
  const char* bos;  // the family's own bos_token / eos_token texts
  const char* eos;
  Maker make;
};

template <typename T>
Maker maker(const char* name) {
  return [name](const std::string& bos, const std::string& eos) { return std::make_shared<T>(name, bos, eos); };
}

Maker chatml(const char* name, std::optional<std::string> default_system) {
  return [name, default_system](const std::string&, const std::string&) {
    return std::make_shared<ChatML>(name, default_system);
  };
}

// THE list of chat templates.
const std::vector<FamilyEntry>& families() {
  static const std::vector<FamilyEntry> list = {
      {"chatml", "", "<|im_end|>", chatml("chatml", std::nullopt)},
      {"qwen2", "", "<|im_end|>", chatml("qwen2", "You are a helpful assistant.")},
      {"qwen2_5", "", "<|im_end|>",
       chatml("qwen2_5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")},
      {"llama3", "<|begin_of_text|>", "<|eot_id|>", maker<Llama3>("llama3")},
      {"llama2", "<s>", "</s>", maker<Llama2>("llama2")},
      {"mistral", "<s>", "</s>", maker<Mistral>("mistral")},
      {"gemma", "<bos>", "<eos>", maker<Gemma>("gemma")},
      {"phi3", "<s>", "<|endoftext|>", maker<Phi3>("phi3")},
      {"llava", "<s>", "</s>", maker<Llava>("llava")},
      {"default", "", "", maker<Default>("default")},
      {"raw", "", "", maker<Raw>("raw")},
  };
  return list;
}

std::string joined_names() { return fmt::format("{}", fmt::join(chat_template_names(), ", ")); }

// The chat template held by a JSON value: a string, or a list of {name, template} (the one named "default").
std::optional<std::string> template_from_json(const Json& value, const std::string& origin) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) {
    fail<ConfigError>("{}: key 'chat_template' must be a string or a list of {{name, template}}, got {}", origin,
                      value.type_name());
  }
  std::vector<std::string> names;
  for (const Json& item : value) {
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("template") ||
        !item["template"].is_string()) {
      fail<ConfigError>("{}: each entry of 'chat_template' must be {{\"name\": string, \"template\": string}}, got {}",
                        origin, describe_json(item));
    }
    if (item["name"] == "default") return item["template"].get<std::string>();
    names.push_back(item["name"].get<std::string>());
  }
  fail<ConfigError>("{}: 'chat_template' lists templates named [{}] but none named 'default'; pass --template NAME "
                    "(one of {})", origin, fmt::join(names, ", "), joined_names());
}

// The family of a Jinja chat template, by its markers.
std::string classify(const std::string& text, const std::string& origin) {
  const auto has = [&](std::string_view marker) { return text.find(marker) != std::string::npos; };
  const auto unsupported = [&](std::string_view what) {
    fail<ConfigError>("{}: the chat template {}, so swiftcpp cannot reproduce it; pass --template NAME (one of {}) "
                      "to render with a known template instead", origin, what, joined_names());
  };
  if (has("<|im_start|>")) {
    if (has("<think>")) unsupported("is ChatML with <think> reasoning blocks (Qwen3 / QwQ style)");
    if (has("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")) return "qwen2_5";
    if (has("You are a helpful assistant.<|im_end|>")) return "qwen2";
    if (has("<|im_start|>system")) {
      unsupported("is ChatML with a default system message that is not Qwen2's or Qwen2.5's");
    }
    return "chatml";
  }
  if (has("<|start_header_id|>")) {
    if (!has("Cutting Knowledge Date")) unsupported("is Llama 3 without the dated system header (Llama 3.0 style)");
    return "llama3";
  }
  if (has("<start_of_turn>")) {
    if (!has("System role not supported")) unsupported("is Gemma with system-message support (Gemma 3 style)");
    return "gemma";
  }
  if (has("<|assistant|>") && has("<|end|>")) {
    if (has("bos_token")) unsupported("is Phi-3 style but writes a BOS, which Phi-3.5's template does not");
    return "phi3";
  }
  if (has("[INST]")) {
    if (has("<<SYS>>")) return "llama2";
    if (has("[AVAILABLE_TOOLS]") || has("[SYSTEM_PROMPT]") || has("system_message")) {
      unsupported("is a later Mistral format (system message or tool support)");
    }
    return "mistral";
  }
  // Vicuna v1 / LLaVA-1.5 roles, written out or as llava-hf's template spells them (role.upper() + ': ').
  if (has("ASSISTANT:") && (has("USER: ") || has(".upper() + ': '"))) return "llava";
  unsupported("matches none of the known families (ChatML, Llama 3, Llama 2, Mistral, Gemma, Phi-3, LLaVA)");
  return "";  // not reached
}

}  // namespace

std::shared_ptr<const ChatTemplate> make_chat_template(const std::string& name, const TemplateTokens& tokens) {
  for (const FamilyEntry& family : families()) {
    if (name == family.name) {
      return family.make(tokens.bos_token.value_or(family.bos), tokens.eos_token.value_or(family.eos));
    }
  }
  fail<ConfigError>("unknown chat template '{}'; known templates: {}", name, joined_names());
}

std::vector<std::string> chat_template_names() {
  std::vector<std::string> names;
  for (const FamilyEntry& family : families()) names.emplace_back(family.name);
  return names;
}

std::string detect_chat_template(const fs::path& model_dir) {
  if (!fs::is_directory(model_dir)) fail<IoError>("model folder {} does not exist", model_dir.string());
  std::optional<std::string> text;
  std::string origin;
  if (const fs::path path = model_dir / "chat_template.jinja"; fs::exists(path)) {
    text = read_text_file(path);
    origin = path.string();
  } else {
    for (const char* file : {"chat_template.json", "tokenizer_config.json"}) {
      const fs::path path = model_dir / file;
      if (!fs::exists(path)) continue;
      const JsonObject config = JsonObject::load(path);
      if (!config.raw().contains("chat_template")) continue;
      origin = config.origin();
      text = template_from_json(config.raw().at("chat_template"), origin);
      break;
    }
  }
  if (!text || text->empty()) {
    // LLaVA-1.5 checkpoints often ship no chat template: their config.json names the family.
    if (const fs::path path = model_dir / "config.json"; fs::exists(path)) {
      const JsonObject config = JsonObject::load(path);
      const Json& raw = config.raw();
      if (raw.contains("model_type") && raw.at("model_type") == Json("llava")) return "llava";
    }
    return "";
  }
  return classify(*text, origin);
}

}  // namespace swiftcpp
