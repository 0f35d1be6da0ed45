#include "train/rlhf.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/preference_data.h"
#include "models/registry.h"
#include "peft/lora.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "train/autocast.h"

namespace swiftcpp {

// ---------------------------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------------------------

PreferenceOptions preference_options(const TrainConfig& c) {
  if (c.rlhf_type.empty()) fail<ConfigError>("'rlhf_type' is required: dpo, kto, orpo, cpo, simpo or rm");
  PreferenceOptions o;
  o.rlhf_type = parse_rlhf_type(c.rlhf_type);
  o.beta = c.beta;
  if (!c.loss_type.empty()) o.loss_type = parse_preference_loss_type(c.loss_type);
  o.label_smoothing = c.label_smoothing;
  o.rpo_alpha = c.rpo_alpha;
  o.reference_free = c.reference_free;
  o.desirable_weight = c.desirable_weight;
  o.undesirable_weight = c.undesirable_weight;
  o.simpo_gamma = c.simpo_gamma;
  o.cpo_alpha = c.cpo_alpha;
  o.center_rewards_coefficient = c.center_rewards_coefficient;
  o.validate();
  o.validate_batch_size(c.per_device_train_batch_size);
  const bool reference = preference_needs(o).reference;
  const std::string method = "rlhf_type " + c.rlhf_type;
  if (!c.ref_model.empty()) {
    if (!reference || c.reference_free) {
      fail<ConfigError>("'ref_model' does not apply to {}{}: it uses no reference model", method,
                        c.reference_free ? " with reference_free" : "");
    }
    if (c.train_type == "lora") {
      fail<ConfigError>("'ref_model' with train_type lora: the reference of a LoRA policy is its own base model (the "
                        "adapters switched off), as TRL uses it when given a peft_config; drop ref_model, or train "
                        "with train_type full");
    }
  }
  if (c.precompute_ref_log_probs && !reference) {
    fail<ConfigError>("'precompute_ref_log_probs' does not apply to {}: it uses no reference model", method);
  }
  if (effective_batching(c) != "padding") {
    fail<ConfigError>("'batching' {}: preference training runs padded batches of chosen and rejected answers (TRL's "
                      "concatenated forward); use batching: padding", effective_batching(c));
  }
  if (c.scheduler != "none") fail<ConfigError>("'scheduler' {} does not apply to preference training", c.scheduler);
  if (c.context_parallel_size != 1) {
    fail<ConfigError>("'context_parallel_size' {} does not apply to preference training", c.context_parallel_size);
  }
  if (c.loss_scale != "last_round") {
    fail<ConfigError>("'loss_scale' {}: preference training trains the last answer only (last_round)", c.loss_scale);
  }
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// Heads and log-probabilities
// ---------------------------------------------------------------------------------------------------------------

void attach_reward_head(CausalLM& model, uint64_t seed) {
  for (const auto& item : model->named_children()) {
    if (item.key() == "score") fail<ConfigError>("the model has a 'score' module already");
  }
  const int64_t hidden = model->config().hidden_size;
  torch::nn::Linear score(torch::nn::LinearOptions(hidden, 1).bias(false));
  {
    at::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const at::Tensor w = at::normal(0.0, 0.02, {1, hidden}, gen, at::TensorOptions().dtype(at::kFloat));
    score->weight.set_data(w.to(model->device(), model->parameters().front().scalar_type()));
  }
  model->register_module("score", score);
}

at::Tensor reward_scores(CausalLM& model, const at::Tensor& hidden, const at::Tensor& key_valid) {
  const int64_t R = hidden.size(0), T = hidden.size(1);
  at::Tensor last;  // [R] int64: each row's last real position
  if (key_valid.defined()) {
    last = key_valid.to(hidden.device(), at::kLong).sum(1).sub(1).clamp_min(0);
  } else {
    last = at::full({R}, T - 1, hidden.options().dtype(at::kLong));
  }
  const at::Tensor rows = hidden.gather(1, last.view({R, 1, 1}).expand({R, 1, hidden.size(2)})).squeeze(1);  // [R, D]
  auto score = std::dynamic_pointer_cast<torch::nn::LinearImpl>(model->named_children()["score"]);
  TORCH_CHECK(score, "reward_scores: the model has no reward head (attach_reward_head)");
  return score->forward(rows).squeeze(1).to(at::kFloat);  // [R]
}

HeadLogps head_logps(CausalLM& model, const at::Tensor& hidden, const at::Tensor& targets, bool logit_sums,
                     double temperature, bool entropy) {
  const int64_t R = targets.size(0), T = targets.size(1);
  const at::Tensor flat = targets.to(hidden.device(), at::kLong).reshape({R * T});  // [R*T]
  const at::Tensor index = flat.ne(kIgnoreIndex).nonzero().squeeze(1);              // [N]
  // The head only where a target is: [N, D] -> logits [N, V] -> log-softmax in float32 -> [N]
  const at::Tensor rows = model->logits(hidden.reshape({R * T, hidden.size(-1)}).index_select(0, index));
  const at::Tensor scaled = temperature == 1.0 ? rows : rows.to(at::kFloat) / temperature;  // [N, V]
  const at::Tensor log_probs = at::log_softmax(scaled, -1, at::kFloat);                     // [N, V]
  const at::Tensor picked = log_probs.gather(1, flat.index_select(0, index).unsqueeze(1)).squeeze(1);
  HeadLogps out;
  out.token_logps = at::zeros({R * T}, picked.options()).index_copy(0, index, picked).view({R, T});
  if (logit_sums) {
    const at::Tensor sums = rows.detach().to(at::kFloat).sum(-1);
    out.logit_sums = at::zeros({R * T}, sums.options()).index_copy(0, index, sums).view({R, T});
  }
  if (entropy) {  // -sum p log p of the scaled distribution, [N]
    const at::Tensor lp = log_probs.detach();
    const at::Tensor h = -(lp.exp() * lp).sum(-1);
    out.entropy = at::zeros({R * T}, h.options()).index_copy(0, index, h).view({R, T});
  }
  return out;
}

SequenceLogps masked_logps(const at::Tensor& token_logps, const at::Tensor& labels) {
  const at::Tensor mask = labels.to(token_logps.device()).ne(kIgnoreIndex);  // [R, T]
  SequenceLogps out;
  out.token_logps = token_logps.masked_fill(mask.logical_not(), 0.0);
  out.sum = out.token_logps.sum(1);
  out.count = mask.sum(1);
  return out;
}

CausalLM load_reference_model(const TrainConfig& c, const at::Device& device) {
  LoadOptions load;
  load.device = device;
  load.dtype = parse_dtype(c.torch_dtype);
  CausalLM ref = load_causal_lm(c.ref_model.empty() ? c.model : c.ref_model, load);
  ref->eval();
  for (auto& p : ref->parameters()) p.requires_grad_(false);
  return ref;
}

namespace {

// The metrics a step and a validation pass report, in a fixed order (every rank sums the same slots).
const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> names = {
      "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
      "logps/rejected", "logits/chosen", "logits/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen", "kl"};
  return names;
}

// The forward options of a padded batch: its positions, padding and images (`image_features` when given, else
// the batch's own pixel_values).
ForwardOptions forward_options(const Batch& b, const at::Device& device, const at::Tensor& image_features = {}) {
  ForwardOptions o;
  if (b.position_ids.defined()) o.position_ids = b.position_ids.to(device);
  if (b.key_valid.defined()) o.key_valid = b.key_valid.to(device);
  if (image_features.defined()) {
    o.image_features = image_features;
  } else if (b.pixel_values.defined()) {
    o.pixel_values = b.pixel_values.to(device);
  }
  o.image_grid_thw = b.image_grid_thw;  // [N, 3] with variable-size images (M-RoPE positions too)
  return o;
}

// Targets of every next token that is not padding (ORPO's NLL over prompt and answer): [R, T], from input ids and
// key_valid (right padding).
at::Tensor next_token_targets(const Batch& b) {
  const at::Tensor ids = b.input_ids.to(at::kLong);
  at::Tensor targets = at::full_like(ids, kIgnoreIndex);
  const int64_t T = ids.size(1);
  if (T < 2) return targets;
  at::Tensor next = ids.narrow(1, 1, T - 1);
  if (b.key_valid.defined()) next = next.masked_fill(b.key_valid.narrow(1, 1, T - 1).logical_not(), kIgnoreIndex);
  targets.narrow(1, 0, T - 1).copy_(next);
  return targets;
}

// What one micro-batch contributes to a step or a validation pass.
struct MicroResult {
  at::Tensor loss;                         // [] to back-propagate (unscaled)
  std::map<std::string, double> metrics;   // TRL's names
};

// Sums of metrics over micro-batches (and ranks): value sums and counts per name.
struct MetricSums {
  std::vector<double> sum = std::vector<double>(metric_names().size(), 0.0);
  std::vector<double> count = std::vector<double>(metric_names().size(), 0.0);
  void add(const std::map<std::string, double>& m) {
    for (size_t i = 0; i < metric_names().size(); ++i) {
      const auto it = m.find(metric_names()[i]);
      if (it == m.end() || !std::isfinite(it->second)) continue;
      sum[i] += it->second;
      count[i] += 1;
    }
  }
  std::vector<double> flat() const {
    std::vector<double> v = sum;
    v.insert(v.end(), count.begin(), count.end());
    return v;
  }
  // The averages of `flat` values (as flat() lays them out) starting at `offset`, named with `prefix`.
  static std::map<std::string, double> averages(const std::vector<double>& v, size_t offset, const std::string& prefix) {
    std::map<std::string, double> out;
    const size_t n = metric_names().size();
    for (size_t i = 0; i < n; ++i) {
      if (v[offset + n + i] > 0) out[prefix + metric_names()[i]] = v[offset + i] / v[offset + n + i];
    }
    return out;
  }
};


std::string preference_data_fingerprint(const TrainConfig& c) {
  return fmt::format("{}|template={}|system={}", tokenizer_files_fingerprint(c.model), c.chat_template, c.system);
}

PreferenceEncodeOptions encode_options(const TrainConfig& c) {
  PreferenceEncodeOptions o;
  o.max_length = c.max_length;
  o.truncation = parse_truncation_strategy(c.truncation_strategy);
  if (o.truncation != TruncationStrategy::kDelete) {
    o.max_prompt_length = c.max_prompt_length > 0 ? c.max_prompt_length : std::max<int64_t>(1, c.max_length / 2);
  }
  return o;
}

// Rows [start, start + n) of a [R] tensor.
at::Tensor rows(const at::Tensor& t, int64_t start, int64_t n) { return t.narrow(0, start, n); }

// Label log-probabilities of `batch` under `m` (no autocast change, autograd as the caller has it), its images
// from `shared` when that holds any.
SequenceLogps batch_logps(CausalLM& m, const Batch& batch, const SharedImages& shared = {}) {
  const at::Device device = m->device();
  const at::Tensor features = shared_image_features(m, shared);
  const at::Tensor hidden = m->hidden_states(batch.input_ids.to(device), forward_options(batch, device, features));
  const at::Tensor labels = batch.labels.to(device);
  return masked_logps(head_logps(m, hidden, labels, false).token_logps, labels);
}

}  // namespace

at::Tensor shared_image_features(CausalLM& model, const SharedImages& shared) {
  if (shared.images.empty()) return {};
  if (!model->vision()) fail<ConfigError>("images given to the {} model, which takes text only", model->config().model_type);
  if (shared.copies < 1) fail<ConfigError>("shared images repeated {} times", shared.copies);
  const at::Tensor features = model->vision()->encode(shared.images.pixel_values.to(model->device()),
                                                      shared.images.image_grid_thw);  // [N, F, D] | [M, D]
  if (shared.copies == 1) return features;
  return at::cat(std::vector<at::Tensor>(static_cast<size_t>(shared.copies), features));  // [copies N, ...]
}

SequenceLogps reference_logps(CausalLM& policy, CausalLM reference, const Batch& batch, bool autocast,
                              const SharedImages& shared) {
  at::NoGradGuard no_grad;
  AutocastScope scope(autocast, policy->device());
  if (reference) return batch_logps(reference, batch, shared);
  // The policy's own base: adapters switched off (modules_to_save at their original values), dropout off (as TRL
  // runs the reference), mode restored. The images go through the base's own tower and aligner.
  EvalScope eval_mode(policy);
  AdaptersDisabled off(policy);
  return batch_logps(policy, batch, shared);
}

PreferenceResult pair_objective(const PreferenceOptions& options, CausalLM& policy, const PreferenceBatch& pb,
                                const SequenceLogps& reference, CausalLM reference_model, bool autocast) {
  const PreferenceNeeds needs = preference_needs(options);
  const Batch& batch = pb.batch;  // [2B, T]: chosen rows, then rejected rows
  const int64_t B = batch.input_ids.size(0) / 2;
  const at::Device device = policy->device();
  const SharedImages images{pb.images, 2};  // each prompt's images encoded once for its chosen and rejected rows
  // The reference first: with LoRA it swaps modules_to_save to their original values, so no tensor the policy's
  // graph holds changes under it.
  SequenceLogps ref;
  if (needs.reference) {
    ref = reference.sum.defined() ? reference : reference_logps(policy, reference_model, batch, autocast, images);
  }
  AutocastScope scope(autocast, device);
  const at::Tensor labels = batch.labels.to(device);  // [2B, T]
  const at::Tensor features = shared_image_features(policy, images);
  const at::Tensor hidden =
      policy->hidden_states(batch.input_ids.to(device), forward_options(batch, device, features));
  if (options.rlhf_type == RlhfType::kRm) {
    const at::Tensor scores = reward_scores(policy, hidden, batch.key_valid);  // [2B]
    const bool has_margin = pb.margin.defined() && pb.margin.abs().sum().item<double>() > 0;
    return reward_model_loss(options, rows(scores, 0, B), rows(scores, B, B),
                             has_margin ? pb.margin.to(device) : at::Tensor());
  }
  // The head where an answer token is predicted; ORPO's NLL also over the chosen rows' prompt tokens.
  at::Tensor targets = labels;
  at::Tensor nll_targets;  // [B, T] ORPO: every next non-padding token of the chosen rows
  if (needs.nll == NllTokens::kPromptAndResponse) {
    nll_targets = next_token_targets(batch).narrow(0, 0, B).to(device);
    targets = at::cat({nll_targets, labels.narrow(0, B, B)});
  }
  const HeadLogps head = head_logps(policy, hidden, targets, /*logit_sums=*/true);
  const SequenceLogps logps = masked_logps(head.token_logps, labels);  // [2B]
  const SequenceLogps chosen = logps.rows(0, B), rejected = logps.rows(B, B);
  PreferenceInputs in;
  const auto pick = [&](const SequenceLogps& l) { return needs.average_logps ? l.average() : l.sum; };
  in.policy_chosen_logps = pick(chosen);
  in.policy_rejected_logps = pick(rejected);
  if (needs.nll == NllTokens::kResponse) in.nll_loss = token_mean_nll(chosen);
  if (needs.nll == NllTokens::kPromptAndResponse) {
    in.nll_loss = token_mean_nll(masked_logps(head.token_logps.narrow(0, 0, B), nll_targets));
  }
  {  // logits/chosen and logits/rejected: the mean logit over the answers' predicting positions
    at::NoGradGuard no_grad;
    const at::Tensor mask = labels.ne(kIgnoreIndex);
    const double vocab = static_cast<double>(policy->config().vocab_size);
    const at::Tensor sums = head.logit_sums.masked_fill(mask.logical_not(), 0.0);
    const at::Tensor totals = at::stack({sums.narrow(0, 0, B).sum(), sums.narrow(0, B, B).sum(),
                                         mask.narrow(0, 0, B).sum().to(at::kFloat),
                                         mask.narrow(0, B, B).sum().to(at::kFloat)}).to(at::kCPU, at::kDouble);
    const double* t = totals.data_ptr<double>();
    if (t[2] > 0) in.chosen_logits_mean = t[0] / (t[2] * vocab);
    if (t[3] > 0) in.rejected_logits_mean = t[1] / (t[3] * vocab);
  }
  if (needs.reference) {
    const SequenceLogps rc = ref.rows(0, B), rr = ref.rows(B, B);
    in.reference_chosen_logps = needs.average_logps ? rc.average() : rc.sum;
    in.reference_rejected_logps = needs.average_logps ? rr.average() : rr.sum;
  }
  return preference_loss(options, in);
}

namespace {

// Everything both preference tasks share: options, reference, the step and validation loops over micro-batches.
class PreferenceTaskBase : public TrainingTask {
 public:
  explicit PreferenceTaskBase(JobContext& job) : job_(job), options_(preference_options(job.config)) {
    needs_ = preference_needs(options_);
    const TrainConfig& c = job.config;
    if (options_.rlhf_type == RlhfType::kRm) {
      // The reward head trains in full: with LoRA it is saved beside the adapter, as PEFT saves a SEQ_CLS head.
      attach_reward_head(job.model, static_cast<uint64_t>(c.seed));
      if (c.train_type == "lora" &&
          std::find(c.modules_to_save.begin(), c.modules_to_save.end(), "score") == c.modules_to_save.end()) {
        job.config.modules_to_save.push_back("score");
      }
    }
    uses_reference_ = needs_.reference;
    if (uses_reference_ && c.train_type == "full" && !c.precompute_ref_log_probs) {
      reference_ = load_reference_model(c, job.device);
    }
    encoder_options_ = encode_options(c);
    if (job.model->config().multimodal) {
      // Vision-language model: the prompts' images as SFT takes them (the processor preprocessor_config.json chose).
      encoder_options_.images = job.assets.images;
    }
    chat_template_ = chat_template_for(*job.tokenizer, c.chat_template);
    pad_id_ = job.tokenizer->specials().pad.value_or(0);
  }

