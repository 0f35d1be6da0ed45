// `swiftcpp train --recipe R.yaml [key=value ...]`: supervised fine-tuning (full, LoRA, DoRA), and
// `swiftcpp rlhf --recipe R.yaml [key=value ...]`: preference training (dpo, kto, orpo, cpo, simpo, rm) and online
// RL (grpo), both with
// checkpoints, exact resume, several processes and a clean stop on SIGINT/SIGTERM.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "apps/swiftcpp/commands.h"
#include "apps/swiftcpp/launch.h"
#include "core/progress.h"
#include "core/signals.h"
#include "train/grpo.h"
#include "train/rlhf.h"
#include "train/run.h"
#include "train/tune_chunks.h"

namespace swiftcpp::app {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_graceful{false};  // a training run is under way: the first signal stops it after the step

// On the signal thread (core/signals.h): the first SIGINT/SIGTERM of a run asks it to stop after this step; a
// second one, or one before the run started, ends the process by the signal's default action.
bool on_stop_signal(int signal) {
  if (!g_graceful.load() || g_stop.exchange(true)) return false;
  g_signal = signal;
  const char msg[] = "\nswiftcpp: stopping after this step (checkpoint will be saved; signal again to abort)\n";
  [[maybe_unused]] auto n = write(STDERR_FILENO, msg, sizeof msg - 1);
  return true;
}

struct TrainOptions {
  bool rlhf = false;  // the rlhf command
  std::string recipe;
  std::vector<std::string> overrides;
  bool print_config = false;
  bool list_keys = false;
  bool tune_chunks = false;
  ChunkTuneOptions tune;
  LaunchOptions launch;
};

int run_tune(const TrainConfig& config, const ChunkTuneOptions& options) {
  const auto results = tune_chunks(config, options, std::cerr);
  std::cout << "| chunk_size | chunk_keep | tokens/s | peak tensor memory (MiB) | fits |\n|---|---|---|---|---|\n";
  for (const auto& r : results) {
    std::cout << fmt::format("| {} | {} | {:.1f} | {:.1f} | {} |\n", r.chunk_size, r.chunk_keep, r.tokens_per_s,
                             r.peak_mib, r.fits ? "yes" : "no");
  }
  const ChunkTuneResult* best = best_chunk_setting(results);
  if (best == nullptr) {
    fail<ConfigError>("no (chunk_size, chunk_keep) with C x K = {} fits {} MiB; lower --tune-budget",
                      options.budget > 0 ? options.budget : config.chunk_size * config.chunk_keep,
                      options.memory_limit_mib);
  }
  std::cout << fmt::format("recommended: batching=chunkflow chunk_size={} chunk_keep={}\n", best->chunk_size,
                           best->chunk_keep);
  return 0;
}

int run_train(const TrainOptions& o, const std::vector<std::string>& command_line) {
  std::optional<StopSignals> signals;
  signals.emplace(on_stop_signal);
  if (o.list_keys) {
    std::cout << "recipe keys (YAML recipe or key=value):\n"
              << train_config_schema().help(o.rlhf ? rlhf_defaults() : TrainConfig{});
    return 0;
  }
  for (const auto& ov : o.overrides) {
    if (ov.find('=') == std::string::npos) {
      fail<ConfigError>("argument '{}': expected key=value (run 'swiftcpp {} --list-keys' for the keys)", ov,
                        o.rlhf ? "rlhf" : "train");
    }
  }
  const TrainConfig config = load_train_config(o.recipe, o.overrides, o.rlhf ? rlhf_defaults() : TrainConfig{});
  if (o.rlhf) {  // a key that does not fit the method is refused before anything starts
    if (config.rlhf_type == "grpo") {
      grpo_options(config);
    } else {
      preference_options(config);
    }
  }
  if (o.print_config) {
    std::cout << train_config_schema().dump(config).dump(2) << std::endl;
    return 0;
  }
  if (o.tune_chunks) {
    if (o.rlhf) fail<ConfigError>("--tune-chunks tunes ChunkFlow, which rlhf training does not use");
    return run_tune(config, o.tune);
  }
  // The launcher: the recipe was checked above; the workers read it again.
  if (o.launch.nproc_per_node > 0) {
    signals.reset();  // the launcher waits for them itself, to pass them on to the workers
    return launch_workers(o.launch, strip_launcher_options(command_line));
  }
  g_graceful = true;
  TrainHooks hooks;
  hooks.out = &std::cerr;
  hooks.tty = stream_is_tty(stderr);
  hooks.columns = terminal_columns(stderr);
  hooks.stop = &g_stop;
  hooks.command_line = command_line;
  hooks.dist_env = read_dist_environment();
  const TrainResult result = !o.rlhf                     ? run_training(config, hooks)
                             : config.rlhf_type == "grpo" ? run_grpo(config, hooks)
                                                          : run_rlhf(config, hooks);
  g_graceful = false;
  if (hooks.dist_env.rank == 0) std::cout << result.last_checkpoint.string() << std::endl;
  if (result.interrupted) return 128 + g_signal.load();
  return 0;
}

}  // namespace

