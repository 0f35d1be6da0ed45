// `swiftcpp infer`: text generation from a Hugging Face model folder.
#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <numeric>
#include <sstream>

#include "apps/swiftcpp/commands.h"
#include "quant/gguf_model.h"
#include "peft/lora.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/memory.h"
#include "data/encode.h"
#include "infer/generate.h"
#include "infer/session.h"
#include "template/template.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "nn/attention.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp::app {

namespace {

struct InferOptions {
  ModelOptions m;
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
  std::string attention = "auto";
  int64_t batch_size = 8;
  std::string output_logits;
  bool overwrite = false;  // replace an existing --output / --output-logits
  bool no_stream = false;
  bool echo = false;
  std::string system;
  std::string adapters;       // PEFT adapter folder applied on top of the model (not merged)
  std::vector<std::string> images;  // --image, in order (vision-language models)
};

std::vector<int64_t> ids_of(const EncodedPrompt& p) { return std::vector<int64_t>(p.ids.begin(), p.ids.end()); }

// The prompt's images as one forward takes them (empty for none).
ImageInputs pixels_of(const EncodedPrompt& p) { return p.batched_images(); }

// Sampling defaults come from the checkpoint's generation_config.json (as Hugging Face generate() does);
// command-line values win.
// Sampling defaults come from the checkpoint's generation_config.json (as Hugging Face generate() does);
// command-line values win.
SamplingParams sampling_from(const InferOptions& o, const SamplingParams& defaults) {
  SamplingParams p = defaults;
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
std::string run_single(Generator& gen, const GenerationConfig& config, const InferOptions& o,
                       const EncodedPrompt& encoded, const std::string& prompt) {
  if (o.echo) std::cout << prompt << std::flush;
  const auto t0 = std::chrono::steady_clock::now();
  TextCallback stream;
  if (!o.no_stream) stream = [](size_t, const std::string& piece) { std::cout << piece << std::flush; };
  const std::vector<int64_t> ids = ids_of(encoded);
  const auto results = gen.generate({ids}, config, stream, {pixels_of(encoded)});
  const double elapsed = seconds_since(t0);
  if (o.no_stream) std::cout << results[0].text;
  std::cout << std::endl;
  std::cerr << fmt::format("[{} prompt tokens, {} new tokens in {:.3f} s ({:.1f} tokens/s), finish: {}]",
                           ids.size(), results[0].new_ids.size(), elapsed,
                           results[0].new_ids.size() / std::max(elapsed, 1e-9), results[0].finish_reason)
            << std::endl;
  std::cerr << "[" << peak_memory_summary(gen.model()->device()) << "]" << std::endl;
  return results[0].text;
}

// A JSONL file of prompts, generated in length-sorted batches, written as JSONL in input order.
int run_file(Generator& gen, const GenerationConfig& config, const InferOptions& o, const ModelSession& prompter) {
  if (o.output.empty()) fail<ConfigError>("--prompts-file needs --output FILE.jsonl");
  if (o.batch_size < 1) fail<ConfigError>("--batch-size must be >= 1, got {}", o.batch_size);
  std::istringstream in(read_text_file(o.prompts_file));
  std::vector<Json> rows;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<ImageInputs> images;  // per prompt (empty for none)
  std::string line;
  const fs::path base = fs::path(o.prompts_file).parent_path();
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", o.prompts_file, number);
    JsonObject row(parse_json(line, where), where);
    // "images": a path or a list of paths, relative to the prompts file's folder.
    std::vector<fs::path> paths;
    if (row.has("images")) {
      const Json& v = row.raw().at("images");
      const auto add = [&](const Json& p) {
        if (!p.is_string()) fail<FormatError>("{}: 'images' must be a path or a list of paths, got {}", where, describe_json(p));
        const fs::path path = p.get<std::string>();
        paths.push_back(path.is_absolute() ? path : base / path);
      };
      if (v.is_array()) {
        for (const auto& p : v) add(p);
      } else {
        add(v);
      }
    }
    EncodedPrompt encoded;
    const auto encode = [&](const auto& what) {
      try {
        return prompter.prompt(what, paths);
      } catch (const Error& e) {
        fail<FormatError>("{}: {}", where, e.what());
      }
    };
    if (row.has("messages")) {
      if (!prompter.chat()) fail<ConfigError>("{}: 'messages' rows need a chat template (--template NAME)", where);
      std::vector<ChatMessage> turns;
      for (const auto& m : row.raw().at("messages")) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m.at("role").is_string() ||
            !m.at("content").is_string()) {
          fail<FormatError>("{}: each message needs string 'role' and 'content'", where);
        }
        turns.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>(), std::nullopt});
      }
      if (turns.empty() || turns.back().role != "user") fail<FormatError>("{}: 'messages' must end with a user turn", where);
      encoded = encode(turns);
    } else {
      std::string text;
      if (row.has("prompt")) text = row.get<std::string>("prompt");
      else if (row.has("text")) text = row.get<std::string>("text");
      else fail<FormatError>("{}: expected a string field 'prompt' (or 'text', or a 'messages' list)", where);
      encoded = encode(text);
    }
    prompts.push_back(ids_of(encoded));
    images.push_back(pixels_of(encoded));
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
    std::vector<ImageInputs> batch_images;
    for (size_t i = start; i < end; ++i) {
      batch.push_back(prompts[order[i]]);
      batch_images.push_back(images[order[i]]);
    }
    auto out = gen.generate(batch, config, {}, batch_images);
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

