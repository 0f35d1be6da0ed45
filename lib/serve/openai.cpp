#include "serve/openai.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>

#include "data/dataset.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::serve {

namespace {

constexpr int64_t kMaxChoices = 8;
constexpr size_t kMaxStops = 16;
constexpr int64_t kMaxTopLogprobs = 20;

// Typed field access with errors naming the field; null counts as absent, as in OpenAI's API.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}
  bool has(const char* key) const { return body_.contains(key) && !body_.at(key).is_null(); }
  const Json& at(const char* key) const { return body_.at(key); }

  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) const {
    if (!has(key)) return std::nullopt;
    const Json& v = at(key);
    if (!v.is_number()) bad_request(key, fmt::format("'{}' must be a number, got {}", key, describe_json(v)));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      bad_request(key, fmt::format("'{}' must be in {}{}, {}], got {}", key, lo_open ? "(" : "[", lo, hi, x));
    }
    return x;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key)) return std::nullopt;
    const Json& v = at(key);
    if (!v.is_number_integer()) bad_request(key, fmt::format("'{}' must be an integer, got {}", key, describe_json(v)));
    // Very large values do not fit int64: compare as double first.
    const double d = v.get<double>();
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      bad_request(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v.dump()));
    }
    return v.get<int64_t>();
  }
  std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    if (!at(key).is_boolean()) bad_request(key, fmt::format("'{}' must be true or false, got {}", key, describe_json(at(key))));
    return at(key).get<bool>();
  }

 private:
  const Json& body_;
};

// Message content: a string, or a list of text and image parts. An image part becomes the image placeholder in the
// text and an entry of `images`.
std::string message_content(const Json& content, size_t index, const std::string& role, std::vector<ImagePart>& images) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(param, fmt::format("'{}' must be a string or a list of parts, got {}", param, describe_json(content)));
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    if (!part.is_object() || !part.contains("type") || !part.at("type").is_string()) {
      bad_request(param, fmt::format("each part of '{}' must be an object with a string 'type'", param));
    }
    const std::string type = part.at("type").get<std::string>();
    if (type == "image_url") {
      const std::string where = fmt::format("{}[{}]", param, j);
      if (role != "user") bad_request(where, fmt::format("'{}': images may only be sent in user messages", where));
      const Json* url = part.contains("image_url") ? &part.at("image_url") : nullptr;
      if (url != nullptr && url->is_object()) url = url->contains("url") ? &url->at("url") : nullptr;
      if (url == nullptr || !url->is_string() || url->get<std::string>().empty()) {
        bad_request(where, fmt::format("'{}' needs 'image_url': {{\"url\": \"...\"}} with a non-empty url", where));
      }
      images.push_back({url->get<std::string>(), where});
      text += kImagePlaceholder;
      continue;
    }
    if (type != "text") {
      bad_request(param, fmt::format("'{}' has a part of type '{}': only text and image_url parts are supported", param,
                                     type));
    }
    if (!part.contains("text") || !part.at("text").is_string()) {
      bad_request(param, fmt::format("a text part of '{}' needs a string 'text'", param));
    }
    text += part.at("text").get<std::string>();
  }
  return text;
}

Json logprob_entry(const TextTokenizer& tokenizer, int64_t id, float logprob) {
  const std::string token = token_text(tokenizer, id);
  std::vector<int> bytes;
  for (unsigned char c : token) bytes.push_back(c);
  return Json{{"token", token}, {"logprob", logprob}, {"bytes", bytes}};
}

Json chat_logprobs(const std::vector<TokenLogprob>& logprobs, const TextTokenizer& tokenizer) {
  Json content = Json::array();
  for (const auto& lp : logprobs) {
    Json entry = logprob_entry(tokenizer, lp.id, lp.logprob);
    Json top = Json::array();
    for (const auto& [id, value] : lp.top) top.push_back(logprob_entry(tokenizer, id, value));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return Json{{"content", std::move(content)}};
}

Json completion_logprobs(const std::vector<TokenLogprob>& logprobs, const TextTokenizer& tokenizer, int64_t offset) {
  Json tokens = Json::array(), values = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& lp : logprobs) {
    const std::string token = token_text(tokenizer, lp.id);
    tokens.push_back(token);
    values.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [id, value] : lp.top) top[token_text(tokenizer, id)] = value;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(token.size());
  }
  return Json{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace

Json error_json(const ApiError& error) {
  return Json{{"error",
               {{"message", error.what()},
                {"type", error.type},
                {"param", error.param.empty() ? Json(nullptr) : Json(error.param)},
                {"code", error.code.empty() ? Json(nullptr) : Json(error.code)}}}};
}

void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", message, param);
}

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

