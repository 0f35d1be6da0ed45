// LLaVA (LlavaForConditionalGeneration): a CLIP vision tower, a two-layer projector and any registered text
// family as the language model. Images enter as image_token_index positions replaced by projected CLIP features.
// The pieces LLaVA-NeXT shares (models/llava_next.cpp) are declared in models/llava_parts.h and defined here.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "core/json.h"
#include "models/decoder/decoder.h"
#include "models/llava_parts.h"
#include "models/registry.h"
#include "models/vision/clip.h"

namespace swiftcpp {

LlavaProjectorImpl::LlavaProjectorImpl(int64_t vision_hidden, int64_t text_hidden, std::string act, bool bias)
    : act_(std::move(act)) {
  linear_1 = register_module("linear_1", nn::Linear(vision_hidden, text_hidden, bias));
  linear_2 = register_module("linear_2", nn::Linear(text_hidden, text_hidden, bias));
}

at::Tensor LlavaProjectorImpl::forward(const at::Tensor& x) { return linear_2(apply_activation(act_, linear_1(x))); }

int64_t LlavaSettings::parameter_count() const {
  CheckedCount n;
  const int64_t projector = n.add(n.add(n.mul(vision.hidden_size, text_hidden), n.mul(text_hidden, text_hidden)),
                                  projector_bias ? 2 * text_hidden : 0);
  const int64_t tower = vision.parameter_count();
  const int64_t total = n.add(tower, projector);
  return n.overflow || tower < 0 ? -1 : total;
}

LlavaVisionEncoderImpl::LlavaVisionEncoderImpl(const LlavaSettings& s) : s_(s) {
  vision_tower = register_module("vision_tower", ClipVisionModel(s.vision));
  multi_modal_projector = register_module(
      "multi_modal_projector", LlavaProjector(s.vision.hidden_size, s.text_hidden, s.projector_act, s.projector_bias));
}

void LlavaVisionEncoderImpl::check_entries(const at::Tensor& pixel_values, const char* family) const {
  const int64_t size = s_.vision.image_size;
  if (pixel_values.dim() != 4 || pixel_values.size(1) != s_.vision.num_channels || pixel_values.size(2) != size ||
      pixel_values.size(3) != size) {
    fail<ModelError>("{} pixel_values must be [N, {}, {}, {}], got [{}]", family, s_.vision.num_channels, size, size,
                     fmt::join(pixel_values.sizes(), ", "));
  }
}

int64_t LlavaVisionEncoderImpl::feature_rows(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) const {
  if (image_grid_thw.defined()) fail<ModelError>("LLaVA images take no image_grid_thw (every image is one size)");
  check_entries(pixel_values, "LLaVA");
  return pixel_values.size(0) * s_.features_per_entry();
}

at::Tensor LlavaVisionEncoderImpl::encode(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) {
  (void)feature_rows(pixel_values, image_grid_thw);
  return project_entries(pixel_values);  // [N, F, D]
}

at::Tensor LlavaVisionEncoderImpl::project_entries(const at::Tensor& pixel_values) {
  // A frozen tower (freeze_vit) runs without autograd: nothing of it is kept for backward.
  bool tower_trains = false;
  for (const auto& p : vision_tower->parameters()) tower_trains = tower_trains || p.requires_grad();
  at::Tensor selected;  // [N, F, Dv]
  {
    // Profiler ranges named after the modules (free when no profiler or observer is active; pixel_values is
    // handed to observers that ask for inputs): bench/bench_mm_train.cpp splits a training step by them.
    RECORD_USER_SCOPE_WITH_INPUTS("vision_tower", std::vector<c10::IValue>{pixel_values});
    at::AutoGradMode grad(tower_trains && at::GradMode::is_enabled());
    const at::Tensor h = vision_tower->vision_model->hidden_state(pixel_values, s_.feature_layer);  // [N, 1+P, Dv]
    selected = s_.drop_cls ? h.narrow(1, 1, h.size(1) - 1) : h;
  }
  RECORD_USER_SCOPE("multi_modal_projector");
  return multi_modal_projector(selected);  // [N, F, D]
}

namespace {

// LlamaConfig's class defaults: transformers writes a nested text_config as a diff against them.
Json with_llama_defaults(const Json& text) {
  Json j = {{"model_type", "llama"},          {"vocab_size", 32000},           {"hidden_size", 4096},
            {"intermediate_size", 11008},     {"num_hidden_layers", 32},      {"num_attention_heads", 32},
            {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-6},         {"rope_theta", 10000.0},
            {"hidden_act", "silu"},           {"tie_word_embeddings", false}, {"attention_bias", false},
            {"bos_token_id", 1},              {"eos_token_id", 2}};
  for (auto it = text.begin(); it != text.end(); ++it) j[it.key()] = it.value();
  return j;
}

}  // namespace

LlavaParts parse_llava_parts(const JsonObject& json) {
  const std::string origin = json.origin();
  // The language model: text_config through its own family's spec.
  Json text = json.has("text_config") ? json.raw().at("text_config") : Json::object();
  if (!text.is_object()) fail<ConfigError>("{}: 'text_config' must be an object, got {}", origin, describe_json(text));
  const std::string text_type = text.contains("model_type") && text["model_type"].is_string()
                                    ? text["model_type"].get<std::string>() : "llama";
  if (text_type == "llama") text = with_llama_defaults(text);
  if (!text.contains("vocab_size") && json.has("vocab_size")) text["vocab_size"] = json.raw().at("vocab_size");
  const JsonObject text_json(text, origin + " (text_config)");
  const ArchitectureSpec& text_spec = find_architecture(text_json);
  if (text_spec.model_type == "llava" || text_spec.model_type == "llava_next") {
    fail<ConfigError>("{}: text_config cannot itself be a llava model", origin);
  }
  LlavaParts parts;
  parts.text = text_spec.parse_config(text_json);
  if (parts.text.multimodal) {
    fail<ConfigError>("{}: text_config ({}) cannot itself be a vision-language model", origin, text_spec.model_type);
  }

  LlavaSettings& s = parts.settings;
  const Json vision = json.has("vision_config") ? json.raw().at("vision_config") : Json::object();
  if (!vision.is_object()) {
    fail<ConfigError>("{}: 'vision_config' must be an object, got {}", origin, describe_json(vision));
  }
  s.vision = parse_clip_vision_config(JsonObject(vision, origin + " (vision_config)"));
  s.vision.validate(origin);
  s.text_hidden = parts.text.hidden_size;
  s.projector_act = json.get_or<std::string>("projector_hidden_act", "gelu");
  s.projector_bias = json.get_or<bool>("multimodal_projector_bias", true);
  (void)apply_activation(s.projector_act, at::zeros({1}));  // an unknown activation fails here, with its name
  if (json.has("vision_feature_layer") && json.raw().at("vision_feature_layer").is_array()) {
    fail<ConfigError>("{}: 'vision_feature_layer' as a list (features of several layers concatenated) is not "
                      "supported; give one layer index", origin);
  }
  s.feature_layer = json.get_or<int64_t>("vision_feature_layer", -2);
  if (s.feature_layer < -(s.vision.num_hidden_layers + 1) || s.feature_layer > s.vision.num_hidden_layers) {
    fail<ConfigError>("{}: 'vision_feature_layer' {} is out of range for a vision tower of {} layers", origin,
                      s.feature_layer, s.vision.num_hidden_layers);
  }
  const auto strategy = json.get_or<std::string>("vision_feature_select_strategy", "default");
  if (strategy != "default" && strategy != "full") {
    fail<ConfigError>("{}: 'vision_feature_select_strategy' must be 'default' or 'full', got '{}'", origin, strategy);
  }
  s.drop_cls = strategy == "default";

  parts.image_token_index = json.get_or<int64_t>("image_token_index", 32000);
  if (parts.image_token_index < 0 || parts.image_token_index >= kMaxVocabSize) {
    fail<ConfigError>("{}: 'image_token_index' must be in [0, {}), got {}", origin, kMaxVocabSize,
                      parts.image_token_index);
  }
  return parts;
}

namespace {

DecoderConfig parse_llava(const JsonObject& json) {
  const std::string origin = json.origin();
  LlavaParts parts = parse_llava_parts(json);
  DecoderConfig c = std::move(parts.text);
  c.model_type = "llava";
  c.architecture = "LlavaForConditionalGeneration";
  const LlavaSettings s = parts.settings;

  auto mm = std::make_shared<MultimodalConfig>();
  mm->image_token_index = parts.image_token_index;
  mm->image_seq_length = s.features_per_entry();
  if (json.has("image_seq_length") && json.get<int64_t>("image_seq_length") != mm->image_seq_length) {
    fail<ConfigError>("{}: 'image_seq_length' is {}, but the vision tower gives {} features per image", origin,
                      json.get<int64_t>("image_seq_length"), mm->image_seq_length);
  }
  mm->image_size = s.vision.image_size;
  mm->num_channels = s.vision.num_channels;
  mm->parameter_count = s.parameter_count();
  if (mm->parameter_count < 0) fail<ConfigError>("{}: the vision tower's parameter count overflows", origin);
  mm->make_encoder = [s]() -> std::shared_ptr<VisionEncoderImpl> {
    return std::make_shared<LlavaVisionEncoderImpl>(s);
  };
  c.multimodal = mm;
  return c;
}

}  // namespace

ArchitectureSpec llava_spec() {
  return {"llava", {"LlavaForConditionalGeneration"},
          "LLaVA 1.5 (CLIP vision tower + projector + any registered text family)", &parse_llava};
}

}  // namespace swiftcpp
