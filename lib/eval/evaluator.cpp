#include "eval/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <list>
#include <map>
#include <numeric>

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/encode.h"
#include "infer/generate.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"
#include "vision/processor.h"

namespace swiftcpp::eval {

namespace {

// Items of an image task whose images are held in memory at once: multiple-choice items are scored in chunks of
// this many (each chunk still batched and sorted longest first), so pixel values never pile up for a whole task.
constexpr size_t kImageItemsPerChunk = 256;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Json image_names(const std::vector<ImageRef>& images) {
  Json out = Json::array();
  for (const auto& image : images) out.push_back(image.name());
  return out;
}

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

std::vector<int64_t> to_int64(const std::vector<int>& ids) { return std::vector<int64_t>(ids.begin(), ids.end()); }

MetricResult metric(const std::string& task, const std::string& name, const MeanStderr& m, int shots,
                    const std::string& level = "task") {
  return {task, name, m.mean, m.stderr_, m.n, shots, level};
}

// A result filled with what the task itself says.
TaskResult start_result(const Task& task, int64_t items) {
  TaskResult r;
  r.task = task.name;
  r.kind = task.kind;
  r.source = task.source;
  r.fewshot_source = task.fewshot_source;
  r.num_fewshot = task.num_fewshot;
  r.items = items;
  if (items == 0) fail<FormatError>("task {}: nothing to evaluate in {}", task.name, task.source);
  return r;
}

}  // namespace

Evaluator::Evaluator(CausalLM model, std::shared_ptr<const TextTokenizer> tokenizer, EvalOptions options)
    : model_(model), tokenizer_(std::move(tokenizer)), options_(std::move(options)), scorer_(model, options_.scorer) {
  options_.scorer = scorer_.options();  // max_length resolved and checked against the model's context
  add_bos_ = options_.add_bos.value_or(tokenizer_->specials().add_bos) && tokenizer_->specials().bos.has_value();
  if (options_.add_bos.value_or(false) && !tokenizer_->specials().bos) {
    fail<ConfigError>("--add-bos: the tokenizer has no BOS token");
  }
  if (options_.stride < 0 || options_.stride > options_.scorer.max_length) {
    fail<ConfigError>("--stride must be in [0, max length {}], got {}", options_.scorer.max_length, options_.stride);
  }
}

std::vector<int64_t> Evaluator::encode(const std::string& text) const {
  std::vector<int64_t> ids = to_int64(tokenizer_->encode_with_special_tokens(text));
  if (add_bos_) {
    const int64_t bos = *tokenizer_->specials().bos;
    if (ids.empty() || ids.front() != bos) ids.insert(ids.begin(), bos);
  }
  return ids;
}

LoglikelihoodRequest Evaluator::encode_request(const std::string& context,
                                               const std::vector<std::string>& continuations) const {
  // lm-eval's pair encoding: trailing whitespace of the context moves to the continuation, the pair is encoded
  // whole, and the continuation is whatever follows the length of the context's own encoding.
  const size_t end = context.find_last_not_of(" \t\n\r\f\v");
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  const std::string ctx = context.substr(0, keep), moved = context.substr(keep);
  LoglikelihoodRequest request;
  request.context = encode(ctx);
  for (const auto& continuation : continuations) {
    const std::vector<int64_t> whole = encode(ctx + moved + continuation);
    const size_t split = std::min(request.context.size(), whole.size());
    request.continuations.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(split), whole.end());
  }
  if (request.context.empty()) {
    // lm-eval's prefix token for an empty context: BOS, else the end-of-text token.
    if (tokenizer_->specials().bos) request.context.push_back(*tokenizer_->specials().bos);
    else if (!tokenizer_->specials().eos.empty()) request.context.push_back(tokenizer_->specials().eos.front());
    else fail<ConfigError>("an empty context needs a BOS or EOS token to start from; the tokenizer has neither");
  }
  return request;
}

