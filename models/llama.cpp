// Llama 1, 2 and 3.x: the reference layout of the shared decoder.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_llama(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.mlp_bias = json.get_or<bool>("mlp_bias", false);  // attention_bias is read by the shared parser
  return c;
}
}  // namespace

ArchitectureSpec llama_spec() {
  return {"llama", {"LlamaForCausalLM"}, "Llama 1/2/3.x (rope_scaling linear and llama3)", &parse_llama};
}

}  // namespace swiftcpp