// A read-eval loop on stdin. With a chat template it is a multi-turn chat (/reset forgets the history);
// without one each line is a prompt of its own.
int run_interactive(Generator& gen, const GenerationConfig& config, const InferOptions& o, const ModelSession& prompter) {
  const bool vision = prompter.encode.images.has_value();
  std::cerr << "swiftcpp interactive" << (prompter.chat() ? " chat" : "")
            << ": type and press Enter; /reset clears the conversation"
            << (vision ? ", /image PATH attaches an image to your next message" : "")
            << ", /exit or end of input quits." << std::endl;
  std::vector<ChatMessage> history;
  std::vector<fs::path> history_images;  // every image of the conversation so far, in order
  std::vector<fs::path> pending;         // /image: attached to the next message
  std::string line;
  while (true) {
    std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.clear();
      history_images.clear();
      pending.clear();
      continue;
    }
    if (line.rfind("/image", 0) == 0) {
      const std::string path = line.size() > 7 ? line.substr(7) : "";
      if (!vision) {
        std::cerr << "error: this model takes text only" << std::endl;
      } else if (path.empty() || !fs::is_regular_file(path)) {
        std::cerr << "error: /image needs the path of a JPEG or PNG file" << (path.empty() ? "" : ": " + path + " is not one")
                  << std::endl;
      } else {
        pending.push_back(path);
        std::cerr << fmt::format("[image {} attached to the next message]", path) << std::endl;
      }
      continue;
    }
    try {
      if (!prompter.chat()) {
        run_single(gen, config, o, prompter.prompt(line, pending), line);
        pending.clear();
        continue;
      }
      std::string content = line;
      if (!pending.empty() && count_image_placeholders(content) == 0) {
        for (size_t i = 0; i < pending.size(); ++i) content = std::string(kImagePlaceholder) + "\n" + content;
      }
      std::vector<ChatMessage> turns = history;
      turns.push_back({"user", content, std::nullopt});
      std::vector<fs::path> images = history_images;
      images.insert(images.end(), pending.begin(), pending.end());
      const std::string reply = run_single(gen, config, o, prompter.prompt(turns, images), line);
      history = std::move(turns);
      history.push_back({"assistant", reply, std::nullopt});
      history_images = std::move(images);
      pending.clear();
    } catch (const Error& e) {
      // A bad image or prompt ends this turn, not the session.
      std::cerr << "error: " << e.what() << std::endl;
      pending.clear();
    }
  }
  return 0;
}

int run_infer(const InferOptions& o) {
  const int modes = (o.has_prompt ? 1 : 0) + (o.prompts_file.empty() ? 0 : 1) + (o.interactive ? 1 : 0);
  if (modes != 1) fail<ConfigError>("give exactly one of --prompt, --prompts-file or --interactive");
  if (!o.output_logits.empty() && !o.has_prompt) fail<ConfigError>("--output-logits needs --prompt");
  // Inputs and outputs are checked before the model loads: an input must be a regular file, an output may only
  // replace a regular file (never a device or FIFO), and the folder it goes in must be a folder.
  if (!o.prompts_file.empty()) require_regular_file(o.prompts_file, "--prompts-file");
  if (!o.images.empty() && !o.has_prompt) fail<ConfigError>("--image goes with --prompt (--prompts-file rows carry "
                                                            "'images'; --interactive takes /image PATH)");
  for (const auto& image : o.images) require_regular_file(image, "--image");
  if (!o.output.empty()) check_output_file(o.output, "--output");
  if (!o.output_logits.empty()) check_output_file(o.output_logits, "--output-logits");
  refuse_existing_output(o.output, "--output", o.overwrite);
  refuse_existing_output(o.output_logits, "--output-logits", o.overwrite);
  nn::set_attention_backend(parse_backend(o.attention));
  const SessionOptions open = o.m.session();
  // A .gguf file brings weights and configuration; tokenizer, templates and generation defaults come from a
  // Hugging Face folder (--tokenizer, else the file's own folder), checked against the GGUF's vocabulary.
  const auto t0 = std::chrono::steady_clock::now();
  install_memory_tracking();
  ModelSession prompter = ModelSession::open(open);
  CausalLM model = prompter.model;
  if (!o.adapters.empty()) {
    const LoraConfig adapter = load_adapter(model, o.adapters);
    model->eval();
    std::cerr << fmt::format("[adapter {}: r {}, alpha {}{}]", o.adapters, adapter.r, adapter.lora_alpha,
                             adapter.use_dora ? ", DoRA" : "")
              << std::endl;
  }
  auto tokenizer = prompter.tokenizer;
  std::cerr << fmt::format("[loaded {} ({} layers, hidden {}) on {} as {} in {:.2f} s]", o.m.model,
                           model->config().num_hidden_layers, model->config().hidden_size, o.m.device, o.m.dtype,
                           seconds_since(t0))
            << std::endl;
  Generator gen(model, tokenizer);
  if (!model->config().multimodal && !o.images.empty()) {
    fail<ConfigError>("--image: {} is a text model ({}); images need a vision-language model such as LLaVA or Qwen2-VL", o.m.model,
                      model->config().model_type);
  }
  const std::vector<fs::path> images(o.images.begin(), o.images.end());
  if (!o.system.empty()) {
    if (!prompter.chat()) fail<ConfigError>("--system needs a chat template: the checkpoint has none (--template NAME)");
    prompter.system = o.system;
  }

  GenerationConfig config;
  config.max_new_tokens = o.max_new_tokens;
  config.sampling = sampling_from(o, prompter.defaults);
  for (const auto& stop : o.stop) config.stop_strings.push_back(unescape(stop));
  if (!o.ignore_eos) config.eos_ids = prompter.eos_ids;

  if (!o.output_logits.empty()) {
    const EncodedPrompt encoded = prompter.prompt(o.prompt, images);
    const std::vector<int64_t> ids = ids_of(encoded);
    const at::Tensor logits = gen.prompt_logits(ids, pixels_of(encoded));  // [T, V]
    save_safetensors(o.output_logits, {{"input_ids", at::tensor(ids, at::kLong)}, {"logits", logits}},
                     {{"model", o.m.model}, {"dtype", o.m.dtype}});
    std::cerr << fmt::format("[wrote logits [{}, {}] to {}]", logits.size(0), logits.size(1), o.output_logits)
              << std::endl;
  }
  if (o.interactive) return run_interactive(gen, config, o, prompter);
  if (!o.prompts_file.empty()) return run_file(gen, config, o, prompter);
  run_single(gen, config, o, prompter.prompt(o.prompt, images), o.prompt);
  return 0;
}

}  // namespace

