// `swiftcpp export`: a model (optionally with a LoRA/DoRA adapter merged in) written as a Hugging Face checkpoint
// or as a GGUF file for llama.cpp.

#include <iostream>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "peft/lora.h"
#include "quant/gguf_model.h"

namespace swiftcpp::app {

namespace {

struct ExportOptions {
  std::string model;
  std::string adapters;
  bool merge_lora = false;
  std::string output;
  std::string dtype = "float32";
  std::string format = "hf";
  std::string quant = "f32";
  bool overwrite = false;
  bool narrow_output = false;
};

// Refuses an --output that cannot or may not be written, before the model loads: a GGUF file replaces only a
// regular file, a checkpoint folder only a folder (never a device or FIFO), an existing output only with
// --overwrite, and a regular file in the way of the path is named.
void check_export_output(const ExportOptions& o) {
  const fs::path out = o.output;
  std::error_code ec;
  if (o.format == "gguf") {
    if (fs::is_directory(out, ec)) fail<ConfigError>("--output {} is a folder; --format gguf writes one file", out.string());
    check_output_file(out, "--output");
    refuse_existing_output(out.string(), "--output", o.overwrite);
  } else {
    check_output_folder(out, "--output");
    if (fs::exists(out, ec) && !fs::is_empty(out, ec) && !o.overwrite) {
      fail<ConfigError>("--output {} exists and is not empty (pass --overwrite to replace it)", out.string());
    }
  }
}

int write_gguf(CausalLM& model, const ExportOptions& o) {
  const fs::path out = o.output;
  check_export_output(o);  // again: the folder may have changed while the model loaded
  if (out.has_parent_path()) create_folders(out.parent_path());
  GgufExportOptions options;
  options.type = parse_ggml_type(o.quant);
  options.wide_output = !o.narrow_output;
  const GgufExportReport r = export_gguf(model, o.model, out, options);
  std::cerr << fmt::format("wrote {} (GGUF v3, architecture {}, {} tensors, {}{}{}, {} vocabulary)\n", out.string(),
                           r.architecture, r.tensors, ggml_type_name(options.type),
                           r.fallback_tensors > 0 ? fmt::format("; {} with rows that do not divide into blocks as F16",
                                                                r.fallback_tensors)
                                                  : "",
                           r.wide_tensors > 0 ? "; the output projection as Q8_0" : "",
                           r.tokenizer_model == "llama" ? "sentencepiece"
                                                        : fmt::format("byte-level BPE (pre-tokenizer {})", r.pre_tokenizer));
  if (!r.pre_tokenizer_known) {
    std::cerr << fmt::format("warning: the split regex of {}/tokenizer.json has no llama.cpp name; wrote \"default\", "
                             "so llama.cpp may split text differently from the checkpoint's tokenizer\n", o.model);
  }
  return 0;
}

std::string hf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

int run_export(const ExportOptions& o) {
  if (!o.adapters.empty() && !o.merge_lora) {
    fail<ConfigError>("--adapters needs --merge-lora (the adapter folder itself is already in the PEFT layout)");
  }
  if (o.merge_lora && o.adapters.empty()) fail<ConfigError>("--merge-lora needs --adapters DIR");
  if (o.format == "hf" && o.quant != "f32") fail<ConfigError>("--quant is for --format gguf (use --dtype for hf)");
  const fs::path out_dir = o.output;
  check_export_output(o);
  const at::ScalarType dtype = parse_dtype(o.dtype);
  // Merge in float32 (merge_lora itself works in float64), then convert.
  LoadOptions load;
  load.dtype = at::kFloat;
  CausalLM model = load_causal_lm(o.model, load);
  if (model->has_packed_weights() && o.format == "hf") {
    fail<ConfigError>("{} is a quantized (GPTQ-layout) checkpoint; export works from the float model", o.model);
  }
  if (!o.adapters.empty()) {
    const LoraConfig adapter = load_adapter(model, o.adapters);
    merge_lora(model);
    std::cerr << fmt::format("merged {} (r {}, alpha {}{}) into {}\n", o.adapters, adapter.r, adapter.lora_alpha,
                             adapter.use_dora ? ", DoRA" : "", o.model);
  }
  if (o.format == "gguf") return write_gguf(model, o);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model->named_parameters(true)) tensors.emplace_back(item.key(), item.value().detach().to(dtype));
  Json config = load_json_file(fs::path(o.model) / "config.json");
  config["torch_dtype"] = hf_dtype_name(dtype);
  write_checkpoint_folder(out_dir, o.model, tensors, config.dump(2) + "\n");
  std::cerr << fmt::format("wrote {} ({} tensors, {})\n", out_dir.string(), model->named_parameters(true).size(),
                           hf_dtype_name(dtype));
  return 0;
}

}  // namespace

CommandRun add_export_command(CLI::App& root, const GlobalOptions& globals) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd = root.add_subcommand("export", "Write a Hugging Face checkpoint or a GGUF file, optionally merging a "
                                      "LoRA adapter");
  cmd->add_option("--model", o->model, "Hugging Face model folder")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--adapters", o->adapters, "PEFT adapter folder to merge")->check(CLI::ExistingDirectory);
  cmd->add_flag("--merge-lora", o->merge_lora, "Fold the adapter into the base weights");
  cmd->add_option("--output", o->output, "Folder to write (config.json, model.safetensors, tokenizer files), or the "
                  ".gguf file with --format gguf")->required();
  cmd->add_option("--dtype", o->dtype, "float32, bfloat16 or float16")->capture_default_str();
  cmd->add_option("--format", o->format, "hf (a checkpoint folder) or gguf (one file for llama.cpp)")
      ->check(CLI::IsMember({"hf", "gguf"}))
      ->capture_default_str();
  cmd->add_option("--quant", o->quant, "GGUF tensor type of 2-D weights: f32, f16, q8_0 or q4_0")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_0"}))
      ->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite, "Replace an existing --output");
  cmd->add_flag("--narrow-output", o->narrow_output, "q4_0: quantise the output projection to Q4_0 too (default: "
                                                     "Q8_0, as llama.cpp keeps it wider)");
  return [o]() { return run_export(*o); };
}

}  // namespace swiftcpp::app
