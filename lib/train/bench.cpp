#include "train/bench.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "core/error.h"
#include "core/plot.h"
#include "core/process.h"
#include "core/runtime.h"
#include "core/text.h"
#include "data/dataset.h"

namespace swiftcpp {

namespace {

constexpr double kMiB = 1 << 20;
constexpr size_t kStderrTailLines = 12;
// A measured step this many times slower than the median is pointed out: on a shared machine another process's
// burst stalls OpenMP threads far beyond its share, and tokens/s (total over total) carries the stall.
constexpr double kSlowStepFactor = 3.0;

std::string override_key(const std::string& assignment) { return assignment.substr(0, assignment.find('=')); }

std::string join(const std::vector<std::string>& items, const char* separator) {
  return fmt::format("{}", fmt::join(items, separator));
}

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

std::string cell(double v, const char* format) {
  return std::isfinite(v) ? fmt::format(fmt::runtime(format), v) : std::string("-");
}

// A table cell: one line, no column separators.
std::string table_text(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  std::string out;
  for (const char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

bool on_cpu(const TrainConfig& config) { return config.device.rfind("cpu", 0) == 0; }

// What a child said last about its failure: its last "swiftcpp: [internal ]error: " line without the prefix, else its
// last non-empty line.
std::string error_line(const std::string& err) {
  const std::vector<std::string> prefixes = {"swiftcpp: error: ", "swiftcpp: internal error: "};
  std::string last;
  size_t start = 0;
  while (start < err.size()) {
    size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(start, end - start);
    for (const auto& p : prefixes) {
      if (line.rfind(p, 0) == 0) last = line.substr(p.size());
    }
    start = end + 1;
  }
  return last.empty() ? last_lines(err, 1) : last;
}

std::string describe_exit(int code) {
  return code > 128 ? fmt::format("exit status {} (signal {})", code, code - 128) : fmt::format("exit status {}", code);
}

// The newest vN-... run folder the child made under its output_dir (empty when it made none).
fs::path newest_run_dir(const fs::path& output_dir) {
  static const std::regex version(R"(v(\d+)-.*)");
  fs::path best;
  int64_t best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, version) && std::stoll(m[1]) > best_version) {
      best_version = std::stoll(m[1]);
      best = entry.path();
    }
  }
  return best;
}

void remove_checkpoints(const fs::path& run_dir) {
  if (run_dir.empty()) return;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("checkpoint-", 0) == 0) doomed.push_back(entry.path());
  }
  for (const auto& d : doomed) {
    std::error_code ec;
    fs::remove_all(d, ec);
    if (ec) fail<IoError>("cannot remove {}: {}", d.string(), ec.message());
  }
}

const BenchRow* find_row(const BenchPlan& plan, const std::string& technique) {
  for (const auto& r : plan.rows) {
    if (r.technique == technique) return &r;
  }
  return nullptr;
}

// A row's speed over the baseline row's (NaN when either did not run).
double speed_ratio(const BenchPlan& plan, const BenchRow& row) {
  const BenchRow* base = find_row(plan, plan.baseline);
  if (base == nullptr || base->status != "ok" || row.status != "ok") return kBenchMissing;
  return row.tokens_per_s / base->tokens_per_s;
}

std::string measured_steps(int64_t steps) {
  return steps > 1 ? fmt::format("steps 2-{} (step 1 is warm-up)", steps) : std::string("the single step");
}

}  // namespace

const std::vector<std::string>& bench_techniques() {
  static const std::vector<std::string> names = {"lora", "dora",      "qlora", "full",
                                                 "packing", "chunkflow", "bf16", "gradient_checkpointing"};
  return names;
}

std::string bench_rule() {
  return "Each technique is the recipe with a few keys changed, trained for the same number of steps in a swiftcpp "
         "train process of its own. lora, dora, qlora and full set the tuning method (dora: use_dora; qlora: LoRA "
         "over a base packed to quant_bits, 4 unless the recipe sets it) with packing, ChunkFlow, bf16 and gradient "
         "checkpointing off; packing, chunkflow, bf16 and gradient_checkpointing turn that one feature on over the "
         "recipe's own tuning method with the other three off. Every row: max_steps = steps, logging every step, no "
         "validation data, only the final checkpoint (removed once measured). tokens/s: non-padding input tokens per "
         "second of step time over steps 2..N (step 1 is warm-up); step time: the median over the same steps; peak "
         "RSS: the process's peak resident set (wait4 ru_maxrss, the memory-mapped weights it touched included); peak "
         "tensors: the highest tensor memory of a step (LibTorch's allocations; memory-mapped float weights are not "
         "counted); loss: the training loss of the last step.";
}