void Evaluator::check(const Task& task) {
  if (!task.has_images || images_) return;
  const MultimodalConfig* mm = model_->config().multimodal.get();
  if (mm == nullptr) {
    fail<ConfigError>("task {}: its items have images (image_field), but the model is a text model ({}); image "
                      "tasks need a vision-language model such as llava", task.name, model_->config().model_type);
  }
  if (options_.model_dir.empty()) {
    fail<ConfigError>("task {}: images need the model folder (its preprocessor_config.json) to prepare them",
                      task.name);
  }
  const std::vector<int> ids = tokenizer_->encode_with_special_tokens(mm->image_markup);
  if (std::count(ids.begin(), ids.end(), static_cast<int>(mm->image_token_index)) != 1) {
    fail<ConfigError>("task {}: the tokenizer of {} does not encode the image markup '{}' to the model's image token "
                      "{} (image_token_index) once but to [{}]; add it to the tokenizer's added tokens", task.name,
                      options_.model_dir.string(), mm->image_markup, mm->image_token_index, fmt::join(ids, ", "));
  }
  images_ = options_.images ? options_.images
                            : std::make_shared<const ImageEncoding>(
                                  make_image_encoding(options_.model_dir, *mm, options_.image_overrides));
}

namespace {
// An item's image opened (its header read, no pixel decoded), with the settings' pixel limit.
PlannedImage plan_item_image(const ImageRef& image, const ImageEncoding& settings) {
  if (!image.bytes) return plan_image_file(image.file, settings);
  const int64_t max_pixels = settings.max_pixels > 0 ? settings.max_pixels : vision::kMaxImagePixels;
  return plan_image(vision::open_image_bytes(*image.bytes, image.origin, max_pixels), settings);
}
}  // namespace

std::vector<int64_t> Evaluator::expand_images(std::vector<int64_t> ids, const std::vector<ImageRef>& files,
                                              const std::string& source) const {
  const MultimodalConfig* mm = model_->config().multimodal.get();
  if (mm == nullptr) return ids;
  const int64_t image_id = mm->image_token_index;
  const auto tokens = std::count(ids.begin(), ids.end(), image_id);
  if (tokens != static_cast<std::ptrdiff_t>(files.size())) {
    fail<FormatError>("{}: the prompt encodes to {} image token(s) ({}) for {} image(s)", source, tokens,
                      kImagePlaceholder, files.size());
  }
  if (files.empty()) return ids;
  // Fixed-count families know each image's positions; others count them from the image's header (no pixel is
  // decoded until the item is scored, so an item too long for max_length is refused first).
  std::vector<int64_t> counts(files.size(), mm->image_seq_length);
  if (mm->image_seq_length < 1) {
    if (!images_) fail<ConfigError>("{}: images without image settings (Evaluator::check was not run)", source);
    for (size_t i = 0; i < files.size(); ++i) {
      try {
        counts[i] = plan_item_image(files[i], *images_).tokens;
      } catch (const IoError& e) {
        fail<IoError>("{}: {}", source, e.what());
      } catch (const FormatError& e) {
        fail<FormatError>("{}: {}", source, e.what());
      }
    }
  }
  std::vector<int64_t> out;
  size_t image = 0;
  for (int64_t id : ids) {
    if (id == image_id) out.insert(out.end(), static_cast<size_t>(counts[image++]), id);
    else out.push_back(id);
  }
  return out;
}

