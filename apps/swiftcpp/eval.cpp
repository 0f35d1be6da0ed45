// `swiftcpp eval`: standard benchmarks (MMLU, ARC, HellaSwag, GSM8K, perplexity, custom YAML tasks, with images on
// a vision-language model) scored the way lm-evaluation-harness scores them, on a model with an optional adapter.
#include <chrono>
#include <set>
#include <iostream>

#include "apps/swiftcpp/commands.h"
#include "infer/session.h"
#include "quant/gguf_model.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/memory.h"
#include "core/progress.h"
#include "core/runtime.h"
#include "core/text.h"
#include "data/encode.h"
#include "eval/evaluator.h"
#include "eval/mm_bench.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::app {

namespace {

struct EvalCliOptions {
  std::string model;
  std::string tokenizer;  // tokenizer folder for a GGUF model
  std::string adapters;
  std::string tasks;
  std::string data_dir;
  std::optional<int> num_fewshot;
  std::optional<int64_t> limit;
  int64_t batch_size = 8;
  int64_t max_length = 0;
  int64_t stride = 0;
  std::optional<int64_t> max_new_tokens;
  std::string add_bos = "auto";
  bool apply_chat_template = false;
  std::string chat_template;
  std::string output_dir;
  bool log_samples = false;
  std::string dump_requests;
  bool overwrite = false;
  uint64_t seed = 1234;
  std::string device = "cpu";
  std::string dtype = "float32";
  // Multimodal benchmarks
  std::string predictions;  // re-score this predictions file without a model
  std::string rules = "vlmevalkit";
  std::string reasoning_tags = "default";
  std::string mmmu_open = "official";
};

std::string safe_name(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return s;
}

eval::mm::ScoreOptions mm_score_options(const EvalCliOptions& o) {
  eval::mm::ScoreOptions options;
  options.rules = eval::mm::parse_rules(o.rules);
  if (o.reasoning_tags != "default" && o.reasoning_tags != "none") {
    fail<ConfigError>("--reasoning-tags must be default or none, got '{}'", o.reasoning_tags);
  }
  options.strip_reasoning = o.reasoning_tags == "default";
  if (o.mmmu_open != "official" && o.mmmu_open != "lmms-eval-pr724") {
    fail<ConfigError>("--mmmu-open must be official or lmms-eval-pr724, got '{}'", o.mmmu_open);
  }
  options.mmmu_official_open = o.mmmu_open == "official";
  options.seed = 0;  // lmms-eval's default --seed: random.seed(0) before the first document
  return options;
}

// The per-item records and the aggregates of one multimodal benchmark, as results.json and samples_<task>.jsonl
// hold them.
Json mm_result_json(const eval::mm::BenchResult& r, const std::string& file, size_t rows, double seconds) {
  return {{"task", eval::mm::benchmark_name(r.benchmark)},
          {"rules", eval::mm::rules_name(r.rules)},
          {"source", file},
          {"rows", rows},
          {"headline_metric", r.headline_metric},
          {"headline", r.headline},
          {"aggregate", r.aggregate},
          {"seconds", seconds}};
}

Json mm_sample_json(const eval::mm::ItemResult& item) {
  return {{"source", item.source}, {"index", item.index},   {"id", item.id},        {"prediction", item.prediction},
          {"parsed", item.parsed}, {"score", item.score},   {"detail", item.detail}};
}

// `eval --predictions FILE --tasks NAME`: a benchmark's predictions (VLMEvalKit's TSV with a prediction column, or
// lmms-eval's rows with their outputs) scored again under either toolkit's rules, without a model.
int run_rescore(const EvalCliOptions& o, const std::vector<std::string>& argv) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!o.model.empty() || !o.adapters.empty()) {
    fail<ConfigError>("--predictions re-scores a predictions file without a model: drop --model and --adapters");
  }
  const std::vector<std::string> specs = split_list(o.tasks);
  if (specs.size() != 1 || specs.front().find('=') != std::string::npos) {
    fail<ConfigError>("--predictions takes one benchmark name in --tasks ({}); the predictions file is its data, got '{}'",
                      fmt::join(eval::mm::benchmark_names(), ", "), o.tasks);
  }
  const auto benchmark = eval::mm::parse_benchmark(specs.front());
  if (!benchmark) {
    fail<ConfigError>("--tasks '{}' is not a multimodal benchmark --predictions can score ({})", specs.front(),
                      fmt::join(eval::mm::benchmark_names(), ", "));
  }
  if (o.log_samples && o.output_dir.empty()) fail<ConfigError>("--log-samples needs --output-dir DIR");
  if (!o.output_dir.empty()) {
    check_output_folder(o.output_dir, "--output-dir");
    refuse_existing_output((fs::path(o.output_dir) / "results.json").string(), "--output-dir's", o.overwrite);
  }
  const eval::mm::ScoreOptions options = mm_score_options(o);
  const eval::mm::BenchData data = eval::mm::read_benchmark(o.predictions, *benchmark, /*keep_images=*/false);
  const eval::mm::BenchResult result = eval::mm::score_benchmark(data, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << eval::mm::result_markdown(result) << std::flush;
  std::cerr << fmt::format("[{}: {} rows of {} scored by {} rules in {:.2f} s; {} {:.4f}]\n", specs.front(),
                           data.items.size(), o.predictions, eval::mm::rules_name(options.rules), seconds,
                           result.headline_metric, result.headline);
  if (!o.output_dir.empty()) {
    const fs::path dir = o.output_dir;
    create_folders(dir);
    Json out = {{"mm_results", Json::array({mm_result_json(result, o.predictions, data.items.size(), seconds)})},
                {"config",
                 {{"predictions", o.predictions},
                  {"tasks", specs},
                  {"rules", o.rules},
                  {"reasoning_tags", o.reasoning_tags},
                  {"mmmu_open", o.mmmu_open}}},
                {"date", utc_now_iso8601()},
                {"swiftcpp_version", kVersion},
                {"command_line", argv}};
    write_file_atomic(dir / "results.json", out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
    if (o.log_samples) {
      std::string text;
      for (const auto& item : result.items) text += mm_sample_json(item).dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
      write_file_atomic(dir / ("samples_" + safe_name(specs.front()) + ".jsonl"), text);
    }
    std::cerr << fmt::format("[results written to {}]\n", (dir / "results.json").string());
  }
  return 0;
}

// A task's progress bar on stderr, made at the first report (when the total is known): items (or windows) done and
// their rate since the bar was made.
class TaskProgress {
 public:
  TaskProgress(std::string task, std::string unit, bool tty)
      : task_(std::move(task)), unit_(std::move(unit)), tty_(tty), start_(std::chrono::steady_clock::now()) {}
  eval::EvalProgress callback() {
    return [this](int64_t done, int64_t total) {
      if (!bar_) {
        bar_ = std::make_unique<ProgressBar>(std::max<int64_t>(total, 1), std::cerr, tty_, std::max<int64_t>(total / 10, 1));
        bar_->set_line_width(terminal_columns(stderr));
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      ProgressStats stats;
      stats.elapsed_s = s;
      stats.unit = unit_;
      stats.fields = fmt::format("{} | {:.2f} {}s/s", task_, done / std::max(s, 1e-9), unit_);
      bar_->update(done, stats);
    };
  }
  void finish() {
    if (bar_) bar_->finish();
  }

 private:
  std::string task_, unit_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<ProgressBar> bar_;
};

struct MmTask {
  std::string name;  // as --tasks wrote it
  eval::mm::Benchmark benchmark;
  std::string file;
  eval::mm::BenchData data;
};

struct MmRun {
  eval::mm::BenchResult result;
  std::vector<std::string> predictions;
  int64_t new_tokens = 0;
  double seconds = 0;
};

// --limit N: the first N rows; for MMBench the first N questions with all their rotations (circular scoring
// needs every one).
eval::mm::BenchData limit_rows(eval::mm::BenchData data, const std::optional<int64_t>& limit) {
  if (!limit) return data;
  if (*limit < 1) fail<ConfigError>("--limit must be >= 1, got {}", *limit);
  std::vector<bool> keep(data.items.size(), false);
  if (data.benchmark == eval::mm::Benchmark::kMMBench) {
    std::vector<int64_t> questions;
    for (const auto& item : data.items) {
      if (item.index < 1000000) questions.push_back(item.index);
    }
    std::sort(questions.begin(), questions.end());
    if (static_cast<int64_t>(questions.size()) > *limit) questions.resize(static_cast<size_t>(*limit));
    const std::set<int64_t> kept(questions.begin(), questions.end());
    for (size_t i = 0; i < data.items.size(); ++i) keep[i] = kept.count(data.items[i].index % 1000000) > 0;
  } else {
    for (size_t i = 0; i < data.items.size() && static_cast<int64_t>(i) < *limit; ++i) keep[i] = true;
  }
  eval::mm::BenchData out = data;
  out.items.clear();
  out.cells.clear();
  out.docs.clear();
  for (size_t i = 0; i < data.items.size(); ++i) {
    if (!keep[i]) continue;
    out.items.push_back(data.items[i]);
    if (i < data.cells.size()) out.cells.push_back(data.cells[i]);
    if (i < data.docs.size()) out.docs.push_back(data.docs[i]);
  }
  return out;
}

// A multimodal benchmark run on the model: each row's default prompt (per the rules' toolkit) with its images,
// greedy generation, then the toolkit's scoring.
MmRun run_mm_task(eval::Evaluator& evaluator, MmTask& task, const eval::mm::ScoreOptions& options,
                  const EvalCliOptions& o, bool tty) {
  const auto start = std::chrono::steady_clock::now();
  const auto images = eval::mm::benchmark_images(task.data);
  std::vector<eval::GenerationItem> items;
  for (size_t i = 0; i < task.data.items.size(); ++i) {
    const auto& row = task.data.items[i];
    eval::GenerationItem item;
    item.context = eval::mm::prompt_text(eval::mm::benchmark_prompt(row, task.benchmark, options.rules));
    item.source = row.source;
    item.images = images[i];
    items.push_back(std::move(item));
  }
  eval::GenerationSpec spec;
  spec.max_new_tokens = o.max_new_tokens.value_or(128);
  std::cerr << fmt::format("[{}: {} rows from {}, {} prompts, {} new tokens at most]\n", task.name, items.size(), task.file,
                           eval::mm::rules_name(options.rules), spec.max_new_tokens);
  TaskProgress progress(task.name, "item", tty);
  const eval::Generations generated = evaluator.generate(task.name, items, spec, progress.callback());
  progress.finish();
  MmRun run;
  for (size_t i = 0; i < generated.outputs.size(); ++i) {
    run.predictions.push_back(generated.outputs[i].text);
    task.data.items[i].prediction = generated.outputs[i].text;
    run.new_tokens += generated.outputs[i].new_tokens;
  }
  run.result = eval::mm::score_benchmark(task.data, options);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << fmt::format("[{}: {} items, {} prompt and {} new tokens in {:.2f} s ({:.2f} s preparing): {:.2f} items/s; "
                           "{} {:.4f}]\n",
                           task.name, items.size(), generated.prompt_tokens, run.new_tokens, run.seconds,
                           generated.encode_seconds, static_cast<double>(items.size()) / std::max(run.seconds, 1e-9),
                           run.result.headline_metric, run.result.headline);
  return run;
}

int run_eval(const EvalCliOptions& o, const std::vector<std::string>& argv) {
  if (!o.predictions.empty()) return run_rescore(o, argv);
  if (o.model.empty()) fail<ConfigError>("--model is required (or --predictions FILE to re-score predictions)");
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> specs = split_list(o.tasks);
  if (specs.empty()) fail<ConfigError>("--tasks is empty; built-in tasks: {}", fmt::join(eval::builtin_task_names(), ", "));
  if (o.log_samples && o.output_dir.empty()) fail<ConfigError>("--log-samples needs --output-dir DIR");
  // Outputs are checked before any work: they may only replace a regular file (never a device or FIFO), and the
  // folder they go in must be a folder.
  if (!o.dump_requests.empty()) check_output_file(o.dump_requests, "--dump-requests");
  if (!o.output_dir.empty()) check_output_folder(o.output_dir, "--output-dir");
  // One rule for every writer: an existing output is replaced only with --overwrite, refused before any work.
  refuse_existing_output(o.dump_requests, "--dump-requests", o.overwrite);
  if (!o.output_dir.empty()) {
    refuse_existing_output((fs::path(o.output_dir) / "results.json").string(), "--output-dir's", o.overwrite);
  }
  if (o.add_bos != "auto" && o.add_bos != "true" && o.add_bos != "false") {
    fail<ConfigError>("--add-bos must be auto, true or false, got '{}'", o.add_bos);
  }
  {
    // --template picks the chat template of --apply-chat-template, or of multimodal benchmarks (always chat turns).
    bool multimodal = false;
    for (const auto& spec : specs) {
      multimodal = multimodal || (spec.find('=') != std::string::npos && eval::mm::parse_benchmark(spec.substr(0, spec.find('='))));
    }
    if (!o.chat_template.empty() && !o.apply_chat_template && !multimodal) {
      fail<ConfigError>("--template needs --apply-chat-template (or a multimodal benchmark NAME=FILE in --tasks)");
    }
  }

  // Read every task before loading the model, so bad data fails fast.
  eval::TaskOptions task_options;
  task_options.num_fewshot = o.num_fewshot;
  task_options.limit = o.limit;
  task_options.seed = o.seed;
  // Multimodal benchmarks (NAME=FILE with NAME one of pope, mmbench, ...) are generated and scored by their
  // toolkit's rules; the rest are lm-eval tasks.
  std::vector<MmTask> mm_tasks;
  std::vector<std::string> text_specs;
  for (const auto& spec : specs) {
    const size_t eq = spec.find('=');
    const auto benchmark = eval::mm::parse_benchmark(spec.substr(0, eq));
    if (!benchmark) {
      text_specs.push_back(spec);
      continue;
    }
    if (eq == std::string::npos) {
      fail<ConfigError>("--tasks {}: a multimodal benchmark is NAME=FILE, FILE its VLMEvalKit TSV or lmms-eval rows "
                        "(.jsonl)", spec);
    }
    mm_tasks.push_back({spec.substr(0, eq), *benchmark, spec.substr(eq + 1), {}});
  }
  for (const auto& spec : text_specs) eval::check_task_name(spec);
  const eval::mm::ScoreOptions mm_options = mm_score_options(o);
  for (auto& t : mm_tasks) t.data = limit_rows(eval::mm::read_benchmark(t.file, t.benchmark), o.limit);
  std::vector<eval::Task> tasks;
  for (const auto& spec : text_specs) tasks.push_back(eval::load_task(spec, o.data_dir, task_options));
  if (o.max_new_tokens) {
    if (*o.max_new_tokens < 1) fail<ConfigError>("--max-new-tokens must be >= 1, got {}", *o.max_new_tokens);
    for (auto& t : tasks) t.generation.max_new_tokens = *o.max_new_tokens;
  }

  LoadOptions load;
  load.device = parse_device(o.device);
  load.dtype = parse_dtype(o.dtype);
  load.quantized_kernels = true;  // eval only runs the model
  install_memory_tracking();
  SessionOptions open;
  open.model = o.model;
  open.tokenizer = o.tokenizer;
  open.chat_template = o.chat_template;
  open.load = load;
  const ModelSession session = ModelSession::open(open);  // tokenizer and templates (a GGUF's: --tokenizer)
  CausalLM model = session.model;
  if (!o.adapters.empty()) {
    const LoraConfig adapter = load_adapter(model, o.adapters);
    std::cerr << fmt::format("[adapter {}: r {}, alpha {}{}]\n", o.adapters, adapter.r, adapter.lora_alpha,
                             adapter.use_dora ? ", DoRA" : "");
  }
  model->eval();
  auto tokenizer = session.tokenizer;

  eval::EvalOptions options;
  options.scorer.batch_size = o.batch_size;
  options.scorer.max_length = o.max_length > 0 ? o.max_length : model->config().max_position_embeddings;
  if (options.scorer.max_length <= 0) options.scorer.max_length = 2048;
  if (o.add_bos != "auto") options.add_bos = o.add_bos == "true";
  options.stride = o.stride;
  options.log_samples = o.log_samples;
  options.keep_requests = !o.dump_requests.empty();
  options.model_dir = session.assets_dir;  // preprocessor_config.json for tasks with images
  if (session.images) options.images = std::make_shared<const ImageEncoding>(*session.images);
  std::string template_name;
  if (o.apply_chat_template) {
    template_name = session.template_name;
    if (template_name.empty()) {
      fail<ConfigError>("--apply-chat-template: {} has no chat template (name one with --template)", o.model);
    }
    options.chat_template = session.chat_template;
  }
  eval::Evaluator evaluator(model, tokenizer, options);
  for (const auto& task : tasks) evaluator.check(task);  // an image task on a text model fails before any scoring
  // Multimodal benchmarks are posed as one user turn of the chat template, as both toolkits pose them.
  eval::EvalOptions mm_eval_options = options;
  mm_eval_options.chat_template = session.chat_template;
  eval::Evaluator mm_evaluator(model, tokenizer, mm_eval_options);
  for (const auto& t : mm_tasks) {
    eval::Task probe;
    probe.name = t.name;
    probe.has_images = true;
    mm_evaluator.check(probe);
  }

  std::vector<eval::TaskResult> results;
  const bool tty = stream_is_tty(stderr);
  for (const auto& task : tasks) {
    std::cerr << fmt::format("[{}: {} {} from {}{}]\n", task.name,
                             task.kind == eval::TaskKind::kPerplexity ? task.documents.size()
                             : task.kind == eval::TaskKind::kGeneration ? task.generation_items.size()
                                                                        : task.choice_items.size(),
                             task.kind == eval::TaskKind::kPerplexity ? "documents" : "items", task.source,
                             task.num_fewshot > 0 ? fmt::format(", {}-shot", task.num_fewshot) : "");
    // The bar starts at the first batch's end; the task started before tokenising.
    TaskProgress progress(task.name, task.kind == eval::TaskKind::kPerplexity ? "window" : "item", tty);
    results.push_back(evaluator.run(task, progress.callback()));
    progress.finish();
  }
  std::vector<MmRun> mm_runs;
  for (auto& t : mm_tasks) mm_runs.push_back(run_mm_task(mm_evaluator, t, mm_options, o, tty));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!results.empty()) std::cout << eval::results_markdown(results) << std::flush;
  for (const auto& run : mm_runs) std::cout << eval::mm::result_markdown(run.result) << std::flush;
  for (const auto& r : results) {
    const bool documents = r.kind == eval::TaskKind::kPerplexity;
    std::cerr << fmt::format("[{}: {} {}, {} {}, {} tokens in {:.2f} s ({:.2f} s tokenising): {:.2f} {}/s]\n", r.task,
                             r.items, documents ? "documents" : "items", r.requests, documents ? "windows" : "requests",
                             r.tokens, r.seconds, r.encode_seconds, (documents ? r.requests : r.items) / std::max(r.seconds, 1e-9),
                             documents ? "windows" : "items");
  }
  std::cerr << "[" << peak_memory_summary(load.device) << "]\n";

  if (!o.dump_requests.empty()) {
    std::string text;
    for (const auto& r : results) {
      for (const auto& q : r.scored) text += Json({{"task", r.task}, {"context", q.context}, {"continuations", q.continuations}}).dump() + "\n";
    }
    write_file_atomic(o.dump_requests, text);
  }
  if (!o.output_dir.empty()) {
    const fs::path dir = o.output_dir;
    create_folders(dir);
    Json task_info = Json::array();
    for (const auto& r : results) {
      task_info.push_back({{"task", r.task},
                           {"kind", eval::task_kind_name(r.kind)},
                           {"source", r.source},
                           {"fewshot_source", r.fewshot_source},
                           {"num_fewshot", r.num_fewshot},
                           {"items", r.items},
                           {"requests", r.requests},
                           {"tokens", r.tokens},
                           {"seconds", r.seconds},
                           {"encode_seconds", r.encode_seconds},
                           {"items_per_s", r.items / std::max(r.seconds, 1e-9)}});
    }
    Json config = {{"model", o.model},
                   {"adapters", o.adapters.empty() ? Json(nullptr) : Json(o.adapters)},
                   {"tasks", specs},
                   {"data_dir", o.data_dir},
                   {"num_fewshot", o.num_fewshot ? Json(*o.num_fewshot) : Json(nullptr)},
                   {"limit", o.limit ? Json(*o.limit) : Json(nullptr)},
                   {"batch_size", o.batch_size},
                   {"max_length", options.scorer.max_length},
                   {"stride", o.stride},
                   {"max_new_tokens", o.max_new_tokens ? Json(*o.max_new_tokens) : Json(nullptr)},
                   {"add_bos", o.add_bos},
                   {"chat_template", template_name.empty() ? Json(nullptr) : Json(template_name)},
                   {"seed", o.seed},
                   {"rules", o.rules},
                   {"reasoning_tags", o.reasoning_tags},
                   {"mmmu_open", o.mmmu_open},
                   {"device", o.device},
                   {"dtype", o.dtype}};
    Json mm_json = Json::array();
    for (size_t i = 0; i < mm_runs.size(); ++i) {
      const auto& run = mm_runs[i];
      Json r = mm_result_json(run.result, mm_tasks[i].file, mm_tasks[i].data.items.size(), run.seconds);
      r["generated_tokens"] = run.new_tokens;
      r["items_per_s"] = static_cast<double>(mm_tasks[i].data.items.size()) / std::max(run.seconds, 1e-9);
      const std::string name = safe_name(mm_tasks[i].name);
      const std::string predictions =
          "predictions_" + name + (mm_tasks[i].data.layout == "vlmevalkit" ? ".tsv" : ".jsonl");
      eval::mm::write_predictions(mm_tasks[i].data, run.predictions, dir / predictions);
      r["predictions"] = (dir / predictions).string();
      mm_json.push_back(r);
      if (o.log_samples) {
        std::string text;
        for (size_t k = 0; k < run.result.items.size(); ++k) {
          Json sample = mm_sample_json(run.result.items[k]);
          text += sample.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
        }
        write_file_atomic(dir / ("samples_" + name + ".jsonl"), text);
      }
    }
    Json out = {{"results", eval::metrics_json(results)},
                {"mm_results", mm_json},
                {"tasks", task_info},
                {"config", config},
                {"model", o.model},
                {"adapter", o.adapters.empty() ? Json(nullptr) : Json(o.adapters)},
                {"seed", o.seed},
                {"date", utc_now_iso8601()},
                {"elapsed_s", elapsed},
                {"swiftcpp_version", kVersion},
                {"command_line", argv}};
    write_file_atomic(dir / "results.json", out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
    if (o.log_samples) {
      for (const auto& r : results) {
        std::string text;
        for (const auto& s : r.samples) text += s.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
        write_file_atomic(dir / ("samples_" + safe_name(r.task) + ".jsonl"), text);
      }
    }
    std::cerr << fmt::format("[results written to {}]\n", (dir / "results.json").string());
  }
  return 0;
}

}  // namespace

CommandRun add_eval_command(CLI::App& root, const GlobalOptions&, const std::vector<std::string>& argv) {
  auto o = std::make_shared<EvalCliOptions>();
  CLI::App* cmd = root.add_subcommand("eval", "Evaluate a model on MMLU, ARC, HellaSwag, GSM8K, perplexity, custom tasks "
                                      "or multimodal benchmarks; re-score multimodal predictions");
  cmd->add_option("--model", o->model, "Hugging Face model folder, or a .gguf file (required unless --predictions)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--tokenizer", o->tokenizer, "Hugging Face folder with the tokenizer of a GGUF --model (default: the "
                  "file's folder)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--adapters", o->adapters, "PEFT LoRA/DoRA adapter folder applied on top of the model")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--tasks", o->tasks,
                  "Comma-separated: mmlu, mmlu_<subject>, arc_easy, arc_challenge, hellaswag, gsm8k, perplexity; "
                  "NAME=PATH reads a task from PATH; FILE.yaml is a custom task (with image_field: images, for a "
                  "vision-language model); with --predictions, one multimodal benchmark name")
      ->required();
  cmd->add_option("--data-dir", o->data_dir, "Folder holding the task data (docs/eval.md lists the layout)");
  cmd->add_option("--num-fewshot", o->num_fewshot, "Few-shot examples (default: MMLU 5, GSM8K 5, others 0)");
  cmd->add_option("--limit", o->limit, "Evaluate the first N items of each task (of each subject for MMLU)");
  cmd->add_option("--batch-size", o->batch_size, "Items per forward (and prompts per generation batch)")
      ->capture_default_str();
  cmd->add_option("--max-length", o->max_length, "Model input length (default: max_position_embeddings)");
  cmd->add_option("--stride", o->stride, "Perplexity window stride (default: max length, disjoint windows)");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Generation tasks: tokens to generate at most (GSM8K: 256)");
  cmd->add_option("--add-bos", o->add_bos, "auto (the tokenizer's setting), true or false")->capture_default_str();
  cmd->add_flag("--apply-chat-template", o->apply_chat_template, "Pose each prompt as a user turn of the chat template");
  cmd->add_option("--template", o->chat_template, "Chat template name for --apply-chat-template (default: the checkpoint's)");
  cmd->add_option("--output-dir", o->output_dir, "Write results.json (and samples_<task>.jsonl) here");
  cmd->add_flag("--overwrite", o->overwrite, "Replace an existing --output-dir results.json or --dump-requests file");
  cmd->add_flag("--log-samples", o->log_samples, "Write per-item records (prompt, choices, log-likelihoods, prediction)");
  cmd->add_option("--dump-requests", o->dump_requests,
                  "Write the token ids of every request scored: multiple-choice items and perplexity windows (JSON Lines: "
                  "task, context, continuations)");
  cmd->add_option("--seed", o->seed, "Seed of few-shot sampling where examples come from the evaluated split")
      ->capture_default_str();
  cmd->add_option("--predictions", o->predictions,
                  "Re-score a multimodal benchmark's predictions without a model: VLMEvalKit's TSV with a prediction "
                  "column, or lmms-eval rows (.jsonl); --tasks names the benchmark (pope, mmbench, scienceqa_img, mmmu, "
                  "textvqa, chartqa)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rules", o->rules, "Multimodal scoring rules: vlmevalkit or lmms-eval")->capture_default_str();
  cmd->add_option("--reasoning-tags", o->reasoning_tags,
                  "lmms-eval rules: default (strip <think> and <analysis> blocks, as its CLI does) or none")
      ->capture_default_str();
  cmd->add_option("--mmmu-open", o->mmmu_open,
                  "lmms-eval rules, MMMU open questions: official (every parsed candidate compared) or lmms-eval-pr724 "
                  "(one candidate kept, as lmms-eval scored them from PR #724 until its fix)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "float32, bfloat16 or float16")->capture_default_str();
  return [o, argv]() { return run_eval(*o, argv); };
}

}  // namespace swiftcpp::app
