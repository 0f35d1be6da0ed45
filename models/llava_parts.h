// What LLaVA-1.5 (models/llava.cpp) and LLaVA-NeXT (models/llava_next.cpp) share: the two-layer projector, the
// CLIP tower + projector encoder, and the config.json parts both read (the text part through its own family's
// spec, vision_config, the projector, the feature layer and strategy, the image token).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "models/decoder/decoder.h"
#include "models/vision/clip.h"
#include "nn/layers.h"

namespace swiftcpp {

class JsonObject;

/// `multi_modal_projector`: linear_1 (vision hidden -> text hidden), activation, linear_2 (text -> text).
class LlavaProjectorImpl : public torch::nn::Module {
 public:
  LlavaProjectorImpl(int64_t vision_hidden, int64_t text_hidden, std::string act, bool bias);
  /// [N, F, Dv] -> [N, F, D]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear linear_1{nullptr}, linear_2{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(LlavaProjector);

/// The vision side of a LLaVA config.json.
struct LlavaSettings {
  ClipVisionConfig vision;
  int64_t text_hidden = 0;
  std::string projector_act = "gelu";
  bool projector_bias = true;
  int64_t feature_layer = -2;
  bool drop_cls = true;  // vision_feature_select_strategy "default"; "full" keeps the CLS row

  /// Features per image entry: the patches, plus the CLS row with strategy "full".
  int64_t features_per_entry() const { return vision.num_patches() + (drop_cls ? 0 : 1); }
  /// Parameters of the tower and projector (-1 when the count overflows).
  int64_t parameter_count() const;
};

/// LLaVA-1.5's encoder: every image is one entry [C, S, S] through the CLIP tower (hidden state of
/// feature_layer, CLS dropped with strategy "default") and the projector. Modules `vision_tower` and
/// `multi_modal_projector`, as Hugging Face names them.
class LlavaVisionEncoderImpl : public VisionEncoderImpl {
 public:
  explicit LlavaVisionEncoderImpl(const LlavaSettings& s);

  /// pixel_values [N, C, S, S] (no image_grid_thw) -> N * features_per_entry. Throws ModelError on other shapes.
  int64_t feature_rows(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) const override;
  /// pixel_values [N, C, S, S] -> [N, F, D]. Throws as feature_rows does.
  at::Tensor encode(const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) override;

  /// The tower and projector on entries whose shape the caller has checked: [N, C, S, S] -> [N, F, D]. A frozen
  /// tower runs without autograd; profiler ranges are named vision_tower and multi_modal_projector.
  at::Tensor project_entries(const at::Tensor& pixel_values);
  /// Throws ModelError unless pixel_values is [N, C, S, S] for this tower; `family` names the model in messages.
  void check_entries(const at::Tensor& pixel_values, const char* family) const;

  ClipVisionModel vision_tower{nullptr};
  LlavaProjector multi_modal_projector{nullptr};

 protected:
  LlavaSettings s_;
};

/// The parts of a LLaVA-style config.json: the language model (text_config through its own family's spec, with
/// LlamaConfig's class defaults for a llama text_config), the vision settings and the image token.
struct LlavaParts {
  DecoderConfig text;
  LlavaSettings settings;
  int64_t image_token_index = 32000;
};

/// Reads the parts above from `json` (keys: text_config, vision_config, projector_hidden_act,
/// multimodal_projector_bias, vision_feature_layer, vision_feature_select_strategy, image_token_index,
/// vocab_size). Throws ConfigError naming the file and key: a text_config that is not an object or is itself a
/// vision-language model, a bad vision_config, an unknown activation, a feature layer out of range or given as a
/// list, a strategy other than default/full, an image token outside [0, kMaxVocabSize).
LlavaParts parse_llava_parts(const JsonObject& json);

}  // namespace swiftcpp
