#include "models/registry.h"

#include "core/json.h"

namespace swiftcpp {

// Family specs, each defined in its file under models/.
ArchitectureSpec llama_spec();
ArchitectureSpec mistral_spec();
ArchitectureSpec qwen2_spec();
ArchitectureSpec qwen3_spec();
ArchitectureSpec gemma_spec();   // gemma.cpp
ArchitectureSpec gemma2_spec();  // gemma.cpp
ArchitectureSpec starcoder2_spec();
ArchitectureSpec phi_spec();    // phi.cpp
ArchitectureSpec phi3_spec();   // phi.cpp
ArchitectureSpec mixtral_spec();    // moe.cpp
ArchitectureSpec qwen2_moe_spec();  // moe.cpp
ArchitectureSpec llava_spec();  // vision-language: CLIP + projector + a text family above
ArchitectureSpec qwen2_vl_spec();    // qwen2_vl.cpp: dynamic-resolution ViT + merger + Qwen2 with M-RoPE
ArchitectureSpec qwen2_5_vl_spec();  // qwen2_vl.cpp
ArchitectureSpec llava_next_spec();  // llava_next.cpp: LLaVA's parts with anyres tiles and image_newline

const std::vector<ArchitectureSpec>& architectures() {
  static const std::vector<ArchitectureSpec> list = {
      llama_spec(),
      mistral_spec(),
      qwen2_spec(),
      qwen3_spec(),
      gemma_spec(),
      gemma2_spec(),
      starcoder2_spec(),
      phi_spec(),
      phi3_spec(),
      mixtral_spec(),
      qwen2_moe_spec(),
      llava_spec(),
      qwen2_vl_spec(),
      qwen2_5_vl_spec(),
      llava_next_spec(),
  };
  return list;
}

namespace {
std::string supported_list() {
  std::string out;
  for (const auto& spec : architectures()) {
    if (!out.empty()) out += ", ";
    out += spec.model_type + " (" + fmt::format("{}", fmt::join(spec.architectures, "/")) + ")";
  }
  return out;
}
}  // namespace

const ArchitectureSpec& find_architecture(const JsonObject& config) {
  if (config.has("model_type")) {
    const auto type = config.get<std::string>("model_type");
    for (const auto& spec : architectures()) {
      if (spec.model_type == type) return spec;
    }
    fail<ModelError>("{}: model_type '{}' is not supported; supported: {}", config.origin(), type, supported_list());
  }
  if (const std::vector<std::string> names = architecture_names(config); !names.empty()) {
    for (const auto& name : names) {
      for (const auto& spec : architectures()) {
        for (const auto& arch : spec.architectures) {
          if (name == arch) return spec;
        }
      }
    }
    fail<ModelError>("{}: architectures {} not supported; supported: {}", config.origin(),
                     describe_json(config.raw().at("architectures")), supported_list());
  }
  fail<ModelError>("{}: neither 'model_type' nor 'architectures' is set; supported: {}", config.origin(),
                   supported_list());
}

DecoderConfig load_decoder_config(const fs::path& model_dir) {
  const fs::path path = fs::is_directory(model_dir) ? model_dir / "config.json" : model_dir;
  if (!fs::exists(path)) fail<IoError>("'{}' not found: a model folder needs a Hugging Face config.json", path.string());
  const JsonObject json = JsonObject::load(path);
  const ArchitectureSpec& spec = find_architecture(json);
  DecoderConfig config = spec.parse_config(json);
  config.model_type = spec.model_type;
  config.validate(path.string());
  return config;
}

}  // namespace swiftcpp
