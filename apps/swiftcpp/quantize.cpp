// `swiftcpp quantize`: weight-only round-to-nearest int4/int8 of every decoder linear layer, written as a Hugging
// Face checkpoint in the GPTQ layout (lib/quant/packed.h) that `infer` and `eval` load with packed weights.

#include <iostream>
#include <set>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "peft/lora.h"
#include "quant/packed.h"

namespace swiftcpp::app {

namespace {

struct QuantizeOptions {
  std::string model;
  std::string adapters;
  std::string method = "rtn";
  int64_t bits = 4;
  int64_t group_size = 128;
  bool asym = false;
  std::string output;
  bool overwrite = false;
};

int run_quantize(const QuantizeOptions& o) {
  const fs::path out_dir = o.output;
  if (fs::exists(out_dir) && !o.overwrite) {
    fail<ConfigError>("--output {} exists (pass --overwrite to replace it)", out_dir.string());
  }
  if (o.group_size == 0 || o.group_size < -1) fail<ConfigError>("--group-size must be positive or -1 (got {})", o.group_size);
  LoadOptions load;
  load.dtype = at::kFloat;
  CausalLM model = load_causal_lm(o.model, load);
  if (!o.adapters.empty()) {
    load_adapter(model, o.adapters);
    merge_lora(model);
    std::cerr << fmt::format("merged {} into {}\n", o.adapters, o.model);
  }
  QuantSpec spec;
  spec.bits = o.bits;
  spec.group_size = o.group_size;
  spec.sym = !o.asym;
  // Every linear layer inside the decoder blocks; embeddings and lm_head stay float, as GPTQ checkpoints keep them.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> packed_weights;
  int64_t layers = 0;
  double max_error = 0;
  for (const auto& item : model->named_modules("", false)) {
    auto* linear = item.value()->as<nn::Linear>();
    if (linear == nullptr || item.key().rfind("model.layers.", 0) != 0) continue;
    const PackedWeight p = quantize_rtn(linear->weight.detach(), spec, item.key());
    tensors.emplace_back(item.key() + ".qweight", p.qweight);
    tensors.emplace_back(item.key() + ".qzeros", p.qzeros);
    tensors.emplace_back(item.key() + ".scales", p.scales);
    tensors.emplace_back(item.key() + ".g_idx", p.g_idx);
    packed_weights.insert(item.key() + ".weight");
    max_error = std::max(max_error, (p.dequantize(at::kFloat) - linear->weight.detach()).abs().max().item<double>());
    ++layers;
  }
  for (const auto& item : model->named_parameters(true)) {
    if (packed_weights.count(item.key()) == 0) tensors.emplace_back(item.key(), item.value().detach());
  }
  Json config = load_json_file(fs::path(o.model) / "config.json");
  config["torch_dtype"] = "float32";
  config["quantization_config"] = {{"quant_method", "gptq"},  {"bits", o.bits},
                                   {"group_size", o.group_size}, {"desc_act", false},
                                   {"sym", spec.sym},            {"true_sequential", true},
                                   {"static_groups", false},     {"damp_percent", 0.0},
                                   {"checkpoint_format", "gptq"}, {"method", o.method}};
  write_checkpoint_folder(out_dir, o.model, tensors, config.dump(2) + "\n");
  std::cerr << fmt::format("wrote {}: {} linear layers as int{} ({}, group {}), largest weight error {:.3g}\n",
                           out_dir.string(), layers, o.bits, spec.sym ? "symmetric" : "asymmetric",
                           o.group_size, max_error);
  return 0;
}

}  // namespace

CommandRun add_quantize_command(CLI::App& root, const GlobalOptions&) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = root.add_subcommand("quantize", "Weight-only int4/int8 quantisation into the Hugging Face GPTQ layout");
  cmd->add_option("--model", o->model, "Hugging Face model folder")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--adapters", o->adapters, "PEFT adapter folder merged before quantising")->check(CLI::ExistingDirectory);
  cmd->add_option("--method", o->method, "rtn (round to nearest; GPTQ is not implemented yet)")
      ->check(CLI::IsMember({"rtn"}))
      ->capture_default_str();
  cmd->add_option("--bits", o->bits, "4 or 8")->check(CLI::IsMember({4, 8}))->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "input columns per scale (-1: one per output channel)")
      ->capture_default_str();
  cmd->add_flag("--asym", o->asym, "asymmetric (min/max) zero points instead of symmetric");
  cmd->add_option("--output", o->output, "folder to write")->required();
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing --output");
  return [o]() { return run_quantize(*o); };
}

}  // namespace swiftcpp::app