std::vector<std::string> parse_bench_techniques(const std::string& list) {
  std::vector<std::string> out;
  const auto& known = bench_techniques();
  for (const auto& name : split_list(list)) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      fail<ConfigError>("--techniques: unknown technique '{}'; choose from {}", name, join(known, ", "));
    }
    if (std::find(out.begin(), out.end(), name) != out.end()) {
      fail<ConfigError>("--techniques: '{}' is listed twice", name);
    }
    out.push_back(name);
  }
  if (out.empty()) fail<ConfigError>("--techniques is empty; choose from {}", join(bench_techniques(), ", "));
  return out;
}

std::string bench_baseline(const TrainConfig& recipe) {
  if (recipe.train_type == "full") return "full";
  if (recipe.quant_bits != 0) return "qlora";
  if (recipe.use_dora) return "dora";
  return "lora";
}

std::vector<std::string> bench_common_overrides(int64_t steps, const fs::path& output_dir) {
  return {fmt::format("max_steps={}", steps),
          "logging_steps=1",
          fmt::format("save_steps={}", steps),  // the one checkpoint a run always writes, at its last step
          "save_only_model=true",
          "split_dataset_ratio=0",
          "val_dataset=[]",
          "resume_from_checkpoint=\"\"",
          // JSON quoting is valid YAML: any path survives the key=value parser.
          "output_dir=" + Json(output_dir.string()).dump()};
}

std::vector<std::string> bench_technique_overrides(const std::string& technique, const TrainConfig& recipe) {
  const auto& known = bench_techniques();
  if (std::find(known.begin(), known.end(), technique) == known.end()) {
    fail<ConfigError>("unknown technique '{}'; choose from {}", technique, join(known, ", "));
  }
  std::vector<std::string> out;
  if (technique == "lora" || technique == "dora" || technique == "qlora") {
    out = {"train_type=lora", technique == "dora" ? "use_dora=true" : "use_dora=false",
           fmt::format("quant_bits={}", technique != "qlora" ? 0 : recipe.quant_bits != 0 ? recipe.quant_bits : 4)};
  } else if (technique == "full") {
    // What validate_train_config allows only with LoRA goes too.
    out = {"train_type=full", "use_dora=false", "quant_bits=0", "adapters=\"\"", "modules_to_save=[]"};
  }
  // The features: each off but in its own row (ChunkFlow and packing are both batching modes).
  out.push_back(technique == "packing" ? "batching=packing" : technique == "chunkflow" ? "batching=chunkflow"
                                                                                       : "batching=padding");
  out.push_back("packing=false");
  out.push_back(technique == "bf16" ? "bf16=true" : "bf16=false");
  out.push_back(technique == "gradient_checkpointing" ? "gradient_checkpointing=true" : "gradient_checkpointing=false");
  return out;
}

fs::path bench_default_output(const std::string& recipe) {
  return fs::path("output") / ("bench-" + fs::path(recipe).stem().string());
}

