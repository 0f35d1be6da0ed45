#include "train/grpo.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"
#include "data/collate.h"
#include "data/prepare.h"
#include "data/dataset.h"
#include "data/pipeline.h"
#include "data/preference_data.h"
#include "infer/engine.h"
#include "peft/lora.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "train/autocast.h"
#include "train/rlhf.h"

namespace swiftcpp {

// ---------------------------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------------------------

GrpoLossType parse_grpo_loss_type(const std::string& name) {
  if (name == "grpo") return GrpoLossType::kGrpo;
  if (name == "bnpo") return GrpoLossType::kBnpo;
  if (name == "dr_grpo") return GrpoLossType::kDrGrpo;
  if (name == "dapo") return GrpoLossType::kDapo;
  fail<ConfigError>("'loss_type' {} does not apply to rlhf_type grpo: choose grpo, bnpo, dr_grpo or dapo", name);
}

ScaleRewards parse_scale_rewards(const std::string& name) {
  if (name == "group") return ScaleRewards::kGroup;
  if (name == "batch") return ScaleRewards::kBatch;
  if (name == "none") return ScaleRewards::kNone;
  fail<ConfigError>("'scale_rewards' must be group, batch or none, got '{}'", name);
}

std::string to_string(GrpoLossType type) {
  switch (type) {
    case GrpoLossType::kGrpo: return "grpo";
    case GrpoLossType::kBnpo: return "bnpo";
    case GrpoLossType::kDrGrpo: return "dr_grpo";
    case GrpoLossType::kDapo: return "dapo";
  }
  return "grpo";
}

std::string to_string(ScaleRewards scale) {
  switch (scale) {
    case ScaleRewards::kGroup: return "group";
    case ScaleRewards::kBatch: return "batch";
    case ScaleRewards::kNone: return "none";
  }
  return "group";
}

GrpoOptions grpo_options(const TrainConfig& c) {
  if (c.rlhf_type != "grpo") fail<ConfigError>("grpo_options: rlhf_type is '{}', not grpo", c.rlhf_type);
  const TrainConfig d;
  const std::vector<std::pair<const char*, bool>> preference_only = {
      {"label_smoothing", c.label_smoothing != d.label_smoothing}, {"rpo_alpha", c.rpo_alpha.has_value()},
      {"reference_free", c.reference_free}, {"desirable_weight", c.desirable_weight != d.desirable_weight},
      {"undesirable_weight", c.undesirable_weight != d.undesirable_weight},
      {"simpo_gamma", c.simpo_gamma != d.simpo_gamma}, {"cpo_alpha", c.cpo_alpha != d.cpo_alpha},
      {"center_rewards_coefficient", c.center_rewards_coefficient.has_value()},
      {"precompute_ref_log_probs", c.precompute_ref_log_probs}};
  for (const auto& [key, given] : preference_only) {
    if (given) fail<ConfigError>("'{}' does not apply to rlhf_type grpo (a preference-pair key)", key);
  }
  GrpoOptions o;
  o.num_generations = c.num_generations;
  o.max_completion_length = c.max_completion_length;
  o.temperature = c.temperature;
  o.top_p = c.top_p;
  o.top_k = c.top_k;
  o.repetition_penalty = c.repetition_penalty;
  o.beta = c.beta.value_or(0.04);
  o.epsilon = c.epsilon;
  o.epsilon_high = c.epsilon_high.value_or(c.epsilon);
  o.loss_type = c.loss_type.empty() ? GrpoLossType::kGrpo : parse_grpo_loss_type(c.loss_type);
  o.scale_rewards = parse_scale_rewards(c.scale_rewards);
  o.num_iterations = c.num_iterations;
  o.mask_truncated_completions = c.mask_truncated_completions;
  o.log_completions = c.log_completions;
  if (c.reward_funcs.empty()) {
    fail<ConfigError>("'reward_funcs' is required with rlhf_type grpo: one or more of accuracy, format, "
                      "soft_overlong, repetition, cosine, external:COMMAND");
  }
  o.reward_funcs = c.reward_funcs;
  if (!c.reward_weights.empty() && c.reward_weights.size() != c.reward_funcs.size()) {
    fail<ConfigError>("'reward_weights' has {} values for {} reward_funcs: give one weight per function (or none)",
                      c.reward_weights.size(), c.reward_funcs.size());
  }
  o.reward_weights = c.reward_weights.empty() ? std::vector<double>(c.reward_funcs.size(), 1.0) : c.reward_weights;
  RewardSettings& r = o.rewards;
  r.max_completion_length = c.max_completion_length;
  r.soft_max_length = c.soft_max_length;
  r.soft_cache_length = c.soft_cache_length;
  r.repetition_n_grams = c.repetition_n_grams;
  r.repetition_max_penalty = c.repetition_max_penalty;
  r.cosine_min_len_value_wrong = c.cosine_min_len_value_wrong;
  r.cosine_max_len_value_wrong = c.cosine_max_len_value_wrong;
  r.cosine_min_len_value_correct = c.cosine_min_len_value_correct;
  r.cosine_max_len_value_correct = c.cosine_max_len_value_correct;
  r.cosine_max_len = c.cosine_max_len;
  r.timeout_s = c.reward_timeout;
  for (const auto& spec : o.reward_funcs) make_reward_function(spec, r);  // unknown names and bad settings refused now
  const int64_t per_rank = c.per_device_train_batch_size * c.gradient_accumulation_steps;
  if (per_rank % o.num_generations != 0) {
    fail<ConfigError>("per_device_train_batch_size {} x gradient_accumulation_steps {} = {} completions per process "
                      "and step is not a multiple of num_generations {}: a prompt's completions are generated, scored "
                      "and trained in one process's step", c.per_device_train_batch_size,
                      c.gradient_accumulation_steps, per_rank, o.num_generations);
  }
  if (c.save_steps % o.num_iterations != 0) {
    fail<ConfigError>("'save_steps' {} is not a multiple of num_iterations {}: a checkpoint falls between the steps "
                      "that reuse one rollout batch", c.save_steps, o.num_iterations);
  }
  if (!c.ref_model.empty() && c.train_type == "lora") {
    fail<ConfigError>("'ref_model' with train_type lora: the reference of a LoRA policy is its own base model (the "
                      "adapters switched off); drop ref_model, or train with train_type full");
  }
  if (!c.ref_model.empty() && o.beta == 0) {
    fail<ConfigError>("'ref_model' with beta 0: no KL term, so no reference model is used; drop ref_model");
  }
  if (o.beta != 0 && c.train_type == "lora" && !c.modules_to_save.empty()) {
    fail<ConfigError>("'modules_to_save' ({}) with beta {} and LoRA: the reference forward switches the adapters off, "
                      "but fully trained modules keep no copy of their base values; drop modules_to_save or set "
                      "beta: 0", fmt::join(c.modules_to_save, ", "), o.beta);
  }
  if (effective_batching(c) != "padding") {
    fail<ConfigError>("'batching' {}: GRPO runs padded batches of completions; use batching: padding",
                      effective_batching(c));
  }
  if (c.scheduler != "none") fail<ConfigError>("'scheduler' {} does not apply to rlhf_type grpo", c.scheduler);
  if (c.context_parallel_size != 1) {
    fail<ConfigError>("'context_parallel_size' {} does not apply to rlhf_type grpo", c.context_parallel_size);
  }
  if (c.truncation_strategy == "right") {
    fail<ConfigError>("'truncation_strategy' right would cut a prompt's end (its generation prompt): use delete or "
                      "left for rlhf_type grpo");
  }
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// Advantages and loss
// ---------------------------------------------------------------------------------------------------------------

GroupAdvantages group_advantages(const at::Tensor& rewards, int64_t group, ScaleRewards scale,
                                 std::optional<double> batch_std) {
  TORCH_CHECK(group >= 1 && rewards.dim() == 1 && rewards.size(0) % group == 0,
              "group_advantages: ", rewards.size(0), " rewards are not groups of ", group);
  const at::Tensor r = rewards.to(at::kFloat);
  const at::Tensor grouped = r.view({-1, group});                                      // [P, G]
  const at::Tensor mean = grouped.mean(1).repeat_interleave(group);                    // [N]
  GroupAdvantages out;
  out.group_std = group > 1 ? grouped.std(1, /*unbiased=*/true) : at::zeros({grouped.size(0)}, r.options());  // [P]
  out.advantages = r - mean;
  if (scale == ScaleRewards::kGroup) {
    out.advantages = out.advantages / (out.group_std.repeat_interleave(group) + 1e-4);
  } else if (scale == ScaleRewards::kBatch) {
    const double std = batch_std.has_value() ? *batch_std : (r.numel() > 1 ? r.std(/*unbiased=*/true).item<double>() : 0.0);
    out.advantages = out.advantages / (std + 1e-4);
  }
  return out;
}

GrpoLossResult grpo_loss(const GrpoOptions& o, const GrpoLossInputs& in) {
  const at::Tensor mask = in.mask.to(at::kFloat);  // [R, C]
  const at::Tensor off = mask.eq(0);
  // Values outside the mask are set to 0 before any exp, so padding cannot turn the masked sums into NaN.
  const at::Tensor logps = in.logps.masked_fill(off, 0.0);
  const at::Tensor old = in.old_logps.defined() ? in.old_logps.masked_fill(off, 0.0) : logps.detach();
  const at::Tensor adv = in.advantages.to(logps.device(), at::kFloat).unsqueeze(1);  // [R, 1]
  const at::Tensor ratio = at::exp(logps - old);                                      // [R, C]
  const at::Tensor clipped = at::clamp(ratio, 1.0 - o.epsilon, 1.0 + o.epsilon_high);
  at::Tensor per_token = -at::min(ratio * adv, clipped * adv);
  at::Tensor kl;
  if (o.beta != 0) {
    TORCH_CHECK(in.ref_logps.defined(), "grpo_loss: beta ", o.beta, " needs reference log-probabilities");
    const at::Tensor diff = in.ref_logps.masked_fill(off, 0.0) - logps;
    kl = at::exp(diff) - diff - 1;
    per_token = per_token + o.beta * kl;
  }
  const at::Tensor masked = per_token * mask;
  GrpoLossResult out;
  const int64_t R = mask.size(0);
  switch (o.loss_type) {
    case GrpoLossType::kGrpo:
      out.loss = (masked.sum(-1) / mask.sum(-1).clamp_min(1.0)).mean();
      break;
    case GrpoLossType::kBnpo:
      out.loss = masked.sum() / mask.sum().clamp_min(1.0);
      break;
    case GrpoLossType::kDrGrpo:
      out.loss = masked.sum() / static_cast<double>(R * o.max_completion_length);
      break;
    case GrpoLossType::kDapo:
      TORCH_CHECK(in.dapo_tokens > 0, "grpo_loss: dapo needs the step's completion tokens");
      out.loss = masked.sum() / in.dapo_tokens;
      break;
  }
  {
    at::NoGradGuard no_grad;
    const double tokens = std::max(1.0, mask.sum().item<double>());
    const auto masked_mean = [&](const at::Tensor& x) { return (x.to(at::kFloat) * mask).sum().item<double>() / tokens; };
    if (o.beta != 0) out.metrics["kl"] = masked_mean(kl.detach());
    if (in.entropy.defined()) out.metrics["entropy"] = masked_mean(in.entropy);
    const at::Tensor r = ratio.detach();
    const at::Tensor low = r.lt(1.0 - o.epsilon).logical_and(adv.lt(0));
    const at::Tensor high = r.gt(1.0 + o.epsilon_high).logical_and(adv.gt(0));
    out.metrics["clip_ratio/low_mean"] = masked_mean(low);
    out.metrics["clip_ratio/high_mean"] = masked_mean(high);
    out.metrics["clip_ratio/region_mean"] = masked_mean(low.logical_or(high));
  }
  return out;
}

CompletionBatch collate_completions(const std::vector<const std::vector<int64_t>*>& prompts,
                                    const std::vector<const std::vector<int64_t>*>& completions,
                                    const std::vector<int64_t>& counted, int64_t pad_id,
                                    const std::vector<const ImageInputs*>& images) {
  if (prompts.size() != completions.size() || prompts.size() != counted.size() ||
      (!images.empty() && images.size() != prompts.size())) {
    fail<ConfigError>("collate_completions: {} prompts, {} completions, {} counts, {} image sets", prompts.size(),
                      completions.size(), counted.size(), images.size());
  }
  const auto rows = static_cast<int64_t>(prompts.size());
  int64_t C = 0, T = 1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t L = counted[static_cast<size_t>(r)];
    if (L < 0 || L > static_cast<int64_t>(completions[static_cast<size_t>(r)]->size())) {
      fail<ConfigError>("collate_completions: row {} counts {} of its {} completion tokens", r, L,
                        completions[static_cast<size_t>(r)]->size());
    }
    if (prompts[static_cast<size_t>(r)]->empty()) fail<ConfigError>("collate_completions: row {} has an empty prompt", r);
    C = std::max(C, L);
    T = std::max<int64_t>(T, static_cast<int64_t>(prompts[static_cast<size_t>(r)]->size()) + L);
  }
  CompletionBatch b;
  b.input_ids = at::full({rows, T}, pad_id, at::kLong);
  b.key_valid = at::zeros({rows, T}, at::kBool);
  b.targets = at::full({rows, T}, static_cast<int64_t>(kIgnoreIndex), at::kLong);
  b.index = at::zeros({rows, C}, at::kLong);
  b.mask = at::zeros({rows, C}, at::kFloat);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto valid = b.key_valid.accessor<bool, 2>();
  auto targets = b.targets.accessor<int64_t, 2>();
  auto index = b.index.accessor<int64_t, 2>();
  auto mask = b.mask.accessor<float, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& p = *prompts[static_cast<size_t>(r)];
    const auto& c = *completions[static_cast<size_t>(r)];
    const auto P = static_cast<int64_t>(p.size());
    const int64_t L = counted[static_cast<size_t>(r)];
    for (int64_t t = 0; t < P; ++t) ids[r][t] = p[static_cast<size_t>(t)];
    for (int64_t t = 0; t < L; ++t) {
      ids[r][P + t] = c[static_cast<size_t>(t)];
      targets[r][P - 1 + t] = c[static_cast<size_t>(t)];  // position P - 1 + t predicts completion token t
      index[r][t] = P - 1 + t;
      mask[r][t] = 1.0F;
    }
    for (int64_t t = 0; t < P + L; ++t) valid[r][t] = true;
    b.tokens += P + L;
  }
  // Each prompt's images once (rows of one prompt point at the same ImageInputs), and every row's grids in order.
  std::vector<const ImageInputs*> sets;
  std::vector<at::Tensor> grids;
  size_t with_grid = 0, with_images = 0;
  b.row_image_set.assign(static_cast<size_t>(rows), -1);
  for (size_t r = 0; r < images.size(); ++r) {
    const ImageInputs* i = images[r];
    if (i == nullptr || i->empty()) continue;
    ++with_images;
    auto it = std::find(sets.begin(), sets.end(), i);
    if (it == sets.end()) it = sets.insert(sets.end(), i);
    b.row_image_set[r] = static_cast<int64_t>(it - sets.begin());
    if (i->image_grid_thw.defined()) {
      grids.push_back(i->image_grid_thw);
      ++with_grid;
    }
  }
  if (with_grid != 0 && with_grid != with_images) {
    fail<ConfigError>("collate_completions: fixed-size and variable-size images in one batch");
  }
  for (const ImageInputs* i : sets) b.image_sets.push_back(*i);
  if (!grids.empty()) b.image_grid_thw = at::cat(grids);  // [N, 3]
  return b;
}

