// `swiftcpp bench`: training techniques measured on one recipe's model and data. Each technique (LoRA, DoRA, QLoRA,
// full fine-tuning, packing, ChunkFlow, bf16 autocast, gradient checkpointing) is the recipe with a few keys changed,
// trained for N steps by a `swiftcpp train` process of its own and measured from that run's logging.jsonl and the
// process's peak resident memory. The rows become a table, a JSON report and an SVG bar chart.
//
// Comparability (bench_rule()): every row turns packing, ChunkFlow, bf16 and gradient checkpointing off except the
// row named after one of them, which turns that one on over the recipe's own tuning method; the lora, dora, qlora and
// full rows set the tuning method with all four off. Every row trains max_steps = N, logs every step, has no
// validation split, and saves only the final checkpoint (removed once measured).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/json.h"
#include "train/config.h"

namespace swiftcpp {

/// Every technique, in the default order: lora, dora, qlora, full, packing, chunkflow, bf16, gradient_checkpointing.
const std::vector<std::string>& bench_techniques();

/// How the rows are made comparable and what is measured, as the report states it.
std::string bench_rule();

/// Parses a comma-separated technique list ("lora, full"). Throws ConfigError naming --techniques for an empty
/// list, an unknown name (listing the choices) or a name given twice.
std::vector<std::string> parse_bench_techniques(const std::string& list);

/// The technique whose row is the recipe's own tuning method with the four features off: full (train_type full),
/// qlora (quant_bits set), dora (use_dora) or lora. The table states each row's speed relative to it.
std::string bench_baseline(const TrainConfig& recipe);

/// The keys every row sets after the recipe and the caller's overrides: max_steps=`steps`, logging_steps=1, the only
/// checkpoint at the end (model only), no validation data, no resume, output_dir=`output_dir`.
std::vector<std::string> bench_common_overrides(int64_t steps, const fs::path& output_dir);

/// The keys `technique` sets after the common ones (see the header comment); `recipe` gives the tuning method the
/// feature rows keep and the quant_bits of qlora (4 when the recipe has none). Throws ConfigError for an unknown
/// technique.
std::vector<std::string> bench_technique_overrides(const std::string& technique, const TrainConfig& recipe);

/// The default --output of a recipe: output/bench-<recipe file name without extension>.
fs::path bench_default_output(const std::string& recipe);

struct BenchRequest {
  std::string recipe;                   // YAML recipe (required)
  std::vector<std::string> overrides;   // key=value applied after the recipe, in every row
  std::vector<std::string> techniques;  // parse_bench_techniques
  int64_t steps = 20;
  fs::path output_dir;                  // bench.json, bench.svg and runs/<technique>/
};

constexpr double kBenchMissing = std::numeric_limits<double>::quiet_NaN();

/// One technique's row: how it was run and what it measured (NaN where nothing was measured).
struct BenchRow {
  std::string technique;
  std::string status = "pending";       // ok | skipped | failed once run_bench is done
  std::string reason;                   // skipped, failed: why
  std::string note;                     // ok: what to keep in mind when reading the numbers
  std::vector<std::string> overrides;   // the technique's keys, after the recipe's, the caller's and the common ones
  fs::path output_dir;                  // the child's output_dir: runs/<technique>
  fs::path run_dir;                     // the child's run folder (empty when it made none)
  int exit_code = -1;                   // the child's exit status (-1: not run)
  std::string stderr_tail;              // failed: the child's last stderr lines
  int64_t steps = 0;                    // training steps in the child's log
  bool warmup_excluded = false;         // tokens/s and step time leave step 1 out
  double tokens_per_s = kBenchMissing;  // input tokens that are not padding, per second (measure_bench_row)
  double median_step_s = kBenchMissing;
  double peak_rss_mib = kBenchMissing;     // the child's peak resident set (wait4)
  double peak_tensor_mib = kBenchMissing;  // highest tensor memory of a step (logging.jsonl peak_memory_bytes)
  double loss = kBenchMissing;             // the training loss of the last step
  double wall_s = kBenchMissing;           // the child's whole run: start-up, loading, data, steps, final save
};

struct BenchPlan {
  TrainConfig recipe;    // the recipe with the caller's and the common keys (the run folder of no row)
  std::string baseline;  // bench_baseline(recipe)
  std::vector<BenchRow> rows;
};

/// Checks the request and decodes each row's configuration strictly, as `swiftcpp train` would: a row whose keys
/// validate_train_config refuses is "skipped" with the message as its reason; the others are "pending" (bf16 on a
/// CPU without bf16 instructions runs, with a note). Reads the recipe and checks that the model's config.json and the
/// dataset files exist; writes nothing. Throws ConfigError (steps < 1, no techniques, an override of a key bench sets,
/// a recipe that is not supervised fine-tuning or that the recipe's own keys make invalid), IoError (a missing or
/// unreadable recipe, model or dataset), FormatError (invalid YAML).
BenchPlan plan_bench(const BenchRequest& request);

/// Fills a row's step count and measurements from the child's logging.jsonl records (run with logging_steps 1):
/// tokens/s = training tokens / seconds over the steps after the first (step 1 is warm-up: allocations, first-touch
/// of the weights), or over the one step when there is only one (warmup_excluded false); the median step time over
/// the same steps; the highest peak_memory_bytes; the last step's loss. A note names a measured step more than three
/// times slower than the median (a stall from other load on the machine). Records without tokens_per_s and step_s
/// (validation, skipped steps) are ignored.
void measure_bench_row(BenchRow& row, const Json& records);

/// How run_bench starts and reports its children.
struct BenchHooks {
  fs::path program;                         // the swiftcpp binary the children run
  int threads = 0;                          // --threads of each child (0: not passed)
  std::ostream* out = nullptr;              // one line per row as it starts and ends
  const std::atomic<bool>* stop = nullptr;  // once true: the running child gets SIGINT and no other row starts
};

/// Runs each pending row as `program [--threads T] train --recipe R <overrides>` in its own process, one after
/// another, and sets its status: ok (exit 0 with steps logged), skipped (the child refused its configuration with
/// exit 2 before its first step; the reason is its error message) or failed (any other exit, with the code, the
/// error line and the stderr tail). Each row's output_dir is emptied first; afterwards it keeps the run folder
/// (args.json, logging.jsonl) and stderr.log, and the checkpoint folders are removed. Rows left when `stop` is set
/// are skipped ("bench interrupted"). Throws IoError when a child cannot be started or a folder cannot be written.
void run_bench(BenchPlan& plan, const BenchRequest& request, const BenchHooks& hooks);

/// The machine and the invocation, for the report.
struct BenchMachine {
  std::string cpu;                        // cpu_model_name()
  int cores = 0;                          // usable_cores()
  bool cpu_bf16 = false;                  // cpu_has_bf16()
  int threads = 0;                        // threads each child ran with
  std::string date;                       // utc_now_iso8601()
  std::vector<std::string> command_line;
};

/// The JSON report: the settings (recipe, overrides, steps, threads, machine, swiftcpp version, date, command line,
/// the comparability rule) and one object per row; numbers not measured are null.
Json bench_report_json(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine);

/// The markdown table of the rows, with a line above it naming the recipe, steps and machine.
std::string bench_table(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine);

/// A bar chart (bar_chart_svg) of tokens/s, peak RSS and peak tensor memory: a bar for each row that ran, "n/a" for
/// the others.
std::string bench_chart_svg(const BenchRequest& request, const BenchPlan& plan);

/// Writes bench.json and bench.svg into request.output_dir, each atomically. Throws IoError.
void write_bench_report(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine);

}  // namespace swiftcpp