BenchPlan plan_bench(const BenchRequest& request) {
  if (request.recipe.empty()) fail<ConfigError>("--recipe is required: the YAML recipe whose model and data are measured");
  if (request.steps < 1) fail<ConfigError>("--steps must be at least 1 (got {})", request.steps);
  if (request.techniques.empty()) fail<ConfigError>("--techniques is empty; choose from {}", join(bench_techniques(), ", "));
  const std::vector<std::string> common = bench_common_overrides(request.steps, request.output_dir);
  for (const auto& o : request.overrides) {
    if (o.find('=') == std::string::npos) {
      fail<ConfigError>("argument '{}': expected key=value (run 'swiftcpp train --list-keys' for the keys)", o);
    }
    const std::string key = override_key(o);
    for (const auto& c : common) {
      if (override_key(c) != key) continue;
      fail<ConfigError>("argument '{}': bench sets '{}' in every row{}", o, key,
                        key == "max_steps"    ? " (use --steps)"
                        : key == "output_dir" ? " (use --output)"
                                              : "");
    }
  }
  std::vector<std::string> base_overrides = request.overrides;
  base_overrides.insert(base_overrides.end(), common.begin(), common.end());
  BenchPlan plan;
  plan.recipe = load_train_config(request.recipe, base_overrides);
  if (!plan.recipe.rlhf_type.empty()) {
    fail<ConfigError>("{}: rlhf_type {}: bench measures supervised fine-tuning (swiftcpp train recipes)", request.recipe,
                      plan.recipe.rlhf_type);
  }
  require_regular_file(fs::path(plan.recipe.model) / "config.json", "model config");
  for (const auto& spec : plan.recipe.dataset) require_regular_file(parse_dataset_source(spec).path, "dataset");
  plan.baseline = bench_baseline(plan.recipe);

  for (const auto& technique : request.techniques) {
    BenchRow row;
    row.technique = technique;
    row.output_dir = request.output_dir / "runs" / technique;
    row.overrides = bench_technique_overrides(technique, plan.recipe);
    std::vector<std::string> all = request.overrides;
    for (const auto& c : bench_common_overrides(request.steps, row.output_dir)) all.push_back(c);
    all.insert(all.end(), row.overrides.begin(), row.overrides.end());
    try {
      const TrainConfig config = load_train_config(request.recipe, all);
      if (technique == "bf16" && on_cpu(config) && !cpu_has_bf16()) {
        row.note = "this CPU has no avx512_bf16 / amx_bf16: LibTorch's bfloat16 matmuls run scalar code";
      }
    } catch (const ConfigError& e) {
      row.status = "skipped";
      row.reason = e.what();
    }
    plan.rows.push_back(std::move(row));
  }
  return plan;
}

void measure_bench_row(BenchRow& row, const Json& records) {
  std::vector<const Json*> steps;
  for (const auto& r : records) {
    if (r.is_object() && r.contains("tokens_per_s") && r.contains("step_s") && r.contains("global_step")) {
      steps.push_back(&r);
    }
  }
  row.steps = static_cast<int64_t>(steps.size());
  if (steps.empty()) return;
  const size_t first = steps.size() > 1 ? 1 : 0;  // step 1 is warm-up
  row.warmup_excluded = first == 1;
  double tokens = 0, seconds = 0, slowest = 0;
  int64_t slowest_step = 0;
  std::vector<double> step_s;
  for (size_t i = first; i < steps.size(); ++i) {
    const double s = steps[i]->at("step_s").get<double>();
    tokens += steps[i]->at("tokens_per_s").get<double>() * s;
    seconds += s;
    step_s.push_back(s);
    if (s > slowest) {
      slowest = s;
      slowest_step = steps[i]->at("global_step").get<int64_t>();
    }
  }
  row.tokens_per_s = seconds > 0 ? tokens / seconds : kBenchMissing;
  std::sort(step_s.begin(), step_s.end());
  const size_t n = step_s.size();
  row.median_step_s = n % 2 == 1 ? step_s[n / 2] : (step_s[n / 2 - 1] + step_s[n / 2]) / 2;
  if (slowest > kSlowStepFactor * row.median_step_s) {
    row.note += fmt::format("{}step {} took {:.2f} s, {:.0f}x the median: other load on the machine? (tokens/s "
                            "includes it)",
                            row.note.empty() ? "" : "; ", slowest_step, slowest, slowest / row.median_step_s);
  }
  double peak = 0;
  for (const Json* r : steps) {
    const auto it = r->find("peak_memory_bytes");
    if (it != r->end() && it->is_number()) peak = std::max(peak, it->get<double>());
  }
  row.peak_tensor_mib = peak / kMiB;
  const auto loss = steps.back()->find("loss");
  row.loss = loss != steps.back()->end() && loss->is_number() ? loss->get<double>() : kBenchMissing;
}