CompletionLogps completion_logps(CausalLM& model, const CompletionBatch& b, double temperature, bool entropy) {
  const at::Device device = model->device();
  ForwardOptions fo;
  fo.key_valid = b.key_valid.to(device);
  if (!b.image_sets.empty()) {
    // One tower call for every set, then each row takes its set's features: a prompt's images are encoded once
    // for its G completions.
    if (!model->vision()) fail<ConfigError>("images given to the {} model, which takes text only", model->config().model_type);
    std::vector<at::Tensor> pixels, grids;
    std::vector<int64_t> positions;  // per set
    for (const ImageInputs& set : b.image_sets) {
      pixels.push_back(set.pixel_values);
      if (set.image_grid_thw.defined()) grids.push_back(set.image_grid_thw);
      positions.push_back(model->vision()->feature_rows(set.pixel_values, set.image_grid_thw));
    }
    const at::Tensor encoded = model->vision()->encode(at::cat(pixels).to(device),
                                                       grids.empty() ? at::Tensor() : at::cat(grids));
    const std::vector<at::Tensor> per_set =
        encoded.reshape({-1, encoded.size(-1)}).split_with_sizes(positions);  // [positions of set k, D]
    std::vector<at::Tensor> rows;
    for (const int64_t k : b.row_image_set) {
      if (k >= 0) rows.push_back(per_set[static_cast<size_t>(k)]);
    }
    fo.image_features = at::cat(rows);  // [positions of every row, D]
  }
  fo.image_grid_thw = b.image_grid_thw;  // [N, 3] with variable-size images (M-RoPE positions too)
  const at::Tensor hidden = model->hidden_states(b.input_ids.to(device), fo);  // [R, T, D]
  const HeadLogps head = head_logps(model, hidden, b.targets, false, temperature, entropy);
  const at::Tensor index = b.index.to(device);  // [R, C]
  CompletionLogps out;
  out.logps = head.token_logps.gather(1, index);
  if (entropy) out.entropy = head.entropy.gather(1, index);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void bad_row(const std::string& where, const std::string& reason, const std::string& detail = "") {
  throw BadRowError(where, reason, detail);
}

// The messages of a prompt list; image content parts become kImagePlaceholder with their paths in `image_parts`.
std::vector<ChatMessage> messages_of(const Json& list, const std::string& where, std::vector<std::string>& image_parts) {
  if (!list.is_array() || list.empty()) bad_row(where, "no prompt", "an empty or non-list conversation");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !(m["content"].is_string() || m["content"].is_array())) {
      bad_row(where, "bad message", fmt::format("message {} needs a string 'role' and a string or list 'content'", i));
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant") {
      bad_row(where, "bad message", fmt::format("message {} has role '{}' (system, user or assistant)", i, role));
    }
    if (role == "system" && i != 0) bad_row(where, "bad message", fmt::format("message {}: system comes first", i));
    out.push_back({role, message_content_text(m["content"], where, image_parts), std::nullopt});
  }
  return out;
}

}  // namespace

