// Qwen2 / Qwen2.5: Llama layout with biases on the q/k/v projections only.
#include "core/json.h"
#include "models/registry.h"

namespace swiftcpp {

namespace {
DecoderConfig parse_qwen2(const JsonObject& json) {
  DecoderConfig c = parse_llama_family_config(json);
  c.qkv_bias = true;
  if (json.get_or<bool>("use_sliding_window", false)) {
    c.sliding_window = json.get_or<int64_t>("sliding_window", 0);
    if (json.get_or<int64_t>("max_window_layers", c.num_hidden_layers) < c.num_hidden_layers) {
      fail<ConfigError>("{}: use_sliding_window with max_window_layers < num_hidden_layers (mixed per-layer "
                        "windows) is not supported", json.origin());
    }
  }
  return c;
}
}  // namespace

ArchitectureSpec qwen2_spec() {
  return {"qwen2", {"Qwen2ForCausalLM"}, "Qwen2 / Qwen2.5 (q/k/v bias)", &parse_qwen2};
}

}  // namespace swiftcpp