CompletionRequest parse_completion_request(const std::string& body, bool chat, const SamplingParams& defaults) {
  if (!valid_utf8(body)) bad_request("", "the request body is not valid UTF-8");
  Json json;
  std::string error;
  if (!try_parse_json(body, json, error)) bad_request("", "the request body is not valid JSON: " + error);
  if (!json.is_object()) bad_request("", fmt::format("the request body must be a JSON object, got {}", describe_json(json)));
  const Fields f(json);
  CompletionRequest r;
  r.chat = chat;
  r.sampling = defaults;
  if (f.has("model")) {
    if (!f.at("model").is_string()) bad_request("model", fmt::format("'model' must be a string, got {}", describe_json(f.at("model"))));
    r.model = f.at("model").get<std::string>();
  }
  if (chat) {
    if (!f.has("messages")) bad_request("messages", "'messages' is required");
    const Json& messages = f.at("messages");
    if (!messages.is_array()) bad_request("messages", fmt::format("'messages' must be a list, got {}", describe_json(messages)));
    if (messages.empty()) bad_request("messages", "'messages' must hold at least one message");
    for (size_t i = 0; i < messages.size(); ++i) {
      const Json& m = messages[i];
      const std::string param = fmt::format("messages[{}]", i);
      if (!m.is_object()) bad_request(param, fmt::format("'{}' must be an object, got {}", param, describe_json(m)));
      if (!m.contains("role") || !m.at("role").is_string()) {
        bad_request(param + ".role", fmt::format("'{}.role' must be a string", param));
      }
      std::string role = m.at("role").get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant") {
        bad_request(param + ".role", fmt::format("'{}.role' must be system, developer, user or assistant, got '{}'",
                                                 param, m.at("role").get<std::string>()));
      }
      if (!m.contains("content") || m.at("content").is_null()) {
        bad_request(param + ".content", fmt::format("'{}.content' is required", param));
      }
      r.messages.push_back({role, message_content(m.at("content"), i, role, r.images), std::nullopt});
    }
  } else {
    if (!f.has("prompt")) bad_request("prompt", "'prompt' is required");
    const Json& p = f.at("prompt");
    const auto token_list = [&](const Json& list) {
      std::vector<int64_t> ids;
      for (const Json& t : list) {
        if (!t.is_number_integer()) bad_request("prompt", "a token-id prompt must hold integers only");
        // Unsigned values past 2^63 would wrap to negative ids.
        if (t.is_number_unsigned() ? t.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                                   : t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          bad_request("prompt", fmt::format("token id {} is not a token id (0..{})", t.dump(), INT32_MAX));
        }
        ids.push_back(t.get<int64_t>());
      }
      if (ids.empty()) bad_request("prompt", "'prompt' must not be an empty list");
      return ids;
    };
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
      r.prompt_ids = token_list(p[0]);
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      r.prompt_ids = token_list(p);
    } else {
      bad_request("prompt", fmt::format("'prompt' must be a string or a list of token ids (one prompt per request), "
                                        "got {}", describe_json(p)));
    }
  }
  if (f.has("response_format")) {
    const Json& rf = f.at("response_format");
    if (!rf.is_object() || !rf.contains("type") || !rf.at("type").is_string() || rf.at("type").get<std::string>() != "text") {
      bad_request("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
  }
  if (f.has("tools") && !(f.at("tools").is_array() && f.at("tools").empty())) {
    bad_request("tools", "tools (function calling) are not supported");
  }
  constexpr int64_t kBig = int64_t{1} << 40;
  if (auto v = f.integer("max_completion_tokens", 1, kBig)) r.max_tokens = *v;
  if (auto v = f.integer("max_tokens", 1, kBig)) r.max_tokens = *v;
  if (auto v = f.number("temperature", 0, 2)) r.sampling.temperature = *v;
  if (auto v = f.number("top_p", 0, 1, /*lo_open=*/true)) r.sampling.top_p = *v;
  if (auto v = f.integer("top_k", -1, kBig)) r.sampling.top_k = *v < 0 ? 0 : *v;
  if (auto v = f.number("min_p", 0, 1)) {
    if (*v >= 1) bad_request("min_p", fmt::format("'min_p' must be in [0, 1), got {}", *v));
    r.sampling.min_p = *v;
  }
  if (auto v = f.number("repetition_penalty", 0, 2, /*lo_open=*/true)) r.sampling.repetition_penalty = *v;
  if (auto v = f.number("presence_penalty", -2, 2)) r.sampling.presence_penalty = *v;
  if (auto v = f.number("frequency_penalty", -2, 2)) r.sampling.frequency_penalty = *v;
  if (f.has("seed")) {
    if (!f.at("seed").is_number_integer()) bad_request("seed", fmt::format("'seed' must be an integer, got {}", describe_json(f.at("seed"))));
    r.sampling.seed = f.at("seed").is_number_unsigned() ? f.at("seed").get<uint64_t>()
                                                        : static_cast<uint64_t>(f.at("seed").get<int64_t>());
    r.seeded = true;
  }
  if (f.has("stop")) {
    const Json& stop = f.at("stop");
    if (stop.is_string()) {
      r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > kMaxStops) bad_request("stop", fmt::format("'stop' may hold at most {} strings, got {}", kMaxStops, stop.size()));
      for (const Json& s : stop) {
        if (!s.is_string()) bad_request("stop", fmt::format("'stop' must hold strings, got {}", describe_json(s)));
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad_request("stop", fmt::format("'stop' must be a string or a list of strings, got {}", describe_json(stop)));
    }
    for (const auto& s : r.stop) {
      if (s.empty()) bad_request("stop", "stop strings must not be empty");
    }
  }
  if (auto v = f.integer("n", 1, kMaxChoices)) r.n = *v;
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (f.has("stream_options")) {
    const Json& so = f.at("stream_options");
    if (!so.is_object()) bad_request("stream_options", "'stream_options' must be an object");
    if (so.contains("include_usage") && !so.at("include_usage").is_null()) {
      if (!so.at("include_usage").is_boolean()) bad_request("stream_options.include_usage", "'stream_options.include_usage' must be true or false");
      r.include_usage = so.at("include_usage").get<bool>();
    }
  }
  if (chat) {
    const bool logprobs = f.boolean("logprobs").value_or(false);
    const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !logprobs) bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (logprobs) r.top_logprobs = top.value_or(0);
  } else if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) {
    r.top_logprobs = *v;
  }
  if (auto v = f.boolean("ignore_eos")) r.ignore_eos = *v;
  return r;
}