Evaluator::LoadedImages Evaluator::load_images(const std::vector<ImageRef>& files, const std::string& source) const {
  if (files.empty()) return {};
  if (!images_) fail<ConfigError>("{}: images without image settings (Evaluator::check was not run)", source);
  Sample out;
  LoadedImages loaded;
  for (const ImageRef& file : files) {
    // The decoder's message names the file; the item's data file:line is put in front.
    auto where = [&](const Error& e) {
      const std::string what = e.what();
      return what.find(file.name()) == std::string::npos ? fmt::format("{}: image {}: {}", source, file.name(), what)
                                                         : fmt::format("{}: {}", source, what);
    };
    try {
      vision::ProcessedImage image = process_planned_image(plan_item_image(file, *images_), *images_);
      out.pixel_values.push_back(std::move(image.pixel_values));  // [C, H, W] | [patches, C T P P]
      if (images_->processor->variable_size()) out.image_grids.push_back(image.grid_thw);
      loaded.tokens.push_back(image.tokens);
    } catch (const IoError& e) {
      fail<IoError>("{}", where(e));
    } catch (const FormatError& e) {
      fail<FormatError>("{}", where(e));
    }
  }
  loaded.inputs = batch_images({&out});
  return loaded;
}

std::string Evaluator::image_markup(std::string text) const {
  const MultimodalConfig* mm = model_->config().multimodal.get();
  if (mm == nullptr || mm->image_markup == kImagePlaceholder) return text;
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(kImagePlaceholder); at != std::string::npos; at = text.find(kImagePlaceholder, from)) {
    out.append(text, from, at - from);
    out += mm->image_markup;
    from = at + kImagePlaceholder.size();
  }
  return out.append(text, from, std::string::npos);
}

std::string Evaluator::prompt_text(const std::string& context) const {
  if (!options_.chat_template) return context;
  return options_.chat_template->render_text({{"user", context, std::nullopt}}, true);
}

TaskResult Evaluator::run(const Task& task, const EvalProgress& progress) {
  check(task);
  switch (task.kind) {
    case TaskKind::kMultipleChoice: return run_choice(task, progress);
    case TaskKind::kGeneration: return run_generation(task, progress);
    case TaskKind::kPerplexity: return run_perplexity(task, progress);
  }
  fail<Error>("unknown task kind");
}

