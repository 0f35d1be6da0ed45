// Fuzzes the server's request decoder (lib/serve/openai, media): the bytes after the first as a request body for
// /v1/chat/completions (first byte even) or /v1/completions (odd), decoded into the OpenAI request types; the
// image parts of a chat request then opened as the server opens them (data: URLs decoded and their headers
// checked; file and remote URLs refused, as deploy does by default). A refusal is an ApiError (an HTTP 4xx with
// an OpenAI error body) or swiftcpp's typed error; anything else is a finding.
#include "fuzz_util.h"
#include "serve/media.h"
#include "serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  if (size == 0) return 0;
  const bool chat = data[0] % 2 == 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  (void)serve::valid_utf8(body);
  SamplingParams defaults;
  defaults.temperature = 0.7;
  try {
    fuzz::expect_clean([&] {
      const serve::CompletionRequest request = serve::parse_completion_request(body, chat, defaults);
      (void)request.messages.size();
      if (!request.images.empty()) {
        serve::MediaOptions media;
        media.max_images = 4;
        media.max_image_bytes = int64_t{1} << 20;
        media.max_pixels = 1 << 20;
        try {
          (void)serve::fetch_images(request.images, media);
        } catch (const serve::ApiError&) {
        }
      }
    });
  } catch (const serve::ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();  // a bad request is the client's fault, never a 5xx
  }
  return 0;
}
