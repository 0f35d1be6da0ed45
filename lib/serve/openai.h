// The OpenAI API's request and response shapes for /v1/chat/completions and /v1/completions: strict decoding of
// a request body into typed fields (unknown fields ignored, wrong types and ranges refused naming the field), and
// the JSON of responses, stream chunks and errors.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/json.h"
#include "infer/engine.h"
#include "template/template.h"

namespace swiftcpp {
class TextTokenizer;
}

namespace swiftcpp::serve {

/// A request answered with an error: its HTTP status and OpenAI's error fields
/// ({"error": {"message", "type", "param", "code"}}).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, server_error, ...
  std::string param;  // the request field at fault ("" = none)
  std::string code;   // a machine-readable reason ("" = none)
};

/// {"error": {...}} for an ApiError (param and code null when empty).
Json error_json(const ApiError& error);
/// ApiError 400 invalid_request_error naming `param`.
[[noreturn]] void bad_request(const std::string& param, const std::string& message);

/// An image content part of a chat request ({"type": "image_url", "image_url": {"url": ...}}): its URL (a data:
/// URL, a file:// URL or path, or http(s)) and the request field it came from ("messages[1].content[2]"). Its
/// place in the message's text holds kImagePlaceholder.
struct ImagePart {
  std::string url;
  std::string param;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;                              // "" when not given
  std::vector<ChatMessage> messages;              // chat: the conversation
  std::vector<ImagePart> images;                  // chat: the image parts, in order of their placeholders
  std::string prompt;                             // completions: the prompt text ...
  std::optional<std::vector<int64_t>> prompt_ids;  // ... or its token ids
  std::optional<int64_t> max_tokens;              // unset: up to the end of the sequence's context
  SamplingParams sampling;                        // the model's defaults where the request is silent
  bool seeded = false;                            // `seed` given: choice i samples with seed + i
  std::vector<std::string> stop;
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int64_t top_logprobs = -1;   // -1: no logprobs; chat: logprobs true + top_logprobs; completions: logprobs k
  bool ignore_eos = false;     // vLLM's extension: generate past EOS
};

/// Decodes a request body (UTF-8 JSON) for /v1/chat/completions (`chat`) or /v1/completions. Fields not given
/// take `defaults` (the model's generation_config.json) or OpenAI's defaults. Throws ApiError 400 naming the field
/// for malformed JSON, invalid UTF-8, a missing or empty messages/prompt, an unknown role, a wrong type or a value
/// out of range (n 1..8, at most 16 non-empty stop strings, top_logprobs 0..20), and for response_format other
/// than text or any tools, which are not supported yet. Image parts ("image_url", its url as a string or
/// {"url": ...}) become kImagePlaceholder in their message's text and an entry of `images`; only user messages may
/// hold them, and other part types are refused.
CompletionRequest parse_completion_request(const std::string& body, bool chat, const SamplingParams& defaults);

/// One choice's outcome so far.
struct ChoiceState {
  std::string text;
  std::string finish_reason;  // the engine's; "eos" is reported as "stop"
  std::vector<TokenLogprob> logprobs;
  int64_t completion_tokens = 0;
};

/// The text a token id stands for in logprobs (its decoded text alone; "" for ids the tokenizer does not know).
std::string token_text(const TextTokenizer& tokenizer, int64_t id);

/// OpenAI's finish_reason for the engine's ("eos" and "stop" -> "stop", "length" -> "length").
std::string openai_finish_reason(const std::string& engine_reason);

/// A whole (non-streamed) response: chat.completion or text_completion with usage.
Json completion_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceState>& choices, int64_t prompt_tokens, const TextTokenizer& tokenizer);

/// One stream chunk for choice `index`: `role` (chat's first chunk), `text` delta, `logprobs` of the delta's
/// tokens, `finish_reason` ("" while running). With include_usage every chunk carries "usage": null.
Json chunk_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                int64_t index, bool role, const std::string& text, const std::vector<TokenLogprob>& logprobs,
                const std::string& finish_reason, const TextTokenizer& tokenizer);
/// The last chunk of a stream with include_usage: no choices, the usage.
Json usage_chunk_json(const CompletionRequest& request, const std::string& id, int64_t created, const std::string& model,
                      int64_t prompt_tokens, int64_t completion_tokens);

/// True when `s` is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

}  // namespace swiftcpp::serve