TaskResult Evaluator::run_choice(const Task& task, const EvalProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  TaskResult r = start_result(task, static_cast<int64_t>(task.choice_items.size()));

  // One request per item: its context encoded once, each choice's continuation as lm-eval splits the pair.
  std::vector<LoglikelihoodRequest> requests;
  for (const ChoiceItem& item : task.choice_items) {
    std::vector<std::string> continuations;
    for (const auto& choice : item.choices) continuations.push_back(item.delimiter + choice);
    requests.push_back(encode_request(image_markup(prompt_text(item.context)), continuations));
    requests.back().context = expand_images(std::move(requests.back().context), item.images, item.source);
    for (size_t j = 0; j < item.choices.size(); ++j) {
      if (requests.back().continuations[j].empty()) {
        fail<FormatError>("{}: the choice \"{}\" encodes to no tokens after its context", item.source, item.choices[j]);
      }
      r.tokens += static_cast<int64_t>(requests.back().continuations[j].size());
    }
    r.tokens += static_cast<int64_t>(requests.back().context.size());
    r.requests += static_cast<int64_t>(item.choices.size());
  }
  r.encode_seconds = seconds_since(t0);
  std::vector<std::vector<ContinuationScore>> scores;
  if (!task.has_images) {
    scores = scorer_.score(requests, [&](size_t done) {
      if (progress) progress(static_cast<int64_t>(done), r.items);
    });
  } else {
    // Chunks of items with their pixel values; each chunk's images are freed after it is scored.
    for (size_t start = 0; start < requests.size(); start += kImageItemsPerChunk) {
      const size_t end = std::min(requests.size(), start + kImageItemsPerChunk);
      for (size_t i = start; i < end; ++i) {
        const LoadedImages loaded = load_images(task.choice_items[i].images, task.choice_items[i].source);
        requests[i].pixel_values = loaded.inputs.pixel_values;
        requests[i].image_grid_thw = loaded.inputs.image_grid_thw;
      }
      const std::vector<LoglikelihoodRequest> chunk(requests.begin() + static_cast<std::ptrdiff_t>(start),
                                                    requests.begin() + static_cast<std::ptrdiff_t>(end));
      for (size_t i = start; i < end; ++i) requests[i].pixel_values = requests[i].image_grid_thw = at::Tensor();
      auto part = scorer_.score(chunk, [&](size_t done) {
        if (progress) progress(static_cast<int64_t>(start + done), r.items);
      });
      for (auto& p : part) scores.push_back(std::move(p));
    }
  }

  std::vector<double> acc, acc_norm;
  std::map<std::string, std::vector<double>> by_group;
  for (size_t i = 0; i < task.choice_items.size(); ++i) {
    const ChoiceItem& item = task.choice_items[i];
    std::vector<double> lls;
    for (const auto& s : scores[i]) lls.push_back(s.loglikelihood);
    const ChoiceOutcome o = decide_choice(lls, item.choices, item.gold);
    acc.push_back(o.correct ? 1.0 : 0.0);
    acc_norm.push_back(o.correct_norm ? 1.0 : 0.0);
    if (!item.group.empty()) by_group[item.group].push_back(o.correct ? 1.0 : 0.0);
    if (options_.log_samples) {
      Json greedy = Json::array();
      for (const auto& s : scores[i]) greedy.push_back(s.greedy);
      r.samples.push_back({{"doc_id", i},
                           {"source", item.source},
                           {"group", item.group},
                           {"prompt", prompt_text(item.context)},
                           {"choices", item.choices},
                           {"delimiter", item.delimiter},
                           {"loglikelihoods", lls},
                           {"is_greedy", greedy},
                           {"gold", item.gold},
                           {"pred", o.pred},
                           {"pred_norm", o.pred_norm},
                           {"acc", o.correct ? 1 : 0},
                           {"acc_norm", o.correct_norm ? 1 : 0}});
      if (task.has_images) r.samples.back()["images"] = image_names(item.images);
    }
  }
  if (options_.keep_requests) r.scored = std::move(requests);
  r.metrics.push_back(metric(task.name, "acc", mean_stderr(acc), task.num_fewshot));
  if (by_group.empty()) {
    r.metrics.push_back(metric(task.name, "acc_norm", mean_stderr(acc_norm), task.num_fewshot));
  } else {
    // MMLU: the task figure above is the mean over questions (lm-eval's size-weighted group mean); also the
    // macro average over subjects, each category, and each subject.
    std::vector<double> subject_means;
    double var_sum = 0;
    std::map<std::string, std::vector<double>> by_category;
    std::vector<MetricResult> subjects;
    for (const auto& [group, values] : by_group) {
      const MeanStderr m = mean_stderr(values);
      subject_means.push_back(m.mean);
      var_sum += std::isfinite(m.stderr_) ? m.stderr_ * m.stderr_ : 0.0;
      subjects.push_back(metric(task.name + "_" + group, "acc", m, task.num_fewshot, "subtask"));
      const auto c = task.categories.find(group);
      auto& bucket = by_category[c == task.categories.end() ? "other (unmapped)" : c->second];
      bucket.insert(bucket.end(), values.begin(), values.end());
    }
    MeanStderr macro;
    macro.n = static_cast<int64_t>(subject_means.size());
    macro.mean = std::accumulate(subject_means.begin(), subject_means.end(), 0.0) / static_cast<double>(macro.n);
    macro.stderr_ = std::sqrt(var_sum) / static_cast<double>(macro.n);
    r.metrics.push_back(metric(task.name, "acc_macro", macro, task.num_fewshot));
    for (const auto& [category, values] : by_category) {
      std::string name = category;
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return c == ' ' ? '_' : std::tolower(c); });
      r.metrics.push_back(metric(task.name + "_" + name, "acc", mean_stderr(values), task.num_fewshot, "group"));
    }
    r.metrics.insert(r.metrics.end(), subjects.begin(), subjects.end());
  }
  r.seconds = seconds_since(t0);
  return r;
}