GrpoPrompt normalise_grpo_row(const Json& row, const std::string& where, const fs::path& base_dir) {
  if (!row.is_object()) bad_row(where, "unknown format", "a row must be a JSON object");
  refuse_unsupported_columns(row, where);
  GrpoPrompt p;
  p.where = where;
  std::vector<std::string> consumed;
  const auto has_text = [&](const char* key) { return row.contains(key) && row[key].is_string(); };
  std::vector<std::string> image_parts;
  if (row.contains("messages")) {
    p.messages = messages_of(row["messages"], where, image_parts);
    consumed = {"messages"};
  } else if (row.contains("prompt")) {
    if (row["prompt"].is_string()) {
      p.messages = {{"user", row["prompt"].get<std::string>(), std::nullopt}};
    } else {
      p.messages = messages_of(row["prompt"], where, image_parts);
    }
    consumed = {"prompt"};
  } else if (has_text("query")) {
    p.messages = {{"user", row["query"].get<std::string>(), std::nullopt}};
    consumed = {"query", "response"};
  } else if (has_text("question")) {
    p.messages = {{"user", row["question"].get<std::string>(), std::nullopt}};
    consumed = {"question"};
  } else {
    bad_row(where, "no prompt", "expected 'messages', 'prompt', 'query' or GSM8K's 'question'");
  }
  if (!p.messages.empty() && p.messages.back().role == "assistant") p.messages.pop_back();  // the answer is generated
  if (p.messages.empty() || p.messages.back().role != "user") {
    bad_row(where, "prompt must end with a user turn");
  }
  if (has_text("system") && p.messages.front().role != "system") {
    p.messages.insert(p.messages.begin(), {"system", row["system"].get<std::string>(), std::nullopt});
    consumed.push_back("system");
  }
  p.images = prompt_images(row, p.messages, image_parts, where, base_dir);
  for (const auto& [key, value] : row.items()) {
    if (std::find(consumed.begin(), consumed.end(), key) == consumed.end() && key != "images") p.fields[key] = value;
  }
  if (!p.images.empty()) {  // the reward functions see the files the model saw
    p.fields["images"] = Json::array();
    for (const fs::path& image : p.images) p.fields["images"].push_back(image.string());
  }
  if (row.contains("question") && has_text("answer") && !p.fields.contains("solution")) p.fields["solution"] = row["answer"];
  return p;
}