void run_bench(BenchPlan& plan, const BenchRequest& request, const BenchHooks& hooks) {
  const size_t total = plan.rows.size();
  for (size_t i = 0; i < total; ++i) {
    BenchRow& row = plan.rows[i];
    const std::string label = fmt::format("bench: [{}/{}] {}", i + 1, total, row.technique);
    if (row.status != "pending") {
      if (hooks.out != nullptr) *hooks.out << fmt::format("{}: skipped: {}\n", label, row.reason) << std::flush;
      continue;
    }
    if (hooks.stop != nullptr && hooks.stop->load()) {
      row.status = "skipped";
      row.reason = "bench interrupted before this technique";
      continue;
    }
    std::error_code ec;
    fs::remove_all(row.output_dir, ec);
    if (ec) fail<IoError>("cannot empty {}: {}", row.output_dir.string(), ec.message());
    create_folders(row.output_dir);
    std::vector<std::string> argv = {hooks.program.string()};
    if (hooks.threads > 0) {
      argv.push_back("--threads");
      argv.push_back(std::to_string(hooks.threads));
    }
    argv.push_back("train");
    argv.push_back("--recipe");
    argv.push_back(request.recipe);
    for (const auto& o : request.overrides) argv.push_back(o);
    for (const auto& c : bench_common_overrides(request.steps, row.output_dir)) argv.push_back(c);
    for (const auto& o : row.overrides) argv.push_back(o);
    if (hooks.out != nullptr) {
      *hooks.out << fmt::format("{}: training {} steps ({})\n", label, request.steps, join(row.overrides, " "))
                 << std::flush;
    }
    ProcessOptions options;
    options.stop = hooks.stop;
    const ProcessResult r = run_process(argv, options);
    write_file_atomic(row.output_dir / "stderr.log", r.err);
    row.exit_code = r.exit_code;
    row.wall_s = r.seconds;
    row.run_dir = newest_run_dir(row.output_dir);
    if (!row.run_dir.empty()) measure_bench_row(row, read_json_lines(row.run_dir / "logging.jsonl", "training log"));
    if (r.exit_code == 0 && row.steps > 0) {
      row.status = "ok";
      row.peak_rss_mib = static_cast<double>(r.peak_rss_bytes) / kMiB;
      if (!row.warmup_excluded) {
        row.note += fmt::format("{}one step: tokens/s and step time include the warm-up", row.note.empty() ? "" : "; ");
      }
    } else if (r.exit_code == 2 && row.steps == 0) {  // a configuration error before training: does not apply
      row.status = "skipped";
      row.reason = error_line(r.err);
    } else if (hooks.stop != nullptr && hooks.stop->load()) {
      row.status = "failed";
      row.reason = fmt::format("interrupted: stopped by bench after {} of {} steps ({})", row.steps, request.steps,
                               describe_exit(r.exit_code));
    } else {
      row.status = "failed";
      row.reason = r.exit_code == 0 ? "exit status 0 without a training step in logging.jsonl"
                                    : fmt::format("{}: {}", describe_exit(r.exit_code), error_line(r.err));
      row.stderr_tail = last_lines(r.err, kStderrTailLines);
    }
    remove_checkpoints(row.run_dir);
    if (hooks.out != nullptr) {
      *hooks.out << (row.status == "ok"
                         ? fmt::format("{}: ok, {:.1f} tokens/s, {:.3f} s a step, loss {:.4f} ({:.1f} s in all)\n", label,
                                       row.tokens_per_s, row.median_step_s, row.loss, row.wall_s)
                         : fmt::format("{}: {}: {}\n", label, row.status, row.reason))
                 << std::flush;
    }
  }
}