Generations Evaluator::generate(const std::string& task, const std::vector<GenerationItem>& items,
                                 const GenerationSpec& spec, const EvalProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Generations r;
  const int64_t budget = options_.scorer.max_length - spec.max_new_tokens;
  if (budget < 1) {
    fail<ConfigError>("task {}: max length {} leaves no room for a prompt before {} new tokens", task,
                      options_.scorer.max_length, spec.max_new_tokens);
  }
  // Prompts cut from the left to max_length - max_new_tokens tokens, as lm-eval does.
  std::vector<std::vector<int64_t>> prompts;
  bool any_images = false;
  for (const auto& item : items) {
    std::vector<int64_t> ids = encode(image_markup(prompt_text(item.context)));
    if (ids.empty()) fail<FormatError>("{}: the prompt encodes to no tokens", item.source);
    ids = expand_images(std::move(ids), item.images, item.source);
    any_images = any_images || !item.images.empty();
    if (static_cast<int64_t>(ids.size()) > budget) {
      const auto cut_end = ids.end() - budget;
      if (!item.images.empty() && std::find(ids.begin(), cut_end, model_->config().multimodal->image_token_index) != cut_end) {
        fail<ConfigError>("{}: the prompt with its images ({} tokens) must lose {} from the left to leave room for {} new "
                          "tokens in max length {}, which would cut into its images; raise the max length", item.source,
                          ids.size(), ids.size() - static_cast<size_t>(budget), spec.max_new_tokens,
                          options_.scorer.max_length);
      }
      ids.erase(ids.begin(), cut_end);
    }
    r.prompt_tokens += static_cast<int64_t>(ids.size());
    prompts.push_back(std::move(ids));
  }
  r.encode_seconds = seconds_since(t0);
  GenerationConfig config;
  config.max_new_tokens = spec.max_new_tokens;
  config.sampling.temperature = 0.0;
  config.stop_strings = spec.stop;
  for (int id : tokenizer_->specials().eos) config.eos_ids.push_back(id);
  Generator generator(model_, tokenizer_);
  // Prompts run longest first. With images, prompts that show the same images run one after another (a
  // benchmark's rotations, or its questions about one photo), longest first among them, and each distinct image
  // set goes through the vision tower once: its features are kept for the last few sets.
  std::vector<std::string> image_keys(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    for (const ImageRef& image : items[i].images) {
      image_keys[i] += (image.bytes ? fmt::format("@{}", static_cast<const void*>(image.bytes.get())) : image.file.string()) + "\n";
    }
  }
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (any_images && image_keys[a] != image_keys[b]) return image_keys[a] < image_keys[b];
    return prompts[a].size() > prompts[b].size();
  });
  r.outputs.resize(prompts.size());
  const size_t B = static_cast<size_t>(options_.scorer.batch_size);
  struct Encoded {
    ImageInputs inputs;  // the grids (variable-size images); pixel values dropped once encoded
    at::Tensor features;
  };
  std::list<std::pair<std::string, Encoded>> recent;  // most recent first
  const size_t keep = std::max<size_t>(2 * B, 16);
  auto encoded = [&](size_t i) -> const Encoded& {
    const std::string& key = image_keys[i];
    for (auto it = recent.begin(); it != recent.end(); ++it) {
      if (it->first == key) {
        recent.splice(recent.begin(), recent, it);
        return recent.front().second;
      }
    }
    Encoded e;
    e.inputs = load_images(items[i].images, items[i].source).inputs;
    if (!e.inputs.empty()) {
      c10::InferenceMode guard;
      e.features = model_->vision()->encode(e.inputs.pixel_values.to(model_->device()), e.inputs.image_grid_thw);
      e.inputs.pixel_values = at::Tensor();
    }
    recent.emplace_front(key, std::move(e));
    if (recent.size() > keep) recent.pop_back();
    return recent.front().second;
  };
  for (size_t start = 0; start < order.size(); start += B) {
    const size_t end = std::min(order.size(), start + B);
    std::vector<std::vector<int64_t>> batch;
    std::vector<ImageInputs> images;      // per prompt: the grids of variable-size images
    std::vector<at::Tensor> features;     // per prompt: its images through the tower; empty for a text task
    for (size_t i = start; i < end; ++i) {
      batch.push_back(prompts[order[i]]);
      if (!any_images) continue;
      const Encoded& e = encoded(order[i]);
      images.push_back(e.inputs);
      features.push_back(e.features);
    }
    auto out = generator.generate(batch, config, {}, images, features);
    for (size_t i = start; i < end; ++i) {
      auto& o = r.outputs[order[i]];
      o.new_tokens = static_cast<int64_t>(out[i - start].new_ids.size());
      o.text = std::move(out[i - start].text);
      o.finish_reason = std::move(out[i - start].finish_reason);
    }
    if (progress) progress(static_cast<int64_t>(end), static_cast<int64_t>(items.size()));
  }
  return r;
}

