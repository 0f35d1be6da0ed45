// Mistral: Llama layout plus an optional sliding attention window.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_mistral(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.sliding_window = json.get_or<int64_t>("sliding_window", 0);
  if (c.sliding_window < 0) fail<ConfigError>("{}: sliding_window must be >= 0 or null", json.origin());
  return c;
}
}  // namespace

ArchitectureSpec mistral_spec() {
  return {"mistral", {"MistralForCausalLM"}, "Mistral (sliding window attention)", &parse_mistral};
}

}  // namespace swiftcpp