SessionOptions ModelOptions::session() const {
  SessionOptions open;
  open.model = model;
  open.tokenizer = tokenizer;
  open.chat_template = chat_template;
  open.load.device = parse_device(device);
  open.load.dtype = parse_dtype(dtype);
  open.load.quantized_kernels = true;  // infer and deploy only run the model
  if (max_pixels > 0) open.images.max_pixels = max_pixels;
  if (min_pixels > 0) open.images.min_pixels = min_pixels;
  return open;
}

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--model", o.model, "Hugging Face model folder (config.json, safetensors, tokenizer), quantized folder, "
                  "or a .gguf file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--tokenizer", o.tokenizer, "Hugging Face folder with the tokenizer of a GGUF --model (default: the "
                  "file's folder)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--template", o.chat_template,
                  "Chat template (chatml, qwen2_5, llama3, llama2, mistral, gemma, phi3, llava, default, raw); default: the "
                  "checkpoint's, raw text when it has none");
  cmd->add_option("--device", o.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "float32, bfloat16 or float16")->capture_default_str();
  cmd->add_option("--max-pixels", o.max_pixels, "Qwen2-VL: the image processor's max_pixels, over "
                  "preprocessor_config.json's (ms-swift's MAX_PIXELS)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  cmd->add_option("--min-pixels", o.min_pixels, "Qwen2-VL: the image processor's min_pixels")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
}

CommandRun add_infer_command(CLI::App& root, const GlobalOptions&) {
  auto o = std::make_shared<InferOptions>();
  CLI::App* cmd = root.add_subcommand("infer", "Generate text with a model (KV cache, sampling, streaming)");
  add_model_options(cmd, o->m);
  cmd->add_option_function<std::string>("--prompt", [o](const std::string& p) { o->prompt = p; o->has_prompt = true; },
                                        "Prompt text (an empty prompt starts from BOS alone)");
  cmd->add_option("--prompts-file", o->prompts_file, "JSONL file of {\"prompt\": ...} rows (or \"messages\"; \"images\" "
                  "paths relative to the file for vision-language models), generated in batches")
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
  cmd->add_option("--attention", o->attention, "auto, math (matmul/softmax) or sdpa (LibTorch 2.x)")
      ->capture_default_str();
  cmd->add_option("--batch-size", o->batch_size, "Prompts per batch with --prompts-file")->capture_default_str();
  cmd->add_option("--output-logits", o->output_logits, "Write the prompt's full logits [T, V] to a safetensors file");
  cmd->add_flag("--overwrite", o->overwrite, "Replace an existing --output or --output-logits");
  cmd->add_flag("--no-stream", o->no_stream, "Print the text when done instead of token by token");
  cmd->add_flag("--echo", o->echo, "Print the prompt before the generated text");
  cmd->add_option("--system", o->system, "System prompt (needs a chat template)");
  cmd->add_option("--adapters", o->adapters, "PEFT LoRA/DoRA adapter folder applied without merging");
  cmd->add_option("--image", o->images, "Image (JPEG or PNG) for a vision-language model, repeatable; each <image> in "
                  "the prompt takes the next one (without any, they go before the text)")
      ->allow_extra_args(false);
  return [o]() { return run_infer(*o); };
}

}  // namespace swiftcpp::app