  void add_fingerprint(Json& f) const override {
    const TrainConfig& c = job_.config;
    f["rlhf_type"] = c.rlhf_type;
    f["beta"] = options_.effective_beta();
    f["loss_type"] = to_string(options_.effective_loss_type());
    f["ref_model"] = c.ref_model;
    f["max_prompt_length"] = encoder_options_.max_prompt_length;
  }

  std::vector<std::string> plotted_metrics() const override { return {"rewards/margins"}; }

  // A fully trained reward model is a sequence-classification checkpoint: config.json says so (architectures
  // *ForSequenceClassification, one label, a pad token id for batched scoring) and model.safetensors holds
  // `score.weight` beside the decoder (lm_head stays too: transformers ignores it with a warning).
  void complete_model_checkpoint(const fs::path& dir) const override {
    if (options_.rlhf_type != RlhfType::kRm) return;
    Json config = load_json_file(dir / "config.json");
    std::string arch = job_.model->config().model_type + "ForCausalLM";
    if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
        config["architectures"][0].is_string()) {
      arch = config["architectures"][0].get<std::string>();
    }
    const std::string causal = "ForCausalLM";
    if (arch.size() > causal.size() && arch.compare(arch.size() - causal.size(), causal.size(), causal) == 0) {
      arch = arch.substr(0, arch.size() - causal.size());
    }
    config["architectures"] = Json::array({arch + "ForSequenceClassification"});
    config["id2label"] = {{"0", "LABEL_0"}};
    config["label2id"] = {{"LABEL_0", 0}};
    if (!config.contains("pad_token_id") || config["pad_token_id"].is_null()) config["pad_token_id"] = pad_id_;
    write_file_atomic(dir / "config.json", config.dump(2) + "\n");
  }