// ---------------------------------------------------------------------------------------------------------------
// The task
// ---------------------------------------------------------------------------------------------------------------

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A prompt ready to roll out.
struct PromptItem {
  GrpoPrompt prompt;
  std::vector<int64_t> ids;  // image-token runs expanded
  ImageInputs images;        // the prompt's images as one forward takes them; empty without images
  Json messages = Json::array();
  std::string last_user;
};

// One rollout batch of this process: its completions (G per prompt, consecutive), their rewards and advantages,
// and the log-probabilities computed at rollout time.
struct Rollout {
  std::vector<size_t> prompt;                   // [N] index into the prompts
  std::vector<std::vector<int64_t>> tokens;     // [N] generated ids (an ending EOS included)
  std::vector<std::string> texts;               // [N]
  std::vector<int64_t> counted;                 // [N] tokens the loss counts (through the first EOS; 0 if masked)
  std::vector<bool> truncated;                  // [N]
  std::vector<std::vector<double>> func_rewards;  // [F][N]
  at::Tensor rewards;                           // [N] float32 (weighted sum)
  at::Tensor advantages;                        // [N] float32
  at::Tensor old_logps, ref_logps;              // [N, C] float32 on the model's device (when needed)
  double step_tokens = 0;                       // counted tokens of every process's batch (dapo)
  std::map<std::string, double> metrics;        // reward, rewards/<f>/mean, completions/..., time/...
};


