// `swiftcpp infer`: text generation from a Hugging Face model folder.
#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <numeric>
#include <sstream>

#include "apps/swiftcpp/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "nn/attention.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::app {

namespace {

struct InferOptions {
  std::string model;
  std::string prompt;
  bool has_prompt = false;
  std::string prompts_file;
  std::string output;
  bool interactive = false;
  int64_t max_new_tokens = 256;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  double min_p = 0.0;
  std::optional<double> repetition_penalty;
  uint64_t seed = 42;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string device = "cpu";
  std::string dtype = "float32";
  std::string attention = "auto";
  int64_t batch_size = 8;
  std::string output_logits;
  bool no_stream = false;
  bool echo = false;
};

// Sampling defaults come from the checkpoint's generation_config.json (as Hugging Face generate() does);
// command-line values win.
SamplingParams sampling_from(const InferOptions& o, const fs::path& model_dir) {
  SamplingParams p;
  const fs::path gen = model_dir / "generation_config.json";
  if (fs::exists(gen)) {
    const JsonObject g = JsonObject::load(gen);
    const bool do_sample = g.get_or<bool>("do_sample", true);
    p.temperature = do_sample ? g.get_or<double>("temperature", 1.0) : 0.0;
    p.top_k = g.get_or<int64_t>("top_k", 0);
    p.top_p = g.get_or<double>("top_p", 1.0);
    p.repetition_penalty = g.get_or<double>("repetition_penalty", 1.0);
  }
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  p.min_p = o.min_p;
  p.seed = o.seed;
  p.validate();
  return p;
}

nn::AttentionBackend parse_backend(const std::string& name) {
  if (name == "auto") return nn::AttentionBackend::kAuto;
  if (name == "math") return nn::AttentionBackend::kMath;
  if (name == "sdpa") return nn::AttentionBackend::kSdpa;
  fail<ConfigError>("--attention must be auto, math or sdpa, got '{}'", name);
}

// "\n", "\t" and "\\" in a command-line string become a newline, a tab and a backslash.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[i + 1];
      if (c == 'n' || c == 't' || c == '\\') {
        out += c == 'n' ? '\n' : c == 't' ? '\t' : '\\';
        ++i;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One prompt, streamed to stdout.
int run_single(Generator& gen, const GenerationConfig& config, const InferOptions& o, const std::string& prompt) {
  const std::vector<int64_t> ids = gen.encode_prompt(prompt);
  if (o.echo) std::cout << prompt << std::flush;
  const auto t0 = std::chrono::steady_clock::now();
  TextCallback stream;
  if (!o.no_stream) stream = [](size_t, const std::string& piece) { std::cout << piece << std::flush; };
  const auto results = gen.generate({ids}, config, stream);
  const double elapsed = seconds_since(t0);
  if (o.no_stream) std::cout << results[0].text;
  std::cout << std::endl;
  std::cerr << fmt::format("[{} prompt tokens, {} new tokens in {:.3f} s ({:.1f} tokens/s), finish: {}]",
                           ids.size(), results[0].new_ids.size(), elapsed,
                           results[0].new_ids.size() / std::max(elapsed, 1e-9), results[0].finish_reason)
            << std::endl;
  return 0;
}

// A JSONL file of prompts, generated in length-sorted batches, written as JSONL in input order.
int run_file(Generator& gen, const GenerationConfig& config, const InferOptions& o) {
  if (o.output.empty()) fail<ConfigError>("--prompts-file needs --output FILE.jsonl");
  if (o.batch_size < 1) fail<ConfigError>("--batch-size must be >= 1, got {}", o.batch_size);
  std::istringstream in(read_text_file(o.prompts_file));
  std::vector<Json> rows;
  std::vector<std::vector<int64_t>> prompts;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", o.prompts_file, number);
    JsonObject row(parse_json(line, where), where);
    std::string text;
    if (row.has("prompt")) text = row.get<std::string>("prompt");
    else if (row.has("text")) text = row.get<std::string>("text");
    else fail<FormatError>("{}: expected a string field 'prompt' (or 'text')", where);
    prompts.push_back(gen.encode_prompt(text));
    rows.push_back(row.raw());
  }
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prompts[a].size() < prompts[b].size(); });
  std::vector<GenerationResult> results(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  size_t new_tokens = 0;
  for (size_t start = 0; start < order.size(); start += o.batch_size) {
    const size_t end = std::min(order.size(), start + static_cast<size_t>(o.batch_size));
    std::vector<std::vector<int64_t>> batch;
    for (size_t i = start; i < end; ++i) batch.push_back(prompts[order[i]]);
    auto out = gen.generate(batch, config);
    for (size_t i = start; i < end; ++i) {
      new_tokens += out[i - start].new_ids.size();
      results[order[i]] = std::move(out[i - start]);
    }
    std::cerr << fmt::format("\r[{}/{} prompts]", end, order.size()) << std::flush;
  }
  std::string text;
  for (size_t i = 0; i < rows.size(); ++i) {
    Json out = rows[i];
    out["response"] = results[i].text;
    out["finish_reason"] = results[i].finish_reason;
    out["prompt_tokens"] = results[i].prompt_ids.size();
    out["completion_tokens"] = results[i].new_ids.size();
    text += out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  }
  write_file_atomic(o.output, text);
  const double elapsed = seconds_since(t0);
  std::cerr << fmt::format("\r[{} prompts, {} new tokens in {:.2f} s ({:.1f} tokens/s) -> {}]", rows.size(),
                           new_tokens, elapsed, new_tokens / std::max(elapsed, 1e-9), o.output)
            << std::endl;
  return 0;
}

