// Subcommands of the swiftcpp binary. Each registers its options on the root app and returns the function
// main() runs when it is chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace swiftcpp::app {

using CommandRun = std::function<int()>;

/// Options shared by every subcommand.
struct GlobalOptions {
  int threads = 0;  // 0: the cores this process may use
};

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

/// `swiftcpp eval`: benchmarks scored as lm-evaluation-harness scores them; `argv` is recorded in results.json.
CommandRun add_eval_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv);

}  // namespace swiftcpp::app
