// `swiftcpp quantize`: weight-only int4/int8 of every decoder linear layer, round to nearest or GPTQ (calibrated
// on a dataset), written as a Hugging Face checkpoint in the GPTQ layout (lib/quant/packed.h) that `infer` and
// `eval` load with packed weights.

#include <iostream>
#include <set>

#include "apps/swiftcpp/commands.h"
#include "infer/session.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/pipeline.h"
#include "io/safetensors.h"
#include "peft/lora.h"
#include "quant/gptq.h"
#include "quant/packed.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

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
  // GPTQ
  std::vector<std::string> calib_dataset;
  int64_t calib_samples = 128;
  int64_t calib_max_length = 512;
  double damp_percent = 0.01;
  bool act_order = false;
  int64_t block_size = 128;
  uint64_t seed = 42;
  std::string chat_template;
};

// The first `samples` samples (after a seeded shuffle) of the calibration datasets, encoded as training encodes
// them (the model's chat template, or raw text), each cut to max_length tokens.
std::vector<std::vector<int64_t>> calibration_samples(const QuantizeOptions& o, int threads) {
  const fs::path model_dir = o.model;
  // Calibration text only: the checkpoint's tokenizer and chat template, no image settings.
  const ModelAssets assets = ModelAssets::open(model_dir, o.chat_template, nullptr);
  EncodeOptions enc;
  enc.max_length = o.calib_max_length;
  enc.truncation = TruncationStrategy::kRight;
  SampleEncoder encoder(assets.tokenizer, assets.chat_template, enc);
  DataOptions data;
  data.dataset = o.calib_dataset;
  data.seed = o.seed;
  data.num_threads = threads;
  const TokenizedData tokenized = prepare_data(data, encoder, "calibration");
  const int64_t available = static_cast<int64_t>(tokenized.train.size());
  if (available < o.calib_samples) {
    fail<ConfigError>("--calib-dataset {} gives {} usable samples; --calib-samples asks for {} (lower it or add data)",
                      fmt::join(o.calib_dataset, ","), available, o.calib_samples);
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < o.calib_samples; ++i) {
    const auto& ids = tokenized.train[i].input_ids;
    out.emplace_back(ids.begin(), ids.end());
  }
  return out;
}