// A read-eval loop on stdin. Each line is a prompt of its own; multi-turn chat needs a chat template.
int run_interactive(Generator& gen, const GenerationConfig& config, const InferOptions& o) {
  std::cerr << "swiftcpp interactive: type a prompt and press Enter; /exit or end of input quits." << std::endl;
  std::string line;
  while (true) {
    std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    run_single(gen, config, o, line);
  }
  return 0;
}

int run_infer(const InferOptions& o) {
  const int modes = (o.has_prompt ? 1 : 0) + (o.prompts_file.empty() ? 0 : 1) + (o.interactive ? 1 : 0);
  if (modes != 1) fail<ConfigError>("give exactly one of --prompt, --prompts-file or --interactive");
  if (!o.output_logits.empty() && !o.has_prompt) fail<ConfigError>("--output-logits needs --prompt");
  nn::set_attention_backend(parse_backend(o.attention));
  LoadOptions load;
  load.device = parse_device(o.device);
  load.dtype = parse_dtype(o.dtype);
  const fs::path model_dir = o.model;
  const auto t0 = std::chrono::steady_clock::now();
  CausalLM model = load_causal_lm(model_dir, load);
  auto tokenizer = load_tokenizer(model_dir);
  std::cerr << fmt::format("[loaded {} ({} layers, hidden {}) on {} as {} in {:.2f} s]", model_dir.string(),
                           model->config().num_hidden_layers, model->config().hidden_size, o.device, o.dtype,
                           seconds_since(t0))
            << std::endl;
  Generator gen(model, tokenizer);

  GenerationConfig config;
  config.max_new_tokens = o.max_new_tokens;
  config.sampling = sampling_from(o, model_dir);
  for (const auto& stop : o.stop) config.stop_strings.push_back(unescape(stop));
  if (!o.ignore_eos) {
    for (int id : tokenizer->specials().eos) config.eos_ids.push_back(id);
  }

  if (!o.output_logits.empty()) {
    const std::vector<int64_t> ids = gen.encode_prompt(o.prompt);
    const at::Tensor logits = gen.prompt_logits(ids);  // [T, V]
    save_safetensors(o.output_logits, {{"input_ids", at::tensor(ids, at::kLong)}, {"logits", logits}},
                     {{"model", model_dir.string()}, {"dtype", o.dtype}});
    std::cerr << fmt::format("[wrote logits [{}, {}] to {}]", logits.size(0), logits.size(1), o.output_logits)
              << std::endl;
  }
  if (o.interactive) return run_interactive(gen, config, o);
  if (!o.prompts_file.empty()) return run_file(gen, config, o);
  return run_single(gen, config, o, o.prompt);
}

}  // namespace

CommandRun add_infer_command(CLI::App& root, const GlobalOptions&) {
  auto o = std::make_shared<InferOptions>();
  CLI::App* cmd = root.add_subcommand("infer", "Generate text with a model (KV cache, sampling, streaming)");
  cmd->add_option("--model", o->model, "Hugging Face model folder (config.json, safetensors, tokenizer)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option_function<std::string>("--prompt", [o](const std::string& p) { o->prompt = p; o->has_prompt = true; },
                                        "Prompt text (an empty prompt starts from BOS alone)");
  cmd->add_option("--prompts-file", o->prompts_file, "JSONL file of {\"prompt\": ...} rows, generated in batches")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output", o->output, "JSONL file for --prompts-file results (rows + response)");
  cmd->add_flag("--interactive,-i", o->interactive, "Read prompts from stdin in a loop");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy (default from generation_config.json, else 1)");
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", o->min_p, "Drop tokens below min_p * p_max (0: off)")->capture_default_str();
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "CTRL repetition penalty (1: off)");
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--stop", o->stop, "Stop string (repeatable; \\n, \\t, \\\\ are unescaped); generation ends before it")
      ->allow_extra_args(false);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the EOS token");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "float32, bfloat16 or float16")->capture_default_str();
  cmd->add_option("--attention", o->attention, "auto, math (matmul/softmax) or sdpa (LibTorch 2.x)")
      ->capture_default_str();
  cmd->add_option("--batch-size", o->batch_size, "Prompts per batch with --prompts-file")->capture_default_str();
  cmd->add_option("--output-logits", o->output_logits, "Write the prompt's full logits [T, V] to a safetensors file");
  cmd->add_flag("--no-stream", o->no_stream, "Print the text when done instead of token by token");
  cmd->add_flag("--echo", o->echo, "Print the prompt before the generated text");
  return [o]() { return run_infer(*o); };
}

}  // namespace swiftcpp::app