double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class GrpoTask : public TrainingTask {
 public:
  explicit GrpoTask(JobContext& job) : job_(job), options_(grpo_options(job.config)) {
    const TrainConfig& c = job.config;
    for (const auto& spec : options_.reward_funcs) rewards_.push_back(make_reward_function(spec, options_.rewards));
    chat_template_ = chat_template_for(*job.tokenizer, c.chat_template);
    pad_id_ = job.tokenizer->specials().pad.value_or(0);
    for (int id : job.tokenizer->specials().eos) eos_ids_.push_back(id);
    PreferenceEncodeOptions encode;
    encode.max_length = std::max<int64_t>(2, c.max_length);
    // Vision-language model: prompts with images as SFT takes them (the processor preprocessor_config.json chose).
    if (job.model->config().multimodal) encode.images = job.assets.images;
    encoder_ = std::make_unique<PreferenceEncoder>(job.tokenizer, chat_template_, encode);
    prompt_limit_ = c.max_prompt_length > 0 ? c.max_prompt_length : c.max_length;
    train_ = load_prompts(c.dataset);
    if (!c.val_dataset.empty()) {
      validation_ = load_prompts(c.val_dataset);
    } else if (c.split_dataset_ratio > 0) {
      std::vector<size_t> order(train_.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937_64 rng(static_cast<uint64_t>(c.seed));
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
      const size_t held = data_detail::validation_rows(c.split_dataset_ratio, train_.size());
      std::vector<PromptItem> kept;
      std::vector<bool> is_held(train_.size(), false);
      for (size_t i = 0; i < held && i < order.size(); ++i) is_held[order[i]] = true;
      for (size_t i = 0; i < train_.size(); ++i) (is_held[i] ? validation_ : kept).push_back(std::move(train_[i]));
      train_ = std::move(kept);
    }
    if (train_.empty()) {
      fail<ConfigError>("no GRPO prompts: all {} rows of {} were skipped or longer than {} tokens", rows_,
                        fmt::join(c.dataset, ", "), prompt_limit_);
    }
    for (const auto* set : {&train_, &validation_}) {
      for (const auto& p : *set) longest_prompt_ = std::max<int64_t>(longest_prompt_, static_cast<int64_t>(p.ids.size()));
    }
    if (options_.beta != 0 && c.train_type == "full") reference_ = load_reference_model(c, job.device);
  }

  size_t size() const override { return train_.size(); }

  std::string describe() const override {
    std::string text = fmt::format("data: {} train prompts, {} validation; {} completions per prompt of up to {} "
                                   "tokens; rewards {}\n", train_.size(), validation_.size(), options_.num_generations,
                                   options_.max_completion_length, fmt::join(options_.reward_funcs, ", "));
    if (const std::string skipped = skipped_.summary(); !skipped.empty()) text += "data: " + skipped + "\n";
    return text;
  }

  void add_fingerprint(Json& f) const override {
    const TrainConfig& c = job_.config;
    f["rlhf_type"] = "grpo";
    f["beta"] = options_.beta;
    f["loss_type"] = to_string(options_.loss_type);
    f["scale_rewards"] = to_string(options_.scale_rewards);
    f["num_generations"] = options_.num_generations;
    f["num_iterations"] = options_.num_iterations;
    f["max_completion_length"] = options_.max_completion_length;
    f["sampling"] = {c.temperature, c.top_p, c.top_k, c.repetition_penalty};
    f["epsilon"] = {options_.epsilon, options_.epsilon_high};
    f["reward_funcs"] = options_.reward_funcs;
    f["reward_weights"] = options_.reward_weights;
    f["ref_model"] = c.ref_model;
  }

  int64_t items_per_step() const override {
    return job_.config.per_device_train_batch_size * job_.config.gradient_accumulation_steps /
           options_.num_generations;
  }
  int64_t steps_per_slice() const override { return options_.num_iterations; }
  bool checkpointable(int64_t global_step) const override { return global_step % options_.num_iterations == 0; }
  std::vector<std::string> plotted_metrics() const override { return {"reward"}; }

  void start(Trainer&, const fs::path& run_dir, bool) override { run_dir_ = run_dir; }

  StepResult step(Trainer& trainer, const StepSlice& slice) override {
    if (!completions_trimmed_) trim_completion_log(slice.global_step);
    StepResult r;
    if (slice.iteration == 0 || !rollout_) {
      std::vector<size_t> items;
      for (size_t i = slice.first; i < slice.last; ++i) items.push_back((*slice.order)[i]);
      rollout_ = std::make_unique<Rollout>(make_rollout(trainer, train_, items, slice.global_step / options_.num_iterations,
                                                        /*train=*/true));
      r.metrics = rollout_->metrics;
      if (options_.log_completions && (slice.global_step + 1) % job_.config.logging_steps == 0) {
        log_completions(slice.global_step + 1, *rollout_, train_);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    train_step(trainer, slice, r);
    r.metrics["time/policy_s"] = seconds_since(t0);
    if (slice.iteration + 1 >= options_.num_iterations) rollout_.reset();
    return r;
  }

  std::map<std::string, double> evaluate(Trainer& trainer) override {
    if (validation_.empty()) return {};
    std::vector<size_t> mine;  // each process its share of the validation prompts
    for (size_t i = 0; i < validation_.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(job_.world)) == job_.rank) mine.push_back(i);
    }
    std::vector<double> sums(2 + 2 * rewards_.size(), 0.0);  // reward sum, count, per function: sum, count
    if (!mine.empty()) {
      const Rollout ro = make_rollout(trainer, validation_, mine, /*generation=*/-1, /*train=*/false);
      const at::Tensor rw = ro.rewards.to(at::kDouble);
      sums[0] = rw.sum().item<double>();
      sums[1] = static_cast<double>(rw.numel());
      for (size_t f = 0; f < rewards_.size(); ++f) {
        for (double v : ro.func_rewards[f]) {
          if (std::isnan(v)) continue;
          sums[2 + 2 * f] += v;
          sums[3 + 2 * f] += 1;
        }
      }
    }
    if (job_.comm) sums = job_.comm->all_reduce_sum(sums);
    std::map<std::string, double> out;
    if (sums[1] > 0) out["eval_reward"] = sums[0] / sums[1];
    for (size_t f = 0; f < rewards_.size(); ++f) {
      if (sums[3 + 2 * f] > 0) out["eval_rewards/" + rewards_[f]->name() + "/mean"] = sums[2 + 2 * f] / sums[3 + 2 * f];
    }
    return out;
  }

 private:
  std::vector<PromptItem> load_prompts(const std::vector<std::string>& specs) {
    std::vector<PromptItem> out;
    const bool strict = job_.config.strict;
    const bool left = job_.config.truncation_strategy == "left";
    for (const auto& spec : specs) {
      const DatasetSource source = parse_dataset_source(spec);
      const fs::path base_dir = source.path.parent_path();  // relative image paths start there
      for_each_row(source, [&](Json&& row, const std::string& where) {
        ++rows_;
        PromptItem item;
        try {
          item.prompt = normalise_grpo_row(row, where, base_dir);
          std::vector<ChatMessage> messages = item.prompt.messages;
          if (!job_.config.system.empty()) {
            if (messages.front().role == "system") messages.erase(messages.begin());
            messages.insert(messages.begin(), {"system", job_.config.system, std::nullopt});
            item.prompt.messages = messages;
          }
          // Too long: dropped, or its last tokens kept (truncation left), never part of an image's run.
          std::optional<EncodedPrompt> encoded =
              encoder_->encode_generation_prompt(messages, item.prompt.images, where, prompt_limit_, left);
          if (!encoded) {
            skipped_.add("longer than max_length");
            return;
          }
          item.ids.assign(encoded->ids.begin(), encoded->ids.end());
          item.images = encoded->batched_images();
        } catch (const BadRowError& e) {
          if (strict) throw;
          skipped_.add(e.reason());
          return;
        }
        for (const auto& m : item.prompt.messages) {
          item.messages.push_back({{"role", m.role}, {"content", m.content}});
          if (m.role == "user") item.last_user = m.content;
        }
        out.push_back(std::move(item));
      }, [&](const std::string& where, const std::string& reason, const std::string& detail) {
        if (strict) throw BadRowError(where, reason, detail);
        ++rows_;
        skipped_.add(reason);
      });
    }
    return out;
  }

  // The completions of `items` (G each, consecutive), scored, with advantages and the rollout-time log-probs.
  // `generation` seeds the sampling (-1: validation, seeded apart).
  Rollout make_rollout(Trainer& trainer, const std::vector<PromptItem>& prompts, const std::vector<size_t>& items,
                       int64_t generation, bool train) {
    Rollout ro;
    CausalLM& model = trainer.model();
    const int64_t G = options_.num_generations;
    const auto n = static_cast<int64_t>(items.size()) * G;
    const auto t0 = std::chrono::steady_clock::now();
    if (n > 0) {  // a process whose share of the epoch's last step is empty still joins the collectives below
      EvalScope eval_mode(model);  // sampled without dropout
      at::NoGradGuard no_grad;
      Engine& engine = engine_for(model, n);
      ro.tokens.assign(static_cast<size_t>(n), {});
      ro.texts.assign(static_cast<size_t>(n), "");
      ro.truncated.assign(static_cast<size_t>(n), false);
      std::vector<uint64_t> ids;
      const uint64_t base = mix64(static_cast<uint64_t>(job_.config.seed) ^ mix64(static_cast<uint64_t>(generation + 2)));
      for (size_t item : items) {
        // The G completions of a prompt share one pixel tensor, so the engine encodes its images once; a fresh
        // alias each rollout, so features of an earlier policy are never reused.
        const ImageInputs& images = prompts[item].images;
        const at::Tensor pixels = images.empty() ? at::Tensor() : images.pixel_values.alias();
        for (int64_t g = 0; g < G; ++g) {
          SequenceRequest request;
          request.prompt = prompts[item].ids;
          request.pixel_values = pixels;
          request.image_grid_thw = images.image_grid_thw;
          request.config.max_new_tokens = options_.max_completion_length;
          request.config.eos_ids = eos_ids_;
          SamplingParams& s = request.config.sampling;
          s.temperature = options_.temperature;
          s.top_p = options_.top_p;
          s.top_k = options_.top_k;
          s.repetition_penalty = options_.repetition_penalty;
          s.seed = mix64(base ^ mix64(static_cast<uint64_t>(item) * 0x100000001B3ULL + static_cast<uint64_t>(g)));
          ids.push_back(engine.add(std::move(request)));
          ro.prompt.push_back(item);
        }
      }
      while (engine.has_work()) {
        for (auto& u : engine.step()) {
          const auto i = static_cast<size_t>(u.id - ids.front());
          ro.tokens[i].insert(ro.tokens[i].end(), u.new_ids.begin(), u.new_ids.end());
          ro.texts[i] += u.text;
          if (u.finish_reason == "length") ro.truncated[i] = true;
        }
      }
    }
    const double rollout_s = seconds_since(t0);
    // Counted tokens: through the first EOS, or all of a truncated completion (none with mask_truncated).
    int64_t generated = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto& t = ro.tokens[static_cast<size_t>(i)];
      generated += static_cast<int64_t>(t.size());
      int64_t count = static_cast<int64_t>(t.size());
      for (size_t k = 0; k < t.size(); ++k) {
        if (std::find(eos_ids_.begin(), eos_ids_.end(), t[k]) != eos_ids_.end()) {
          count = static_cast<int64_t>(k) + 1;
          break;
        }
      }
      if (ro.truncated[static_cast<size_t>(i)] && options_.mask_truncated_completions) count = 0;
      ro.counted.push_back(count);
    }
    // Rewards.
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<RewardSample> samples;
    for (int64_t i = 0; i < n; ++i) {
      const PromptItem& p = prompts[ro.prompt[static_cast<size_t>(i)]];
      RewardSample s;
      s.prompt = p.last_user;
      s.messages = p.messages;
      s.completion = ro.texts[static_cast<size_t>(i)];
      const auto& t = ro.tokens[static_cast<size_t>(i)];
      s.completion_tokens = static_cast<int64_t>(t.size()) -
                            (!t.empty() && std::find(eos_ids_.begin(), eos_ids_.end(), t.back()) != eos_ids_.end() ? 1 : 0);
      s.truncated = ro.truncated[static_cast<size_t>(i)];
      s.fields = p.prompt.fields;
      s.where = p.prompt.where;
      samples.push_back(std::move(s));
    }
    std::vector<double> weighted(static_cast<size_t>(n), 0.0);
    for (size_t f = 0; f < rewards_.size(); ++f) {
      std::vector<double> v = rewards_[f]->score(samples);
      TORCH_CHECK(static_cast<int64_t>(v.size()) == n, "reward ", rewards_[f]->name(), " gave ", v.size(),
                  " values for ", n, " completions");
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isnan(v[static_cast<size_t>(i)])) weighted[static_cast<size_t>(i)] += options_.reward_weights[f] * v[static_cast<size_t>(i)];
      }
      ro.func_rewards.push_back(std::move(v));
    }
    const double reward_s = seconds_since(t1);
    ro.rewards = at::tensor(weighted, at::kDouble).to(at::kFloat);
    // Global sums over every process: rewards (sum, squares, count), per function (sum, count), lengths, clipped,
    // zero-std groups, counted tokens.
    const size_t F = rewards_.size();
    std::vector<double> sums(8 + 2 * F, 0.0);
    const at::Tensor rd = ro.rewards.to(at::kDouble);
    sums[0] = rd.sum().item<double>();
    sums[1] = (rd * rd).sum().item<double>();
    sums[2] = static_cast<double>(n);
    GroupAdvantages adv = group_advantages(ro.rewards, G, options_.scale_rewards);
    int64_t counted_total = 0, clipped = 0, zero_std = 0;
    for (int64_t i = 0; i < n; ++i) {
      counted_total += ro.counted[static_cast<size_t>(i)];
      clipped += ro.truncated[static_cast<size_t>(i)] ? 1 : 0;
    }
    const at::Tensor group_std = adv.group_std.to(at::kDouble);
    for (int64_t g = 0; g < group_std.size(0); ++g) zero_std += std::abs(group_std[g].item<double>()) < 1e-8 ? 1 : 0;
    sums[3] = static_cast<double>(generated);
    sums[4] = static_cast<double>(clipped);
    sums[5] = static_cast<double>(zero_std);
    sums[6] = static_cast<double>(group_std.size(0));
    sums[7] = static_cast<double>(counted_total);
    for (size_t f = 0; f < F; ++f) {
      for (double v : ro.func_rewards[f]) {
        if (std::isnan(v)) continue;
        sums[8 + 2 * f] += v;
        sums[9 + 2 * f] += 1;
      }
    }
    const double group_std_sum = group_std.sum().item<double>();
    sums.push_back(group_std_sum);
    if (train && job_.comm) sums = job_.comm->all_reduce_sum(sums);
    if (options_.scale_rewards == ScaleRewards::kBatch) {
      const double count = sums[2];
      const double mean = sums[0] / count;
      const double var = count > 1 ? std::max(0.0, (sums[1] - count * mean * mean) / (count - 1)) : 0.0;
      adv = group_advantages(ro.rewards, G, options_.scale_rewards, std::sqrt(var));
    }
    ro.advantages = adv.advantages;
    ro.step_tokens = sums[7];
    ro.metrics["reward"] = sums[0] / std::max(1.0, sums[2]);
    ro.metrics["reward_std"] = sums.back() / std::max(1.0, sums[6]);
    for (size_t f = 0; f < F; ++f) {
      if (sums[9 + 2 * f] > 0) ro.metrics["rewards/" + rewards_[f]->name() + "/mean"] = sums[8 + 2 * f] / sums[9 + 2 * f];
    }
    ro.metrics["completions/mean_length"] = sums[3] / std::max(1.0, sums[2]);
    ro.metrics["completions/clipped_ratio"] = sums[4] / std::max(1.0, sums[2]);
    ro.metrics["frac_reward_zero_std"] = sums[5] / std::max(1.0, sums[6]);
    ro.metrics["time/rollout_s"] = rollout_s;
    ro.metrics["time/reward_s"] = reward_s;
    ro.metrics["rollout_tokens_per_s"] = static_cast<double>(generated) / std::max(1e-9, rollout_s);
    if (!train) return ro;
    // Rollout-time log-probs: the reference's (beta != 0) and the policy's own (num_iterations > 1).
    const auto t2 = std::chrono::steady_clock::now();
    const bool need_ref = options_.beta != 0, need_old = options_.num_iterations > 1;
    if (need_ref || need_old) {
      const int64_t C = max_counted(ro, 0, n);
      const at::Device device = model->device();
      if (need_ref) ro.ref_logps = at::zeros({n, C}, at::TensorOptions().dtype(at::kFloat).device(device));
      if (need_old) ro.old_logps = at::zeros({n, C}, at::TensorOptions().dtype(at::kFloat).device(device));
      const int64_t bs = job_.config.per_device_train_batch_size;
      for (int64_t i = 0; i < n; i += bs) {
        const int64_t rows = std::min(bs, n - i);
        const CompletionBatch b = collate(prompts, ro, i, rows);
        if (b.mask.size(1) == 0) continue;
        const int64_t c = b.mask.size(1);
        if (need_ref) ro.ref_logps.narrow(0, i, rows).narrow(1, 0, c).copy_(logps_no_grad(trainer, b, /*reference=*/true));
        if (need_old) ro.old_logps.narrow(0, i, rows).narrow(1, 0, c).copy_(logps_no_grad(trainer, b, /*reference=*/false));
      }
    }
    ro.metrics["time/reference_s"] = seconds_since(t2);
    return ro;
  }

  Engine& engine_for(CausalLM& model, int64_t rows) {
    auto& engine = engines_[rows];
    if (!engine) {
      EngineOptions o;
      o.max_sequences = rows;
      o.max_model_len = std::min<int64_t>(model->config().max_position_embeddings,
                                          longest_prompt_ + options_.max_completion_length);
      o.max_model_len = std::max<int64_t>(o.max_model_len, longest_prompt_ + 1);
      engine = std::make_unique<Engine>(model, job_.tokenizer, o);
    }
    return *engine;
  }

  static int64_t max_counted(const Rollout& ro, int64_t first, int64_t rows) {
    int64_t c = 0;
    for (int64_t i = first; i < first + rows; ++i) c = std::max(c, ro.counted[static_cast<size_t>(i)]);
    return c;
  }

  CompletionBatch collate(const std::vector<PromptItem>& prompts, const Rollout& ro, int64_t first, int64_t rows) const {
    std::vector<const std::vector<int64_t>*> p, c;
    std::vector<const ImageInputs*> images;
    std::vector<int64_t> counted;
    for (int64_t r = 0; r < rows; ++r) {
      const auto i = static_cast<size_t>(first + r);
      p.push_back(&prompts[ro.prompt[i]].ids);
      images.push_back(&prompts[ro.prompt[i]].images);
      c.push_back(&ro.tokens[i]);
      counted.push_back(ro.counted[i]);
    }
    return collate_completions(p, c, counted, pad_id_, images);
  }




  at::Tensor logps_no_grad(Trainer& trainer, const CompletionBatch& b, bool reference) {
    at::NoGradGuard no_grad;
    CausalLM& policy = trainer.model();
    AutocastScope autocast(trainer.autocast(), policy->device());
    if (reference && reference_) return completion_logps(reference_, b, options_.temperature, false).logps;
    EvalScope eval_mode(policy);
    if (reference) {
      AdaptersDisabled off(policy);  // LoRA: the base model is the reference
      return completion_logps(policy, b, options_.temperature, false).logps;
    }
    return completion_logps(policy, b, options_.temperature, false).logps;
  }

  void train_step(Trainer& trainer, const StepSlice& slice, StepResult& r) {
    const Rollout& ro = *rollout_;
    const auto n = static_cast<int64_t>(ro.prompt.size());
    const int64_t bs = job_.config.per_device_train_batch_size;
    const int64_t micro = (n + bs - 1) / bs;
    const int64_t micro_global = trainer.global_count(micro);
    const bool dapo = options_.loss_type == GrpoLossType::kDapo;
    const double scale = dapo ? 1.0 : 1.0 / static_cast<double>(std::max<int64_t>(1, micro_global));
    static const std::vector<std::string> names = {"kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
                                                   "clip_ratio/region_mean"};
    std::vector<double> metric_sum(names.size(), 0.0), metric_count(names.size(), 0.0);
    trainer.begin_step(static_cast<size_t>(micro));
    at::Tensor loss_sum;
    CausalLM& model = trainer.model();
    for (int64_t i = 0; i < n; i += bs) {
      const int64_t rows = std::min(bs, n - i);
      const CompletionBatch b = collate(train_, ro, i, rows);
      r.real_tokens += b.tokens;
      r.label_tokens += static_cast<int64_t>(b.mask.sum().item<double>());
      at::Tensor loss;
      {
        AutocastScope autocast(trainer.autocast(), model->device());
        GrpoLossInputs in;
        const at::Device device = model->device();
        if (b.mask.size(1) == 0) {  // nothing counted (every completion masked): a zero loss keeps the step's shape
          loss = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
          for (const auto& t : trainer.trainables()) loss = loss + t.tensor.sum() * 0.0;
        } else {
          const int64_t C = b.mask.size(1);
          const CompletionLogps lp = completion_logps(model, b, options_.temperature, true);
          in.logps = lp.logps;
          in.entropy = lp.entropy;
          in.mask = b.mask.to(device);
          in.advantages = ro.advantages.narrow(0, i, rows).to(device);
          if (ro.old_logps.defined()) in.old_logps = ro.old_logps.narrow(0, i, rows).narrow(1, 0, C);
          if (ro.ref_logps.defined()) in.ref_logps = ro.ref_logps.narrow(0, i, rows).narrow(1, 0, C);
          in.dapo_tokens = ro.step_tokens;
          GrpoLossResult res = grpo_loss(options_, in);
          loss = res.loss;
          for (size_t k = 0; k < names.size(); ++k) {
            const auto it = res.metrics.find(names[k]);
            if (it == res.metrics.end()) continue;
            metric_sum[k] += it->second;
            metric_count[k] += 1;
          }
        }
      }
      const at::Tensor scaled = loss * scale;
      trainer.backward(scaled);
      ++r.forwards;
      loss_sum = loss_sum.defined() ? loss_sum + scaled.detach() : scaled.detach();
    }
    std::vector<at::Tensor> sums = {loss_sum, at::scalar_tensor(static_cast<double>(r.label_tokens), at::kDouble)};
    for (double v : metric_sum) sums.push_back(at::scalar_tensor(v, at::kDouble));
    for (double v : metric_count) sums.push_back(at::scalar_tensor(v, at::kDouble));
    trainer.finish_step(r, sums, [&](const std::vector<double>& global) {
      r.loss = global[0];
      r.label_tokens = static_cast<int64_t>(global[1]);
      for (size_t k = 0; k < names.size(); ++k) {
        if (global[2 + names.size() + k] > 0) r.metrics[names[k]] = global[2 + k] / global[2 + names.size() + k];
      }
      const auto region = r.metrics.find("clip_ratio/region_mean");
      if (region != r.metrics.end()) r.metrics["clip_ratio"] = region->second;
    }, slice.global_step, slice.total_steps);
  }

  void trim_completion_log(int64_t global_step) {
    completions_trimmed_ = true;
    if (job_.rank != 0 || run_dir_.empty()) return;
    const fs::path file = run_dir_ / "completions.jsonl";
    if (!fs::exists(file)) return;
    std::ifstream in(file);
    std::string kept, line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      try {
        if (Json::parse(line).value("step", int64_t{0}) <= global_step) kept += line + "\n";
      } catch (const std::exception&) {  // a line cut by a kill is dropped
      }
    }
    write_file_atomic(file, kept);
  }

  void log_completions(int64_t step, const Rollout& ro, const std::vector<PromptItem>& prompts) {
    if (job_.rank != 0 || run_dir_.empty()) return;
    std::string text;
    for (size_t i = 0; i < ro.prompt.size(); ++i) {
      Json record = {{"step", step}, {"prompt", prompts[ro.prompt[i]].last_user}, {"completion", ro.texts[i]},
                     {"reward", ro.rewards[static_cast<int64_t>(i)].item<double>()},
                     {"advantage", ro.advantages[static_cast<int64_t>(i)].item<double>()}};
      Json per = Json::object();
      for (size_t f = 0; f < rewards_.size(); ++f) {
        const double v = ro.func_rewards[f][i];
        per[rewards_[f]->name()] = std::isnan(v) ? Json(nullptr) : Json(v);
      }
      record["rewards"] = per;
      text += record.dump() + "\n";
    }
    std::ofstream out(run_dir_ / "completions.jsonl", std::ios::app);
    if (!out) fail<IoError>("cannot append to {}", (run_dir_ / "completions.jsonl").string());
    out << text;
  }

  JobContext& job_;
  GrpoOptions options_;
  std::vector<std::unique_ptr<RewardFunction>> rewards_;
  std::shared_ptr<const ChatTemplate> chat_template_;
  std::unique_ptr<PreferenceEncoder> encoder_;
  std::vector<PromptItem> train_, validation_;
  SkipCounts skipped_;
  int64_t rows_ = 0;
  int64_t prompt_limit_ = 0;
  int64_t longest_prompt_ = 1;
  int32_t pad_id_ = 0;
  std::vector<int64_t> eos_ids_;
  CausalLM reference_{nullptr};
  std::map<int64_t, std::unique_ptr<Engine>> engines_;
  std::unique_ptr<Rollout> rollout_;
  fs::path run_dir_;
  bool completions_trimmed_ = false;
};

}  // namespace

TrainResult run_grpo(const TrainConfig& config, const TrainHooks& hooks) {
  grpo_options(config);  // refused before anything is loaded
  return run_job(config, hooks, [](JobContext& job) -> std::unique_ptr<TrainingTask> {
    return std::make_unique<GrpoTask>(job);
  }, "grpo");
}

}  // namespace swiftcpp
