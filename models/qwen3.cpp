// Qwen3: Llama layout with a per-head RMSNorm on q and k before the rotary embedding.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_qwen3(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.qk_norm = true;
  if (json.get_or<bool>("use_sliding_window", false)) c.sliding_window = json.get_or<int64_t>("sliding_window", 0);
  return c;
}
}  // namespace

ArchitectureSpec qwen3_spec() {
  return {"qwen3", {"Qwen3ForCausalLM"}, "Qwen3 (per-head q/k RMSNorm)", &parse_qwen3};
}

}  // namespace swiftcpp