  StepResult step(Trainer& trainer, const StepSlice& slice) override {
    const int64_t bs = job_.config.per_device_train_batch_size;
    std::vector<std::vector<size_t>> groups;  // this rank's micro-batches: item indices
    for (size_t i = slice.first; i < slice.last; i += static_cast<size_t>(bs)) {
      groups.emplace_back();
      for (size_t j = i; j < std::min(slice.last, i + static_cast<size_t>(bs)); ++j) {
        groups.back().push_back((*slice.order)[j]);
      }
    }
    StepResult r;
    // Each micro-batch's loss is the mean over its examples (TRL); the step's objective is the mean over every
    // rank's micro-batches, as gradient accumulation and DDP's averaging make it.
    const int64_t micro_global = trainer.global_count(static_cast<int64_t>(groups.size()));
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, micro_global));
    trainer.begin_step(groups.size());
    at::Tensor loss_sum;
    MetricSums metrics;
    for (const auto& group : groups) {
      MicroResult m;
      {
        AutocastScope autocast(trainer.autocast(), trainer.model()->device());
        m = forward(trainer, group, /*train=*/true, &r);
      }
      trainer.backward(m.loss * scale);
      ++r.forwards;
      loss_sum = loss_sum.defined() ? loss_sum + m.loss.detach() : m.loss.detach();
      metrics.add(m.metrics);
    }
    // One collective for the loss, the label-token count and the metrics (finish_step's).
    std::vector<at::Tensor> sums = {loss_sum, at::scalar_tensor(static_cast<double>(r.label_tokens), at::kDouble)};
    for (double v : metrics.flat()) sums.push_back(at::scalar_tensor(v, at::kDouble));
    trainer.finish_step(r, sums, [&](const std::vector<double>& global) {
      r.loss = global[0] * scale;
      r.label_tokens = static_cast<int64_t>(global[1]);
      r.metrics = MetricSums::averages(global, 2, "");
    }, slice.global_step, slice.total_steps);
    return r;
  }

  std::map<std::string, double> evaluate(Trainer& trainer) override {
    const size_t n = validation_size();
    if (n == 0) return {};
    const int64_t bs = job_.config.per_device_eval_batch_size;
    CausalLM& model = trainer.model();
    model->eval();
    double loss_sum = 0, batches = 0;
    MetricSums metrics;
    {
      at::NoGradGuard no_grad;
      size_t b = 0;
      for (size_t i = 0; i < n; i += static_cast<size_t>(bs), ++b) {
        if (static_cast<int>(b % static_cast<size_t>(job_.world)) != job_.rank) continue;  // each rank its share
        std::vector<size_t> group;
        for (size_t j = i; j < std::min(n, i + static_cast<size_t>(bs)); ++j) group.push_back(j);
        AutocastScope autocast(trainer.autocast(), model->device());
        const MicroResult m = forward(trainer, group, /*train=*/false, nullptr);
        loss_sum += m.loss.item<double>();
        batches += 1;
        metrics.add(m.metrics);
      }
    }
    model->train();
    std::vector<double> v = {loss_sum, batches};
    const std::vector<double> flat = metrics.flat();
    v.insert(v.end(), flat.begin(), flat.end());
    if (job_.comm) v = job_.comm->all_reduce_sum(v);
    std::map<std::string, double> out = MetricSums::averages(v, 2, "eval_");
    out["eval_loss"] = v[0] / std::max(1.0, v[1]);
    return out;
  }

 protected:
  /// Loss and metrics of the micro-batch of `items` (training items when `train`, else validation items);
  /// adds token counts to `r` when given.
  virtual MicroResult forward(Trainer& trainer, const std::vector<size_t>& items, bool train, StepResult* r) = 0;
  virtual size_t validation_size() const = 0;

  bool lora() const { return job_.config.train_type == "lora"; }

  JobContext& job_;
  PreferenceOptions options_;
  PreferenceNeeds needs_;
  bool uses_reference_ = false;
  CausalLM reference_{nullptr};  // full fine-tuning: the frozen reference copy (LoRA: the policy's own base)
  PreferenceEncodeOptions encoder_options_;
  std::shared_ptr<const ChatTemplate> chat_template_;
  int32_t pad_id_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Pairs: dpo, orpo, cpo, simpo, rm