TaskResult Evaluator::run_generation(const Task& task, const EvalProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  TaskResult r = start_result(task, static_cast<int64_t>(task.generation_items.size()));
  const GenerationSpec& spec = task.generation;
  const Generations generated = generate(task.name, task.generation_items, spec, progress);
  const auto& outputs = generated.outputs;
  r.tokens = generated.prompt_tokens;
  for (const auto& o : outputs) r.tokens += o.new_tokens;
  r.encode_seconds = generated.encode_seconds;
  r.requests = r.items;

  std::vector<std::vector<double>> scores(spec.filters.size());
  for (size_t i = 0; i < task.generation_items.size(); ++i) {
    const GenerationItem& item = task.generation_items[i];
    const std::string reference = normalize_answer(item.target, spec.ignore_regexes, spec.ignore_case);
    Json extracted = Json::object();
    Json matched = Json::object();
    for (size_t f = 0; f < spec.filters.size(); ++f) {
      const std::string answer = extract_answer(outputs[i].text, spec.filters[f]);
      const bool ok = normalize_answer(answer, spec.ignore_regexes, spec.ignore_case) == reference;
      scores[f].push_back(ok ? 1.0 : 0.0);
      extracted[spec.filters[f].name] = answer;
      matched[spec.filters[f].name] = ok ? 1 : 0;
    }
    if (options_.log_samples) {
      r.samples.push_back({{"doc_id", i},
                           {"source", item.source},
                           {"prompt", prompt_text(item.context)},
                           {"response", outputs[i].text},
                           {"finish_reason", outputs[i].finish_reason},
                           {"target", item.target},
                           {"extracted", extracted},
                           {"exact_match", matched}});
      if (task.has_images) r.samples.back()["images"] = image_names(item.images);
    }
  }
  for (size_t f = 0; f < spec.filters.size(); ++f) {
    const std::string name = spec.filters[f].name == "none" ? "exact_match" : "exact_match," + spec.filters[f].name;
    r.metrics.push_back(metric(task.name, name, mean_stderr(scores[f]), task.num_fewshot));
  }
  r.seconds = seconds_since(t0);
  return r;
}

