// Subcommands of the swiftcpp binary. Each registers its options on the root app and returns the function
// main() runs when it is chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace swiftcpp {
struct SessionOptions;  // infer/session.h
}

namespace swiftcpp::app {

using CommandRun = std::function<int()>;

/// Options shared by every subcommand.
struct GlobalOptions {
  int threads = 0;  // 0: the cores this process may use
};

/// The model a generating command opens: --model, --tokenizer, --template, --device, --dtype.
struct ModelOptions {
  std::string model;
  std::string tokenizer;      // tokenizer folder for a GGUF model
  std::string chat_template;  // empty: the checkpoint's; "raw": none
  std::string device = "cpu";
  std::string dtype = "float32";
  int64_t max_pixels = 0;  // Qwen2-VL image processor overrides (0: preprocessor_config.json's)
  int64_t min_pixels = 0;

  /// What ModelSession::open takes. Throws ConfigError for a bad device or dtype name.
  SessionOptions session() const;
};
/// Registers the ModelOptions flags on `cmd`.
void add_model_options(CLI::App* cmd, ModelOptions& o);

/// Every writer's one rule: an output path that already holds something (a file, a folder, a symbolic link, even a
/// dangling one) is refused unless the command's --overwrite is given; with it the output replaces the path
/// itself (a link is replaced, never written through). Throws ConfigError naming `flag` and the path.
inline void refuse_existing_output(const std::string& path, const char* flag, bool overwrite) {
  std::error_code ec;
  if (overwrite || path.empty() || !std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;
  fail<ConfigError>("{} {} exists (pass --overwrite to replace it)", flag, path);
}

/// `swiftcpp infer`: generation from a model folder.
CommandRun add_infer_command(CLI::App& root, const GlobalOptions& globals);

/// `swiftcpp deploy`: an OpenAI-compatible HTTP server.
CommandRun add_deploy_command(CLI::App& root, const GlobalOptions& globals);

/// `swiftcpp tokenize`: text -> ids and ids -> text with a checkpoint's tokenizer.
CommandRun add_tokenize_command(CLI::App& root, const GlobalOptions& globals);

/// `swiftcpp data inspect`: rendered samples with trained tokens marked, and dataset statistics.
CommandRun add_data_command(CLI::App& root, const GlobalOptions& globals);

/// `swiftcpp train`: fine-tuning from a recipe; `argv` is recorded in args.json.
CommandRun add_train_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv);

/// `swiftcpp rlhf`: preference training from a recipe (dpo, kto, orpo, cpo, simpo, rm); `argv` as for train.
CommandRun add_rlhf_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv);

/// `swiftcpp export`: a Hugging Face checkpoint, optionally with a LoRA adapter merged.
CommandRun add_export_command(CLI::App& root, const GlobalOptions& globals);
CommandRun add_quantize_command(CLI::App& root, const GlobalOptions& globals);

/// `swiftcpp bench`: each training technique for a few steps on a recipe, each in its own process; `argv` is recorded
/// in bench.json.
CommandRun add_bench_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv);

/// `swiftcpp eval`: benchmarks scored as lm-evaluation-harness scores them; `argv` is recorded in results.json.
CommandRun add_eval_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv);

}  // namespace swiftcpp::app