// ---------------------------------------------------------------------------------------------------------------

class PairTask : public PreferenceTaskBase {
 public:
  explicit PairTask(JobContext& job) : PreferenceTaskBase(job) {
    const TrainConfig& c = job.config;
    PreferenceEncoder encoder(job.tokenizer, chat_template_, encoder_options_);
    data_ = prepare_preference_data(data_options(c), encoder, preference_data_fingerprint(c));
    if (data_.train.empty()) {
      fail<ConfigError>("no preference pairs: all {} rows of {} were skipped or longer than max_length {}",
                        data_.stats.rows, fmt::join(c.dataset, ", "), c.max_length);
    }
  }

  size_t size() const override { return data_.train.size(); }

  std::string describe() const override {
    std::string text = fmt::format("data: {} train pairs, {} validation, {} tokens ({} trained) in chosen and "
                                   "rejected sequences\n", data_.train.size(), data_.validation.size(),
                                   data_.stats.tokens, data_.stats.label_tokens);
    if (const std::string skipped = data_.stats.skipped.summary(); !skipped.empty()) text += "data: " + skipped + "\n";
    return text;
  }

  void start(Trainer& trainer, const fs::path&, bool) override {
    if (!uses_reference_ || !job_.config.precompute_ref_log_probs) return;
    *job_.out << "computing the reference log-probabilities of every pair...\n";
    precomputed_train_ = precompute(trainer, data_.train);
    precomputed_val_ = precompute(trainer, data_.validation);
  }