std::string token_text(const TextTokenizer& tokenizer, int64_t id) {
  if (!tokenizer.knows(static_cast<int>(id))) return "";
  return tokenizer.decode({static_cast<int>(id)});
}

std::string openai_finish_reason(const std::string& engine_reason) {
  return engine_reason == "length" ? "length" : "stop";
}

Json completion_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceState>& choices, int64_t prompt_tokens, const TextTokenizer& tokenizer) {
  Json list = Json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    completion_tokens += c.completion_tokens;
    Json choice = {{"index", i}, {"finish_reason", openai_finish_reason(c.finish_reason)}};
    if (request.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = request.top_logprobs >= 0 ? chat_logprobs(c.logprobs, tokenizer) : Json(nullptr);
    } else {
      choice["text"] = c.text;
      choice["logprobs"] = request.top_logprobs >= 0 ? completion_logprobs(c.logprobs, tokenizer, 0) : Json(nullptr);
    }
    list.push_back(std::move(choice));
  }
  return Json{{"id", id},
              {"object", request.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", std::move(list)},
              {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

Json chunk_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                int64_t index, bool role, const std::string& text, const std::vector<TokenLogprob>& logprobs,
                const std::string& finish_reason, const TextTokenizer& tokenizer) {
  Json choice = {{"index", index},
                 {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(openai_finish_reason(finish_reason))}};
  if (request.chat) {
    Json delta = Json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = request.top_logprobs >= 0 && !logprobs.empty() ? chat_logprobs(logprobs, tokenizer) : Json(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] = request.top_logprobs >= 0 && !logprobs.empty() ? completion_logprobs(logprobs, tokenizer, 0) : Json(nullptr);
  }
  Json chunk = {{"id", id},
                {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", Json::array({std::move(choice)})}};
  if (request.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

Json usage_chunk_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                      int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"id", id},
              {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", Json::array()},
              {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace swiftcpp::serve
