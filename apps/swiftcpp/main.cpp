// swiftcpp: one binary to fine-tune, evaluate, quantize and serve large language models.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "core/runtime.h"
#include "core/signals.h"

namespace {

// Exit codes: 0 ok, 1 internal error, 2 usage or configuration, 3 file missing or unreadable,
// 4 malformed file, 5 model does not fit its checkpoint.
int report(const char* kind, const std::string& what, int code) {
  std::cerr << "swiftcpp: " << kind << ": " << what << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace swiftcpp;
  // Before any thread exists: SIGINT/SIGTERM never run a handler on a computing thread (core/signals.h). The
  // commands with a clean stop wait for them on a thread of their own; the others get the default action back.
  block_stop_signals();
  CLI::App root{"swiftcpp: fine-tune, evaluate, quantize and serve LLMs from Hugging Face checkpoints"};
  root.require_subcommand(1);
  // Global options (--threads) are accepted after the subcommand too: `swiftcpp infer ... --threads 1`. Set before
  // the subcommands are added, which inherit it.
  root.fallthrough();
  root.set_version_flag("--version", std::string("swiftcpp ") + kVersion);
  app::GlobalOptions globals;
  root.add_option("--threads", globals.threads, "CPU threads (0: every core this process may use)")
      ->check(CLI::NonNegativeNumber);

  std::map<CLI::App*, app::CommandRun> commands;
  app::CommandRun infer = app::add_infer_command(root, globals);
  commands[root.get_subcommand("infer")] = infer;
  app::CommandRun deploy = app::add_deploy_command(root, globals);
  commands[root.get_subcommand("deploy")] = deploy;
  app::CommandRun tokenize = app::add_tokenize_command(root, globals);
  commands[root.get_subcommand("tokenize")] = tokenize;
  app::CommandRun data = app::add_data_command(root, globals);
  commands[root.get_subcommand("data")] = data;
  app::CommandRun train = app::add_train_command(root, globals, std::vector<std::string>(argv, argv + argc));
  commands[root.get_subcommand("train")] = train;
  app::CommandRun rlhf = app::add_rlhf_command(root, globals, std::vector<std::string>(argv, argv + argc));
  commands[root.get_subcommand("rlhf")] = rlhf;
  app::CommandRun export_ = app::add_export_command(root, globals);
  commands[root.get_subcommand("export")] = export_;
  app::CommandRun quantize = app::add_quantize_command(root, globals);
  commands[root.get_subcommand("quantize")] = quantize;
  app::CommandRun eval = app::add_eval_command(root, globals, std::vector<std::string>(argv, argv + argc));
  commands[root.get_subcommand("eval")] = eval;
  app::CommandRun bench = app::add_bench_command(root, globals, std::vector<std::string>(argv, argv + argc));
  commands[root.get_subcommand("bench")] = bench;

  try {
    root.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0 as the parser does; a usage error is reported as every other error of
    // the program, with its exit code.
    if (e.get_exit_code() == 0) return root.exit(e);
    return report("error", fmt::format("{} (see swiftcpp --help, or swiftcpp COMMAND --help)", e.what()), 2);
  }
  try {
    // Several workers on one machine (the launcher, torchrun): each takes its share of the cores by default.
    int threads = globals.threads;
    if (const char* lws = std::getenv("LOCAL_WORLD_SIZE"); threads == 0 && lws != nullptr && std::atoi(lws) > 1) {
      threads = std::max(1, usable_cores() / std::atoi(lws));
    }
    configure_threads(threads);
    configure_allocator();
    // Warnings libswiftcpp raises (non-finite weights, lengths cut to the model's context) go to stderr.
    set_warning_sink([](const std::string& message) { std::cerr << "swiftcpp: warning: " << message << std::endl; });
    const std::string warning = blas_warning();
    if (!warning.empty()) std::cerr << "swiftcpp: warning: " << warning << std::endl;
    for (auto& [sub, run] : commands) {
      if (!sub->parsed()) continue;
      const std::string name = sub->get_name();
      if (name != "train" && name != "rlhf" && name != "bench" && name != "deploy") unblock_stop_signals();
      return run();
    }
    return report("error", "no subcommand chosen", 2);
  } catch (const ConfigError& e) {
    return report("error", e.what(), 2);
  } catch (const IoError& e) {
    return report("error", e.what(), 3);
  } catch (const FormatError& e) {
    return report("error", e.what(), 4);
  } catch (const ModelError& e) {
    return report("error", e.what(), 5);
  } catch (const DistributedError& e) {
    return report("error", e.what(), 6);
  } catch (const Error& e) {
    return report("error", e.what(), 1);
  } catch (const std::filesystem::filesystem_error& e) {  // a path std::filesystem cannot follow (a link loop, ...)
    const std::string paths = e.path2().empty() ? e.path1().string() : e.path1().string() + ", " + e.path2().string();
    return report("error", fmt::format("{}: {}", paths, e.code().message()), 3);
  } catch (const c10::Error& e) {
    return report("internal error", e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return report("internal error", e.what(), 1);
  }
}