 protected:
  size_t validation_size() const override { return data_.validation.size(); }

  // Reference log-prob sums and counts per pair: [n, 2] each (chosen, rejected).
  struct Precomputed {
    at::Tensor sum;    // [n, 2] float32
    at::Tensor count;  // [n, 2] int64
  };

  Precomputed precompute(Trainer& trainer, const std::vector<PreferenceSample>& pairs) {
    Precomputed out;
    out.sum = at::zeros({static_cast<int64_t>(pairs.size()), 2}, at::kFloat);
    out.count = at::zeros({static_cast<int64_t>(pairs.size()), 2}, at::kLong);
    // Full fine-tuning: a reference copy while computing, freed afterwards (none is kept for the steps).
    CausalLM ref = job_.config.train_type == "full" ? load_reference_model(job_.config, job_.device) : CausalLM(nullptr);
    const auto bs = static_cast<size_t>(std::max(job_.config.per_device_train_batch_size,
                                                 job_.config.per_device_eval_batch_size));
    for (size_t i = 0; i < pairs.size(); i += bs) {
      std::vector<const PreferenceSample*> group;
      for (size_t j = i; j < std::min(pairs.size(), i + bs); ++j) group.push_back(&pairs[j]);
      const PreferenceBatch pb = collate_preference(group, pad_id_);
      const SequenceLogps l = reference_logps(trainer.model(), ref, pb.batch, trainer.autocast(), {pb.images, 2});
      const auto B = static_cast<int64_t>(group.size());
      const at::Tensor s = out.sum.narrow(0, static_cast<int64_t>(i), B), n = out.count.narrow(0, static_cast<int64_t>(i), B);
      s.select(1, 0).copy_(rows(l.sum, 0, B).cpu());
      s.select(1, 1).copy_(rows(l.sum, B, B).cpu());
      n.select(1, 0).copy_(rows(l.count, 0, B).cpu());
      n.select(1, 1).copy_(rows(l.count, B, B).cpu());
    }
    return out;
  }