Json bench_report_json(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine) {
  Json rows = Json::array();
  for (const auto& r : plan.rows) {
    rows.push_back({{"technique", r.technique},
                    {"status", r.status},
                    {"reason", r.reason.empty() ? Json(nullptr) : Json(r.reason)},
                    {"note", r.note.empty() ? Json(nullptr) : Json(r.note)},
                    {"overrides", r.overrides},
                    {"run_dir", r.run_dir.empty() ? Json(nullptr) : Json(r.run_dir.string())},
                    {"exit_code", r.exit_code >= 0 ? Json(r.exit_code) : Json(nullptr)},
                    {"steps", r.steps},
                    {"warmup_excluded", r.warmup_excluded},
                    {"tokens_per_s", number_or_null(r.tokens_per_s)},
                    {"speed_vs_baseline", number_or_null(speed_ratio(plan, r))},
                    {"median_step_s", number_or_null(r.median_step_s)},
                    {"peak_rss_mib", number_or_null(r.peak_rss_mib)},
                    {"peak_tensor_mib", number_or_null(r.peak_tensor_mib)},
                    {"loss", number_or_null(r.loss)},
                    {"wall_s", number_or_null(r.wall_s)},
                    {"stderr_tail", r.stderr_tail.empty() ? Json(nullptr) : Json(r.stderr_tail)}});
  }
  return {{"recipe", request.recipe},
          {"overrides", request.overrides},
          {"techniques", request.techniques},
          {"steps", request.steps},
          {"baseline", plan.baseline},
          {"model", plan.recipe.model},
          {"train_type", plan.recipe.train_type},
          {"device", plan.recipe.device},
          {"threads", machine.threads},
          {"machine", {{"cpu", machine.cpu}, {"cores", machine.cores}, {"cpu_bf16", machine.cpu_bf16}}},
          {"swiftcpp_version", kVersion},
          {"date", machine.date},
          {"command_line", machine.command_line},
          {"rule", bench_rule()},
          {"results", rows}};
}

std::string bench_table(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine) {
  std::string out = fmt::format(
      "{} on {}, {} steps per technique, {} thread{} on {}; tokens/s and step time over {}\n\n", request.recipe,
      plan.recipe.model, request.steps, machine.threads, machine.threads == 1 ? "" : "s", machine.cpu,
      measured_steps(request.steps));
  out += fmt::format("| technique | status | tokens/s | vs {} | step time (s) | peak RSS (MiB) | peak tensors (MiB) | "
                     "loss @{} | note |\n",
                     plan.baseline, request.steps);
  out += "|---|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& r : plan.rows) {
    const bool ok = r.status == "ok";
    const auto value = [&](double v, const char* format) { return ok ? cell(v, format) : std::string("-"); };
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.technique, r.status,
                       value(r.tokens_per_s, "{:.1f}"), value(speed_ratio(plan, r), "{:.2f}x"),
                       value(r.median_step_s, "{:.3f}"), value(r.peak_rss_mib, "{:.0f}"),
                       value(r.peak_tensor_mib, "{:.1f}"), value(r.loss, "{:.4f}"),
                       table_text(ok ? r.note : r.reason));
  }
  return out;
}

std::string bench_chart_svg(const BenchRequest& request, const BenchPlan& plan) {
  std::vector<std::string> categories;
  std::vector<BarPanel> panels = {{"tokens/s", {}, ""}, {"peak RSS (MiB)", {}, ""}, {"peak tensors (MiB)", {}, ""}};
  for (const auto& r : plan.rows) {
    const bool ok = r.status == "ok";
    categories.push_back(ok ? r.technique : fmt::format("{} ({})", r.technique, r.status));
    panels[0].values.push_back(ok ? r.tokens_per_s : kBenchMissing);
    panels[1].values.push_back(ok ? r.peak_rss_mib : kBenchMissing);
    panels[2].values.push_back(ok ? r.peak_tensor_mib : kBenchMissing);
  }
  for (auto& p : panels) {
    for (double& v : p.values) {
      if (!std::isfinite(v) || v < 0) v = kBenchMissing;
    }
  }
  ChartOptions options;
  options.title = fmt::format("swiftcpp bench: {} on {}, {} steps", fs::path(request.recipe).filename().string(),
                              fs::path(plan.recipe.model).filename().string(), request.steps);
  options.width = 960;
  options.height = std::max(200, 90 + 30 * static_cast<int>(categories.size()));
  return bar_chart_svg(categories, panels, options);
}

void write_bench_report(const BenchRequest& request, const BenchPlan& plan, const BenchMachine& machine) {
  create_folders(request.output_dir);
  write_file_atomic(request.output_dir / "bench.json",
                    bench_report_json(request, plan, machine).dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
  write_file_atomic(request.output_dir / "bench.svg", bench_chart_svg(request, plan));
}

}  // namespace swiftcpp