namespace {

CommandRun add_training_command(CLI::App& root, const std::vector<std::string>& argv, bool rlhf) {
  auto o = std::make_shared<TrainOptions>();
  o->rlhf = rlhf;
  CLI::App* cmd = rlhf ? root.add_subcommand("rlhf", "Preference training and online RL from a YAML recipe: "
                                                     "rlhf_type dpo, kto, orpo, cpo, simpo, rm or grpo (full, "
                                                     "LoRA, DoRA, QLoRA)")
                       : root.add_subcommand("train", "Fine-tune a model (full, LoRA or DoRA) from a YAML recipe");
  cmd->add_option("--recipe", o->recipe, "YAML recipe (see recipes/ and docs/recipes.md)")->check(CLI::ExistingFile);
  cmd->add_option("overrides", o->overrides, "key=value overrides applied after the recipe (e.g. max_steps=10)");
  cmd->add_flag("--print-config", o->print_config, "Print the resolved configuration as JSON and exit");
  cmd->add_flag("--list-keys", o->list_keys, "List every recipe key with its type, default and meaning");
  if (!rlhf) {
    cmd->add_flag("--tune-chunks", o->tune_chunks,
                  "ChunkFlow: time a short grid of (chunk_size, chunk_keep) with C x K fixed on this recipe's data and "
                  "recommend the fastest that fits --memory-limit-mib");
    cmd->add_option("--tune-budget", o->tune.budget, "C x K in tokens for --tune-chunks (default: chunk_size x chunk_keep)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--tune-steps", o->tune.steps, "optimizer steps per candidate, the first untimed (default 3)")
        ->check(CLI::Range(2, 1000));
    cmd->add_option("--memory-limit-mib", o->tune.memory_limit_mib, "peak tensor memory a candidate may use (0: any)")
        ->check(CLI::NonNegativeNumber);
  }
  cmd->add_option("--nproc-per-node", o->launch.nproc_per_node,
                  "start N worker processes here and train data-parallel (c10d: Gloo on CPU, NCCL on CUDA)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--nnodes", o->launch.nnodes, "machines in the job (with --nproc-per-node)")->capture_default_str();
  cmd->add_option("--node-rank", o->launch.node_rank, "this machine's index in [0, --nnodes)")->capture_default_str();
  cmd->add_option("--master-addr", o->launch.master_addr, "address of rank 0's machine (TCPStore rendezvous)")
      ->capture_default_str();
  cmd->add_option("--master-port", o->launch.master_port, "rendezvous port (default: a free port when --nnodes 1)");
  cmd->footer("Stops cleanly on Ctrl-C / SIGTERM after the current step with a checkpoint (exit 130 / 143);\n"
              "resume with resume_from_checkpoint=latest. Prints the last checkpoint folder on stdout.");
  return [o, argv]() { return run_train(*o, argv); };
}

}  // namespace

CommandRun add_train_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv) {
  (void)globals;
  return add_training_command(root, argv, false);
}

CommandRun add_rlhf_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv) {
  (void)globals;
  return add_training_command(root, argv, true);
}

}  // namespace swiftcpp::app