  MicroResult forward(Trainer& trainer, const std::vector<size_t>& items, bool train, StepResult* r) override {
    const auto& pairs = train ? data_.train : data_.validation;
    std::vector<const PreferenceSample*> group;
    for (size_t i : items) group.push_back(&pairs[i]);
    const PreferenceBatch pb = collate_preference(group, pad_id_);
    if (r != nullptr) {
      r->real_tokens += pb.batch.real_tokens;
      r->label_tokens += pb.batch.label_tokens;
    }
    SequenceLogps ref;  // precomputed reference log-probs of the 2B rows, when computed before training
    const Precomputed& pre = train ? precomputed_train_ : precomputed_val_;
    if (needs_.reference && pre.sum.defined()) {
      const at::Tensor index = at::tensor(std::vector<int64_t>(items.begin(), items.end()), at::kLong);
      const at::Tensor s = pre.sum.index_select(0, index), n = pre.count.index_select(0, index);  // [B, 2]
      const at::Device device = trainer.model()->device();
      ref.sum = at::cat({s.select(1, 0), s.select(1, 1)}).to(device);
      ref.count = at::cat({n.select(1, 0), n.select(1, 1)}).to(device);
    }
    PreferenceResult res = pair_objective(options_, trainer.model(), pb, ref, reference_, trainer.autocast());
    MicroResult out;
    out.loss = res.loss;
    out.metrics = std::move(res.metrics);
    return out;
  }