TaskResult Evaluator::run_perplexity(const Task& task, const EvalProgress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  TaskResult r = start_result(task, static_cast<int64_t>(task.documents.size()));
  const int64_t L = options_.scorer.max_length;
  const int64_t stride = options_.stride > 0 ? options_.stride : L;
  // Each document is [prefix] + its tokens, the prefix (BOS, else EOS) predicting the first token, as lm-eval's
  // loglikelihood_rolling does; windows of every document are scored together.
  int64_t prefix = -1;
  if (tokenizer_->specials().bos) prefix = *tokenizer_->specials().bos;
  else if (!tokenizer_->specials().eos.empty()) prefix = tokenizer_->specials().eos.front();
  else fail<ConfigError>("perplexity needs a BOS or EOS token to predict a document's first token from");
  std::vector<LoglikelihoodRequest> windows;
  std::vector<size_t> owner;
  PerplexityStats total;
  std::vector<PerplexityStats> per_doc(task.documents.size());
  for (size_t d = 0; d < task.documents.size(); ++d) {
    std::vector<int64_t> tokens = to_int64(tokenizer_->encode(task.documents[d].text));
    tokens.insert(tokens.begin(), prefix);
    per_doc[d].tokens = static_cast<int64_t>(tokens.size()) - 1;
    per_doc[d].words = count_words(task.documents[d].text);
    per_doc[d].bytes = static_cast<int64_t>(task.documents[d].text.size());
    for (auto& w : rolling_windows(tokens, L, stride)) {
      r.tokens += static_cast<int64_t>(w.context.size() + w.continuations[0].size() - 1);
      windows.push_back(std::move(w));
      owner.push_back(d);
    }
  }
  r.requests = static_cast<int64_t>(windows.size());
  r.encode_seconds = seconds_since(t0);
  const auto scores = scorer_.score(windows, [&](size_t done) {
    if (progress) progress(static_cast<int64_t>(done), static_cast<int64_t>(windows.size()));
  });
  for (size_t w = 0; w < windows.size(); ++w) per_doc[owner[w]].loglikelihood += scores[w][0].loglikelihood;
  if (options_.keep_requests) r.scored = std::move(windows);
  for (size_t d = 0; d < per_doc.size(); ++d) {
    total.loglikelihood += per_doc[d].loglikelihood;
    total.tokens += per_doc[d].tokens;
    total.words += per_doc[d].words;
    total.bytes += per_doc[d].bytes;
    if (options_.log_samples) {
      r.samples.push_back({{"doc_id", d},
                           {"source", task.documents[d].source},
                           {"loglikelihood", per_doc[d].loglikelihood},
                           {"tokens", per_doc[d].tokens},
                           {"words", per_doc[d].words},
                           {"bytes", per_doc[d].bytes}});
    }
  }
  const int64_t n = r.items;
  const double nan = std::nan("");
  r.metrics.push_back({task.name, "word_perplexity", total.word_perplexity(), nan, n, 0, "task"});
  r.metrics.push_back({task.name, "byte_perplexity", total.byte_perplexity(), nan, n, 0, "task"});
  r.metrics.push_back({task.name, "bits_per_byte", total.bits_per_byte(), nan, n, 0, "task"});
  r.metrics.push_back({task.name, "token_perplexity", total.token_perplexity(), nan, n, 0, "task"});
  r.metrics.push_back({task.name, "nll_per_token", -total.loglikelihood / static_cast<double>(total.tokens), nan, n, 0, "task"});
  r.seconds = seconds_since(t0);
  return r;
}

std::string results_markdown(const std::vector<TaskResult>& results) {
  std::string out = "| Task | Metric | Value | Stderr | n | Shots |\n|---|---|---:|---:|---:|---:|\n";
  for (const auto& r : results) {
    for (const auto& m : r.metrics) {
      const std::string name = m.level == "task" ? m.task : (m.level == "group" ? " - " : "    - ") + m.task;
      out += fmt::format("| {} | {} | {:.4f} | {} | {} | {} |\n", name, m.metric, m.value,
                         std::isfinite(m.stderr_) ? fmt::format("{:.4f}", m.stderr_) : "N/A", m.n, m.num_fewshot);
    }
  }
  return out;
}

Json metrics_json(const std::vector<TaskResult>& results) {
  Json out = Json::array();
  for (const auto& r : results) {
    for (const auto& m : r.metrics) {
      out.push_back({{"task", m.task},
                     {"metric", m.metric},
                     {"value", number_or_null(m.value)},
                     {"stderr", number_or_null(m.stderr_)},
                     {"n", m.n},
                     {"num_fewshot", m.num_fewshot},
                     {"level", m.level}});
    }
  }
  return out;
}

}  // namespace swiftcpp::eval
