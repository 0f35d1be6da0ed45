// `swiftcpp bench --recipe R.yaml [--techniques a,b,...] [--steps N] [--output DIR] [key=value ...]`: each training
// technique trained for N steps on the recipe's model and data in a process of its own, reported as a table on
// stdout, DIR/bench.json and DIR/bench.svg (lib/train/bench.h).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>

#include "apps/swiftcpp/commands.h"
#include "core/runtime.h"
#include "core/signals.h"
#include "train/bench.h"

namespace swiftcpp::app {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

// On the signal thread (core/signals.h): the first SIGINT/SIGTERM stops the running technique, a second one ends
// the process by the signal's default action, as does one outside the runs (the running child stays in its own process group).
std::atomic<bool> g_graceful{false};  // techniques are running

bool on_bench_signal(int signal) {
  if (!g_graceful.load() || g_stop.exchange(true)) return false;
  g_signal = signal;
  const char msg[] = "\nswiftcpp: bench: stopping the running technique; the report covers what finished\n";
  [[maybe_unused]] auto n = write(STDERR_FILENO, msg, sizeof msg - 1);
  return true;
}

struct BenchCliOptions {
  std::string recipe;
  std::string techniques;
  int64_t steps = 20;
  std::string output;
  std::vector<std::string> overrides;
};

fs::path this_program() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) fail<IoError>("cannot find this program's path (/proc/self/exe): {}", std::strerror(errno));
  exe[n] = '\0';
  return exe;
}

int run_bench_command(const BenchCliOptions& o, const GlobalOptions& globals, const std::vector<std::string>& argv) {
  const StopSignals signals(on_bench_signal);
  BenchRequest request;
  request.recipe = o.recipe;
  request.overrides = o.overrides;
  request.techniques = o.techniques.empty() ? bench_techniques() : parse_bench_techniques(o.techniques);
  request.steps = o.steps;
  request.output_dir = o.output.empty() ? bench_default_output(o.recipe) : fs::path(o.output);
  check_output_folder(request.output_dir, "--output");
  BenchPlan plan = plan_bench(request);  // every input checked before anything is written

  BenchHooks hooks;
  hooks.program = this_program();
  hooks.threads = globals.threads;
  hooks.out = &std::cerr;
  hooks.stop = &g_stop;
  BenchMachine machine;
  machine.cpu = cpu_model_name();
  machine.cores = usable_cores();
  machine.cpu_bf16 = cpu_has_bf16();
  machine.threads = globals.threads > 0 ? globals.threads : machine.cores;
  machine.date = utc_now_iso8601();
  machine.command_line = argv;
  g_graceful = true;
  run_bench(plan, request, hooks);
  g_graceful = false;
  write_bench_report(request, plan, machine);
  std::cout << bench_table(request, plan, machine) << std::flush;
  std::cerr << fmt::format("bench: report in {} and {}\n", (request.output_dir / "bench.json").string(),
                           (request.output_dir / "bench.svg").string());

  if (g_stop.load()) return 128 + g_signal.load();
  int ok = 0, failed = 0;
  for (const auto& r : plan.rows) {
    ok += r.status == "ok";
    failed += r.status == "failed";
  }
  if (failed > 0) {
    std::cerr << fmt::format("swiftcpp: error: bench: {} of {} techniques failed (see the table and bench.json)\n",
                             failed, plan.rows.size());
    return 1;
  }
  if (ok == 0) {
    std::cerr << "swiftcpp: error: bench: no technique applies to this recipe (every row is skipped; see the table)\n";
    return 2;
  }
  return 0;
}

}  // namespace

CommandRun add_bench_command(CLI::App& root, const GlobalOptions& globals, const std::vector<std::string>& argv) {
  auto o = std::make_shared<BenchCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "bench", "Train each technique (LoRA, DoRA, QLoRA, full, packing, ChunkFlow, bf16, gradient checkpointing) for a "
               "few steps on a recipe's model and data, each in its own process, and compare speed, memory and loss");
  cmd->add_option("--recipe", o->recipe, "YAML recipe whose model and data are measured (as swiftcpp train takes it)");
  cmd->add_option("--techniques", o->techniques,
                  "comma-separated subset of: " + fmt::format("{}", fmt::join(bench_techniques(), ",")) +
                      " (default: all, in that order)");
  cmd->add_option("--steps", o->steps, "optimizer steps per technique; step 1 is warm-up, left out of tokens/s and step time when N > 1")
      ->capture_default_str();
  cmd->add_option("--output", o->output, "folder for bench.json, bench.svg and runs/<technique>/ (default: "
                                         "output/bench-<recipe name>)");
  cmd->add_option("overrides", o->overrides, "key=value recipe overrides applied in every row (e.g. model=DIR)");
  cmd->footer("Rows are made comparable: packing, chunkflow, bf16 and gradient_checkpointing are off in every row but\n"
              "their own (which keeps the recipe's tuning method); see docs/cli.md. A technique the configuration\n"
              "refuses is listed as skipped with the reason. Exit 1 when a technique failed, 2 when none could run.");
  const GlobalOptions* g = &globals;
  return [o, g, argv]() { return run_bench_command(*o, *g, argv); };
}

}  // namespace swiftcpp::app