 private:
  PreferenceData data_;
  Precomputed precomputed_train_, precomputed_val_;
};

// ---------------------------------------------------------------------------------------------------------------
// KTO
// ---------------------------------------------------------------------------------------------------------------

class KtoTask : public PreferenceTaskBase {
 public:
  explicit KtoTask(JobContext& job) : PreferenceTaskBase(job) {
    const TrainConfig& c = job.config;
    PreferenceEncoder encoder(job.tokenizer, chat_template_, encoder_options_);
    data_ = prepare_kto_data(data_options(c), encoder, preference_data_fingerprint(c));
    if (data_.train.empty()) {
      fail<ConfigError>("no KTO examples: all {} rows of {} were skipped or longer than max_length {}",
                        data_.stats.rows, fmt::join(c.dataset, ", "), c.max_length);
    }
    // The KL rows are made once, as TRL's _get_kl_dataset makes them: over blocks of one global batch of the
    // prepared examples, each example's prompt with another example's completion; they travel with their example.
    const auto global = static_cast<size_t>(c.per_device_train_batch_size * c.gradient_accumulation_steps *
                                            job.data_ranks);
    kl_train_ = kl_rows(data_.train, global);
    kl_val_ = kl_rows(data_.validation, static_cast<size_t>(std::max<int64_t>(2, c.per_device_eval_batch_size)));
  }

  size_t size() const override { return data_.train.size(); }

  std::string describe() const override {
    int64_t desirable = 0;
    for (const auto& e : data_.train) desirable += e.desirable ? 1 : 0;
    std::string text = fmt::format("data: {} train examples ({} desirable, {} undesirable), {} validation, {} tokens "
                                   "({} trained)\n", data_.train.size(), desirable,
                                   static_cast<int64_t>(data_.train.size()) - desirable, data_.validation.size(),
                                   data_.stats.tokens, data_.stats.label_tokens);
    if (const std::string skipped = data_.stats.skipped.summary(); !skipped.empty()) text += "data: " + skipped + "\n";
    return text;
  }

  void start(Trainer& trainer, const fs::path&, bool) override {
    if (!job_.config.precompute_ref_log_probs) return;
    *job_.out << "computing the reference log-probabilities of every example and KL row...\n";
    pre_train_ = precompute(trainer, data_.train, kl_train_);
    pre_val_ = precompute(trainer, data_.validation, kl_val_);
  }

 protected:
  size_t validation_size() const override { return data_.validation.size(); }

  // Reference log-prob sums per example: [n, 2] (completion, KL row).
  at::Tensor precompute(Trainer& trainer, const std::vector<KtoSample>& examples, const std::vector<Sample>& kl) {
    at::Tensor out = at::zeros({static_cast<int64_t>(examples.size()), 2}, at::kFloat);
    CausalLM ref = job_.config.train_type == "full" ? load_reference_model(job_.config, job_.device) : CausalLM(nullptr);
    const auto bs = static_cast<size_t>(std::max<int64_t>(2, job_.config.per_device_train_batch_size));
    for (size_t i = 0; i < examples.size(); i += bs) {
      std::vector<const KtoSample*> group;
      std::vector<const Sample*> kl_group;
      for (size_t j = i; j < std::min(examples.size(), i + bs); ++j) {
        group.push_back(&examples[j]);
        kl_group.push_back(&kl[j]);
      }
      const KtoBatch kb = collate_kto(group, kl_group, pad_id_);
      const auto B = static_cast<int64_t>(group.size());
      const at::Tensor s = out.narrow(0, static_cast<int64_t>(i), B);
      s.select(1, 0).copy_(reference_logps(trainer.model(), ref, kb.completions, trainer.autocast()).sum.cpu());
      s.select(1, 1).copy_(reference_logps(trainer.model(), ref, kb.kl, trainer.autocast()).sum.cpu());
    }
    return out;
  }