int run_quantize(const QuantizeOptions& o, int threads) {
  const fs::path out_dir = o.output;
  check_output_folder(out_dir, "--output");  // only a folder is replaced (never a file, device or FIFO)
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !o.overwrite) {
    fail<ConfigError>("--output {} exists (pass --overwrite to replace it)", out_dir.string());
  }
  if (o.group_size == 0 || o.group_size < -1) fail<ConfigError>("--group-size must be positive or -1 (got {})", o.group_size);
  const bool gptq = o.method == "gptq";
  if (gptq && o.calib_dataset.empty()) fail<ConfigError>("--method gptq needs --calib-dataset (text to calibrate on)");
  if (!gptq && !o.calib_dataset.empty()) fail<ConfigError>("--calib-dataset is for --method gptq");
  if (o.calib_samples < 1) fail<ConfigError>("--calib-samples must be at least 1 (got {})", o.calib_samples);
  if (!(o.damp_percent > 0 && o.damp_percent < 1)) {  // NaN fails both comparisons
    fail<ConfigError>("--damp-percent must be in (0, 1) (got {})", o.damp_percent);
  }
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
  // Every linear layer inside the decoder blocks; embeddings and lm_head stay float, as GPTQ checkpoints keep them,
  // and so do a vision-language model's vision tower and projector. Shapes are checked for every layer before any
  // work.
  std::map<std::string, PackedWeight> packed;
  const std::string blocks = model->language_model_prefix() + "model.layers.";
  for (const auto& item : model->named_modules("", false)) {
    auto* linear = item.value()->as<nn::Linear>();
    if (linear == nullptr || item.key().rfind(blocks, 0) != 0 || model->is_router(item.key())) continue;
    checked_group_size(linear->out_features(), linear->in_features(), spec, item.key());
  }
  std::string detail;
  if (gptq) {
    const auto calibration = calibration_samples(o, threads);
    int64_t tokens = 0;
    for (const auto& c : calibration) tokens += static_cast<int64_t>(c.size());
    GptqOptions g;
    g.spec = spec;
    g.damp_percent = o.damp_percent;
    g.act_order = o.act_order;
    g.block_size = o.block_size;
    std::vector<GptqLayerReport> report;
    packed = quantize_model_gptq(model, calibration, g, &report, [](int64_t done, int64_t total) {
      std::cerr << fmt::format("gptq: layer {}/{}\n", done, total);
    });
    double worst = 0, mean = 0;
    for (const auto& r : report) {
      worst = std::max(worst, r.output_error);
      mean += r.output_error / static_cast<double>(report.size());
    }
    detail = fmt::format("GPTQ on {} samples ({} tokens), relative output error mean {:.3g}, worst {:.3g}",
                         calibration.size(), tokens, mean, worst);
  } else {
    packed = quantize_model_rtn(model, spec);
    double max_error = 0;
    for (const auto& item : model->named_modules("", false)) {
      const auto it = packed.find(item.key());
      if (it == packed.end()) continue;
      const at::Tensor w = item.value()->as<nn::Linear>()->weight.detach();
      max_error = std::max(max_error, (it->second.dequantize(at::kFloat) - w).abs().max().item<double>());
    }
    detail = fmt::format("round to nearest, largest weight error {:.3g}", max_error);
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> packed_weights;
  for (const auto& [name, p] : packed) {
    tensors.emplace_back(name + ".qweight", p.qweight);
    tensors.emplace_back(name + ".qzeros", p.qzeros);
    tensors.emplace_back(name + ".scales", p.scales);
    tensors.emplace_back(name + ".g_idx", p.g_idx);
    packed_weights.insert(name + ".weight");
  }
  for (const auto& item : model->named_parameters(true)) {
    if (packed_weights.count(item.key()) == 0) tensors.emplace_back(item.key(), item.value().detach());
  }
  Json config = load_json_file(fs::path(o.model) / "config.json");
  config["torch_dtype"] = "float32";
  config["quantization_config"] = {{"quant_method", "gptq"},  {"bits", o.bits},
                                   {"group_size", o.group_size}, {"desc_act", gptq && o.act_order},
                                   {"sym", spec.sym},            {"true_sequential", true},
                                   {"static_groups", false},     {"damp_percent", gptq ? o.damp_percent : 0.0},
                                   {"checkpoint_format", "gptq"}, {"method", o.method}};
  write_checkpoint_folder(out_dir, o.model, tensors, config.dump(2) + "\n");
  std::cerr << fmt::format("wrote {}: {} linear layers as int{} ({}, group {}); {}\n", out_dir.string(),
                           packed.size(), o.bits, spec.sym ? "symmetric" : "asymmetric", o.group_size, detail);
  return 0;
}

}  // namespace

CommandRun add_quantize_command(CLI::App& root, const GlobalOptions& global) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = root.add_subcommand("quantize", "Weight-only int4/int8 quantisation into the Hugging Face GPTQ layout");
  cmd->add_option("--model", o->model, "Hugging Face model folder")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--adapters", o->adapters, "PEFT adapter folder merged before quantising")->check(CLI::ExistingDirectory);
  cmd->add_option("--method", o->method, "rtn (round to nearest) or gptq (calibrated on --calib-dataset)")
      ->check(CLI::IsMember({"rtn", "gptq"}))
      ->capture_default_str();
  cmd->add_option("--bits", o->bits, "4 or 8")->check(CLI::IsMember({4, 8}))->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "input columns per scale (-1: one per output channel)")
      ->capture_default_str();
  cmd->add_flag("--asym", o->asym, "asymmetric (min/max) zero points instead of symmetric");
  cmd->add_option("--output", o->output, "folder to write")->required();
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing --output");
  cmd->add_option("--calib-dataset", o->calib_dataset, "GPTQ calibration data: dataset files as training takes them "
                                                       "(path[#N], repeatable)");
  cmd->add_option("--calib-samples", o->calib_samples, "GPTQ: calibration samples drawn (after a seeded shuffle)")
      ->capture_default_str();
  cmd->add_option("--calib-max-length", o->calib_max_length, "GPTQ: tokens per calibration sample (longer ones are cut)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--damp-percent", o->damp_percent, "GPTQ: diagonal damping as a share of the mean Hessian diagonal")
      ->capture_default_str();
  cmd->add_flag("--act-order", o->act_order, "GPTQ: quantise columns by decreasing activation energy (desc_act)");
  cmd->add_option("--block-size", o->block_size, "GPTQ: columns per lazy-update block")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "GPTQ: shuffle seed for drawing calibration samples")->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template, "template that renders calibration rows (default: the model's)");
  return [o, &global]() { return run_quantize(*o, global.threads); };
}

}  // namespace swiftcpp::app
