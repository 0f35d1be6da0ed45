// LoRA / DoRA adapters on the shared decoder: configuration, injection, the trainable tensors, merging, and
// saving and loading in the PEFT layout so that adapters move freely between swiftcpp and the Python ecosystem.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/fs.h"
#include "core/json.h"
#include "models/decoder/decoder.h"

namespace swiftcpp {

/// PEFT's LoraConfig, the fields that matter here (adapter_config.json keys).
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules = {"all-linear"};  // module names (q_proj, ...) or "all-linear"
  bool target_modules_regex = false;  // target_modules[0] is a regex matched against whole module paths (PEFT's
                                      // string form, e.g. "language_model\.model\.layers\.\d+\.mlp\..*")
  bool use_rslora = false;
  bool use_dora = false;
  std::vector<std::string> modules_to_save;  // whole modules trained and saved with the adapter (lm_head, ...)
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";  // PEFT's task_type: SEQ_CLS for a reward model (its `score` head saved)

  /// alpha / r, or alpha / sqrt(r) with rsLoRA.
  double scale() const;
};

/// A tensor the optimizer updates, with its PEFT (adapter) or Hugging Face (full model) name.
struct TrainableTensor {
  std::string name;
  at::Tensor tensor;
  bool decay = true;  // weight decay applies (not to norms and biases)
};

/// The module paths ("model.layers.0.self_attn.q_proj") a config's target_modules select: a path matches a target
/// when it ends with ".<target>" or equals it; "all-linear" selects every linear layer except lm_head. In a
/// vision-language model names and all-linear select within the language model only (the vision tower and the
/// aligner are trained in full through modules_to_save, or frozen). With target_modules_regex the one pattern
/// must match a whole path (PEFT's re.fullmatch). Throws ConfigError naming a target that matches nothing, with
/// the linear-layer names the model has, or an invalid regex.
std::vector<std::string> lora_target_paths(CausalLM& model, const LoraConfig& config);

/// Attaches fresh adapters as PEFT initialises them: A Kaiming-uniform (bound 1/sqrt(in)) from a generator
/// seeded with `seed`, B zeros (so the model's output is unchanged), DoRA magnitudes = row norms of W. Freezes
/// every base parameter; modules_to_save get trainable copies. Throws ConfigError for r < 1 or bad targets.
void inject_lora(CausalLM& model, const LoraConfig& config, uint64_t seed);

/// Reads DIR/adapter_config.json and DIR/adapter_model.safetensors (PEFT layout) and attaches them to `model`
/// (base parameters frozen). Accepts PEFT's naming variants (with or without ".default", DoRA magnitude as
/// `lora_magnitude_vector` or `lora_magnitude_vector.weight`). Throws IoError / FormatError for unreadable or
/// malformed files and ModelError, naming the file and listing the tensors, when the adapter does not fit.
LoraConfig load_adapter(CausalLM& model, const fs::path& dir);

/// Reads DIR/adapter_config.json alone (see load_adapter for what is accepted). Throws IoError / FormatError /
/// ConfigError naming the file.
LoraConfig read_adapter_config(const fs::path& dir);

/// The adapter's trainable tensors with their PEFT names (base_model.model.<path>.lora_A.weight [r, in],
/// lora_B.weight [out, r], lora_magnitude_vector [out], and modules_to_save as base_model.model.<path>.weight).
std::vector<TrainableTensor> adapter_tensors(CausalLM& model, const LoraConfig& config);

/// `config` as adapter_config.json records it: target_modules names exactly the layers of `model` that carry an
/// adapter, in a form peft resolves to those modules and no others among all of the model's modules (peft 0.10+:
/// a list selects a path equal to or ending with ".<name>", a string is re.fullmatch'ed against each path). The
/// layers' names when they select exactly those layers (["down_proj", ..., "v_proj"] in a text model), else one
/// regex over the paths ("model\.layers\.\d+\.self_attn\.(k_proj|o_proj|q_proj|v_proj)" for a Qwen2-VL's
/// language model, whose vision tower has linear layers named like them, or a mixture of experts' adapted
/// subset). "all-linear" is never written: peft expands it to every linear layer of the whole model (the vision
/// tower's and the routers included) and stops at a vision tower's Conv3d that shares a linear layer's name.
/// Unchanged when no layer carries an adapter.
LoraConfig peft_saved_config(CausalLM& model, const LoraConfig& config);

/// Writes DIR/adapter_config.json (peft_saved_config) and DIR/adapter_model.safetensors (float32 unless the
/// tensors are wider), each atomically. Throws IoError.
void save_adapter(const fs::path& dir, CausalLM& model, const LoraConfig& config);

/// Folds every adapter into its base weight (W + scale B A, DoRA: m / ||W + scale B A|| * (W + scale B A),
/// computed in float64) and detaches the adapters; the model then computes what base + adapter computed.
void merge_lora(CausalLM& model);

/// The adapter_config.json text PEFT writes for `config`.
Json adapter_config_json(const LoraConfig& config);

/// Switches every LoRA/DoRA adapter of `model` off for the scope's lifetime, so each adapted Linear computes its
/// base output only (the same ops as the model without adapters): the reference model of DPO/KTO, as peft's
/// `disable_adapter()` and torchtune's `disable_adapter` give it. Nothing is copied: the adapters are detached from
/// their layers and put back, unchanged, when the scope ends (also when an exception unwinds it).
///
/// modules_to_save copies (trained in full beside the adapters) hold their original values while the scope lives
/// (CausalLMImpl::saved_module_originals), as peft's disable_adapter runs the original module; their trained values
/// come back when it ends. Reference forwards run before the policy's forward of a step, so no graph of the step
/// holds a swapped tensor.
///
/// Refused (ConfigError): a model without adapters (its reference needs a model of its own), and a model with a
/// trainable base parameter whose original value was not kept.
///
/// While the scope lives: adapter_tensors() sees no adapters, adapters must not be attached, loaded or merged,
/// and no other thread may run the model. A graph recorded inside the scope keeps what it used, but a
/// gradient-checkpointed layer recomputed in a backward after the scope would use the adapters again: run
/// reference forwards without autograd (at::NoGradGuard), as reference log-probabilities need no gradient.
class AdaptersDisabled {
 public:
  /// Detaches the adapters of `model`. Throws ConfigError as described above, before changing anything.
  explicit AdaptersDisabled(CausalLM& model);
  /// Puts the adapters back on the layers they came from. Throws nothing.
  ~AdaptersDisabled();
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  std::vector<std::pair<nn::LinearImpl*, std::shared_ptr<nn::LoraWeights>>> detached_;
  std::vector<std::pair<at::Tensor, at::Tensor>> swapped_;  // (parameter, its trained value) while the original runs
  CausalLM model_;  // keeps the layers alive until they are restored
};

}  // namespace swiftcpp