  MicroResult forward(Trainer& trainer, const std::vector<size_t>& items, bool train, StepResult* r) override {
    const auto& examples = train ? data_.train : data_.validation;
    const auto& kl = train ? kl_train_ : kl_val_;
    std::vector<const KtoSample*> group;
    std::vector<const Sample*> kl_group;
    for (size_t i : items) {
      group.push_back(&examples[i]);
      kl_group.push_back(&kl[i]);
    }
    const KtoBatch kb = collate_kto(group, kl_group, pad_id_);
    if (r != nullptr) {
      r->real_tokens += kb.completions.real_tokens;
      r->label_tokens += kb.completions.label_tokens;
    }
    CausalLM& model = trainer.model();
    const at::Device device = model->device();
    // The reference first: with LoRA it swaps modules_to_save to their original values (see pair_objective).
    at::Tensor ref, ref_kl;
    const at::Tensor& pre = train ? pre_train_ : pre_val_;
    if (pre.defined()) {
      const at::Tensor s = pre.index_select(0, at::tensor(std::vector<int64_t>(items.begin(), items.end()), at::kLong));
      ref = s.select(1, 0).to(device);
      ref_kl = s.select(1, 1).to(device);
    } else {
      ref = reference_logps(model, reference_, kb.completions, trainer.autocast()).sum;
      ref_kl = reference_logps(model, reference_, kb.kl, trainer.autocast()).sum;
    }
    AutocastScope autocast(trainer.autocast(), device);
    const at::Tensor policy = batch_logps(model, kb.completions).sum;  // [B]
    at::Tensor policy_kl;
    {
      at::NoGradGuard no_grad;  // TRL runs the KL batch through the policy without gradients
      policy_kl = batch_logps(model, kb.kl).sum;
    }
    const at::Tensor desirable = kb.desirable.to(device);
    const at::Tensor d = desirable.nonzero().squeeze(1), u = desirable.logical_not().nonzero().squeeze(1);
    PreferenceInputs in;
    in.policy_chosen_logps = policy.index_select(0, d);
    in.policy_rejected_logps = policy.index_select(0, u);
    in.reference_chosen_logps = ref.index_select(0, d);
    in.reference_rejected_logps = ref.index_select(0, u);
    in.policy_kl_logps = policy_kl;
    in.reference_kl_logps = ref_kl;
    PreferenceResult res = preference_loss(options_, in);
    MicroResult out;
    out.loss = res.loss;
    out.metrics = std::move(res.metrics);
    return out;
  }

 private:
  std::vector<Sample> kl_rows(const std::vector<KtoSample>& examples, size_t block) const {
    std::vector<Sample> out;
    block = std::max<size_t>(2, block);
    for (size_t i = 0; i < examples.size(); i += block) {
      std::vector<const KtoSample*> group;
      for (size_t j = i; j < std::min(examples.size(), i + block); ++j) group.push_back(&examples[j]);
      if (group.size() == 1) {  // a block of one: its KL row comes from the example before it (or itself)
        const std::vector<const KtoSample*> two = {i > 0 ? &examples[i - 1] : group[0], group[0]};
        out.push_back(kto_kl_samples(two, encoder_options_)[1]);
        continue;
      }
      for (Sample& s : kto_kl_samples(group, encoder_options_)) out.push_back(std::move(s));
    }
    return out;
  }

  KtoData data_;
  std::vector<Sample> kl_train_, kl_val_;
  at::Tensor pre_train_, pre_val_;
};

}  // namespace

TrainResult run_rlhf(const TrainConfig& config, const TrainHooks& hooks) {
  preference_options(config);  // refused before anything is loaded
  return run_job(config, hooks, [](JobContext& job) -> std::unique_ptr<TrainingTask> {
    if (job.config.rlhf_type == "kto") return std::make_unique<KtoTask>(job);
    return std::make_unique<PairTask>(job);
  }, config.rlhf_type);
}

}  // namespace swiftcpp
