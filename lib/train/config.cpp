#include "train/config.h"

#include <limits>

#include "core/error.h"
#include "template/template.h"

namespace swiftcpp {

namespace {
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

ConfigSchema<TrainConfig> make_schema() {
  using C = TrainConfig;
  ConfigSchema<C> s;
  std::vector<std::string> templates = chat_template_names();
  templates.insert(templates.begin(), "");
  s.string("model", &C::model, "Hugging Face checkpoint folder (config.json + safetensors + tokenizer)")
      .string("train_type", &C::train_type, "full fine-tuning or LoRA/DoRA adapters", {"lora", "full"})
      .alias("tuner_type", "train_type")
      .string("adapters", &C::adapters, "PEFT adapter folder to continue training from (LoRA only)")
      .string("torch_dtype", &C::torch_dtype, "dtype the weights are loaded in", {"float32", "bfloat16", "float16"})
      .string("device", &C::device, "cpu, cuda or cuda:N")
      .boolean("bf16", &C::bf16, "bf16 autocast for forward and loss (weights and optimizer stay float32)")
      .boolean("gradient_checkpointing", &C::gradient_checkpointing, "recompute layer activations in backward")
      .integer("lora_rank", &C::lora_rank, "LoRA rank r", 1, 65536)
      .number("lora_alpha", &C::lora_alpha, "LoRA alpha (scale = alpha / r)", 0.0)
      .number("lora_dropout", &C::lora_dropout, "dropout on the adapter input", 0.0, 0.999)
      .strings("target_modules", &C::target_modules, "linear layers to adapt: names (q_proj, ...) or all-linear")
      .boolean("use_rslora", &C::use_rslora, "rank-stabilised scale alpha / sqrt(r)")
      .boolean("use_dora", &C::use_dora, "DoRA: weight-decomposed adapters (magnitude + direction)")
      .integer("zero_stage", &C::zero_stage, "multi-process: 1 shards the AdamW state across ranks (ZeRO-1), 0 keeps "
               "a full copy on each", 0, 1)
      .number("ddp_timeout", &C::ddp_timeout, "multi-process: seconds a rendezvous or collective waits for the other "
              "ranks before failing (a dead or hung rank stops the job)", 1.0, 1e7)
      .integer("quant_bits", &C::quant_bits, "QLoRA: the frozen base's linear layers packed to int4 or int8 (0: float)", 0, 8)
      .integer("quant_group_size", &C::quant_group_size, "QLoRA: input columns per quantisation scale (-1: one per output row)", -1, 1 << 20)
      .strings("modules_to_save", &C::modules_to_save, "modules trained in full beside the adapter (lm_head, embed_tokens)")
      .boolean("freeze_vit", &C::freeze_vit, "vision-language models: keep the vision tower frozen")
      .integer("max_pixels", &C::max_pixels, "Qwen2-VL: the image processor's max_pixels (ms-swift's MAX_PIXELS; 0: "
               "preprocessor_config.json's)", 0, int64_t{1} << 32)
      .integer("min_pixels", &C::min_pixels, "Qwen2-VL: the image processor's min_pixels (0: preprocessor_config.json's)",
               0, int64_t{1} << 32)
      .boolean("freeze_aligner", &C::freeze_aligner, "vision-language models: keep the projector (aligner) frozen; "
               "otherwise it trains in full (saved as modules_to_save with LoRA)")
      .boolean("freeze_llm", &C::freeze_llm, "vision-language models: keep the language model frozen (no adapters "
               "on it with LoRA)")
      .strings("dataset", &C::dataset, "training data files, each 'path' or 'path#N' (first N rows)")
      .strings("val_dataset", &C::val_dataset, "validation data files")
      .number("split_dataset_ratio", &C::split_dataset_ratio, "share of dataset held out for validation", 0.0, 0.99)
      .boolean("dataset_shuffle", &C::dataset_shuffle, "shuffle training data (each epoch, from seed)")
      .string("template", &C::chat_template, "chat template; empty: detected from the checkpoint", templates)
      .string("system", &C::system, "system prompt replacing every row's")
      .integer("max_length", &C::max_length, "longest sample in tokens (packed row length with packing)", 2, kMaxInt)
      .string("truncation_strategy", &C::truncation_strategy, "what to do with longer samples", {"delete", "left", "right"})
      .string("loss_scale", &C::loss_scale, "which assistant turns are trained", {"default", "last_round"})
      .boolean("packing", &C::packing, "pack samples into rows of max_length (block-diagonal attention); same as batching: packing")
      .string("batching", &C::batching, "how a global batch becomes micro-steps: padded rows, packed rows of max_length, "
              "or ChunkFlow chunks of chunk_size", {"padding", "packing", "chunkflow"})
      .integer("chunk_size", &C::chunk_size, "ChunkFlow: tokens per chunk; short samples are packed into chunks, longer "
               "ones split into dependent chunks", 1, kMaxInt)
      .integer("chunk_keep", &C::chunk_keep, "ChunkFlow: chunks of a split sequence whose activations stay alive (the "
               "others are recomputed in backward)", 1, kMaxInt)
      .string("scheduler", &C::scheduler, "which samples of a global batch each process trains in which micro-batch: "
              "in order (none), or a Skrull-family scheduler over the samples' lengths (micro-batches are then packed "
              "rows of at most skrull_budget tokens)", {"none", "skrull", "skrull_paper", "round_robin", "sorted",
              "flops_balanced"})
      .integer("skrull_budget", &C::skrull_budget, "scheduler: tokens one process holds in one micro-batch (the "
               "memory budget C; 0: max_length)", 0, kMaxInt)
      .string("skrull_profile", &C::skrull_profile, "scheduler: device profile JSON from an earlier run's "
              "device_profile.json (empty: measured at the start of this run and saved there)")
      .integer("context_parallel_size", &C::context_parallel_size, "scheduler: processes of one context-parallel "
               "group; a sample the scheduler marks distributed is sharded over its group (K/V all-gathered in each "
               "layer), so samples up to context_parallel_size x skrull_budget tokens train", 1, 1 << 16)
      .boolean("strict", &C::strict, "fail on the first bad data row (false: skip and count them)")
      .integer("dataset_num_proc", &C::dataset_num_proc, "preprocessing threads (0: every core)", 0, 1024)
      .string("data_cache_dir", &C::data_cache_dir, "folder caching tokenised data (empty: no cache)")
      .number("learning_rate", &C::learning_rate, "peak learning rate", 0.0, 10.0)
      .number("adam_beta1", &C::adam_beta1, "AdamW beta1", 0.0, 0.999999)
      .number("adam_beta2", &C::adam_beta2, "AdamW beta2", 0.0, 0.999999999)
      .number("adam_epsilon", &C::adam_epsilon, "AdamW epsilon", 0.0, 1.0)
      .number("weight_decay", &C::weight_decay, "decoupled weight decay (not on norms and biases)", 0.0, 10.0)
      .number("max_grad_norm", &C::max_grad_norm, "clip gradients to this global L2 norm (0: no clipping)", 0.0)
      .boolean("skip_nonfinite_loss", &C::skip_nonfinite_loss, "a step whose loss is NaN or infinite: false stops "
               "the run with an error naming the step (the last checkpoint stays as it was), true drops that step's "
               "gradients without an optimizer update and logs the skip")
      .string("lr_scheduler_type", &C::lr_scheduler_type, "learning-rate schedule after warm-up", {"cosine", "linear", "constant"})
      .number("warmup_ratio", &C::warmup_ratio, "warm-up steps as a share of all steps", 0.0, 1.0)
      .integer("warmup_steps", &C::warmup_steps, "warm-up steps (overrides warmup_ratio when > 0)", 0, kMaxInt)
      .integer("per_device_train_batch_size", &C::per_device_train_batch_size, "samples (or packed rows) per micro-batch", 1, 1 << 20)
      .integer("per_device_eval_batch_size", &C::per_device_eval_batch_size, "samples per validation batch", 1, 1 << 20)
      .integer("gradient_accumulation_steps", &C::gradient_accumulation_steps, "micro-batches per optimizer step", 1, 1 << 20)
      .number("num_train_epochs", &C::num_train_epochs, "passes over the training data (used when max_steps <= 0)", 0.0, 1e6)
      .integer("max_steps", &C::max_steps, "optimizer steps (overrides num_train_epochs when > 0)", -1, kMaxInt)
      .integer("seed", &C::seed, "seed of adapter init, data order and dropout", 0, kMaxInt)
      .string("rlhf_type", &C::rlhf_type, "swiftcpp rlhf: the preference method (empty: supervised fine-tuning)",
              {"", "dpo", "kto", "orpo", "cpo", "simpo", "rm", "grpo"})
      .optional_number("beta", &C::beta, "rlhf: strength of the implicit reward / KL (null: 0.1; 2.0 with simpo; "
                       "0.04 with grpo)", 0.0)
      .string("loss_type", &C::loss_type, "rlhf: sigmoid|ipo|hinge|robust (dpo), sigmoid|hinge|ipo|simpo (cpo, "
              "simpo), kto (kto), grpo|bnpo|dr_grpo|dapo (grpo); empty: the method's default")
      .number("label_smoothing", &C::label_smoothing, "rlhf dpo/cpo/simpo: conservative DPO's label noise", 0.0, 0.5)
      .optional_number("rpo_alpha", &C::rpo_alpha, "rlhf dpo: weight of RPO (adds the chosen answers' NLL; null: off)", 0.0)
      .boolean("reference_free", &C::reference_free, "rlhf dpo: ignore the reference model (a uniform one)")
      .number("desirable_weight", &C::desirable_weight, "rlhf kto: weight of desirable examples' losses", 0.0)
      .number("undesirable_weight", &C::undesirable_weight, "rlhf kto: weight of undesirable examples' losses", 0.0)
      .number("simpo_gamma", &C::simpo_gamma, "rlhf simpo (cpo with loss_type simpo): target reward margin", 0.0)
      .number("cpo_alpha", &C::cpo_alpha, "rlhf cpo/simpo: weight of the chosen answers' NLL", 0.0)
      .optional_number("center_rewards_coefficient", &C::center_rewards_coefficient,
                       "rlhf rm: adds coefficient x mean((r_chosen + r_rejected)^2) (null: off)", 0.0)
      .string("ref_model", &C::ref_model, "rlhf dpo/kto with train_type full: the reference checkpoint (empty: the "
              "starting model; LoRA uses its own base with the adapters switched off)")
      .boolean("precompute_ref_log_probs", &C::precompute_ref_log_probs, "rlhf dpo/kto: reference log-probabilities "
               "computed once before training (no reference forward per step, no reference copy kept)")
      .integer("max_prompt_length", &C::max_prompt_length, "rlhf with truncation_strategy left/right: prompt tokens "
               "kept (0: max_length / 2)", 0, kMaxInt)
      .integer("num_generations", &C::num_generations, "rlhf grpo: completions sampled per prompt (G)", 2, 1 << 16)
      .integer("max_completion_length", &C::max_completion_length, "rlhf grpo: new tokens per completion", 1, kMaxInt)
      .number("temperature", &C::temperature, "rlhf grpo: rollout sampling temperature (also scales the loss's "
              "log-probabilities)", 1e-6, 100.0)
      .number("top_p", &C::top_p, "rlhf grpo: rollout nucleus sampling (1: off)", 1e-6, 1.0)
      .integer("top_k", &C::top_k, "rlhf grpo: rollout top-k sampling (0: off)", 0, kMaxInt)
      .number("repetition_penalty", &C::repetition_penalty, "rlhf grpo: rollout repetition penalty (1: off)", 1e-6, 100.0)
      .number("epsilon", &C::epsilon, "rlhf grpo: clip range of the probability ratio (lower side)", 0.0, 1.0)
      .optional_number("epsilon_high", &C::epsilon_high, "rlhf grpo: upper clip range (null: epsilon; DAPO's "
                       "clip-higher uses e.g. 0.28)", 0.0)
      .string("scale_rewards", &C::scale_rewards, "rlhf grpo: advantages divided by the std of their group, of the "
              "whole batch, or not at all", {"group", "batch", "none"})
      .integer("num_iterations", &C::num_iterations, "rlhf grpo: optimizer steps per rollout batch (mu)", 1, 1 << 16)
      .boolean("mask_truncated_completions", &C::mask_truncated_completions, "rlhf grpo: completions that reached "
               "max_completion_length without EOS count no token in the loss")
      .strings("reward_funcs", &C::reward_funcs, "rlhf grpo: accuracy, format, soft_overlong, repetition, cosine, "
               "external:COMMAND (JSON lines in, one number per line out)")
      .numbers("reward_weights", &C::reward_weights, "rlhf grpo: one weight per reward function (empty: all 1)")
      .number("reward_timeout", &C::reward_timeout, "rlhf grpo: seconds an external reward command may take per "
              "batch", 0.001, 1e7)
      .boolean("log_completions", &C::log_completions, "rlhf grpo: write prompts, completions and rewards to "
               "completions.jsonl every logging_steps steps")
      .integer("soft_max_length", &C::soft_max_length, "rlhf grpo soft_overlong: length where the penalty reaches -1 "
               "(0: max_completion_length)", 0, kMaxInt)
      .integer("soft_cache_length", &C::soft_cache_length, "rlhf grpo soft_overlong: tokens before soft_max_length "
               "where the penalty grows from 0", 0, kMaxInt)
      .integer("repetition_n_grams", &C::repetition_n_grams, "rlhf grpo repetition: n-gram size (words)", 1, 1 << 16)
      .number("repetition_max_penalty", &C::repetition_max_penalty, "rlhf grpo repetition: reward of a completion "
              "made of one repeated n-gram", -1e6, 0.0)
      .number("cosine_min_len_value_wrong", &C::cosine_min_len_value_wrong, "rlhf grpo cosine: reward of a wrong "
              "answer of length 0")
      .number("cosine_max_len_value_wrong", &C::cosine_max_len_value_wrong, "rlhf grpo cosine: reward of a wrong "
              "answer of length cosine_max_len")
      .number("cosine_min_len_value_correct", &C::cosine_min_len_value_correct, "rlhf grpo cosine: reward of a "
              "correct answer of length 0")
      .number("cosine_max_len_value_correct", &C::cosine_max_len_value_correct, "rlhf grpo cosine: reward of a "
              "correct answer of length cosine_max_len")
      .integer("cosine_max_len", &C::cosine_max_len, "rlhf grpo cosine: length scale (0: max_completion_length)", 0,
               kMaxInt)
      .string("output_dir", &C::output_dir, "runs are written to output_dir/vN-YYYYMMDD-HHMMSS/")
      .integer("logging_steps", &C::logging_steps, "log every N steps", 1, kMaxInt)
      .integer("save_steps", &C::save_steps, "save a checkpoint every N steps", 1, kMaxInt)
      .integer("save_total_limit", &C::save_total_limit, "keep at most N checkpoints (-1: all)", -1, kMaxInt)
      .integer("eval_steps", &C::eval_steps, "validation loss every N steps (-1: save_steps)", -1, kMaxInt)
      .boolean("save_only_model", &C::save_only_model, "checkpoints without optimizer and RNG state (cannot resume)")
      .string("resume_from_checkpoint", &C::resume_from_checkpoint, "checkpoint folder to resume, or 'latest'");
  return s;
}
}  // namespace

const ConfigSchema<TrainConfig>& train_config_schema() {
  static const ConfigSchema<TrainConfig> schema = make_schema();
  return schema;
}

TrainConfig rlhf_defaults() {
  TrainConfig c;
  c.rlhf_type = "dpo";
  c.loss_scale = "last_round";
  return c;
}

TrainConfig load_train_config(const std::string& recipe, const std::vector<std::string>& overrides,
                              const TrainConfig& defaults) {
  TrainConfig config = defaults;
  if (!recipe.empty()) train_config_schema().apply_file(config, recipe);
  for (const auto& o : overrides) train_config_schema().apply_override(config, o);
  validate_train_config(config);
  return config;
}

std::vector<std::pair<std::string, bool>> grpo_keys_given(const TrainConfig& c) {
  const TrainConfig d;
  return {{"num_generations", c.num_generations != d.num_generations},
          {"max_completion_length", c.max_completion_length != d.max_completion_length},
          {"temperature", c.temperature != d.temperature}, {"top_p", c.top_p != d.top_p},
          {"top_k", c.top_k != d.top_k}, {"repetition_penalty", c.repetition_penalty != d.repetition_penalty},
          {"epsilon", c.epsilon != d.epsilon}, {"epsilon_high", c.epsilon_high.has_value()},
          {"scale_rewards", c.scale_rewards != d.scale_rewards}, {"num_iterations", c.num_iterations != d.num_iterations},
          {"mask_truncated_completions", c.mask_truncated_completions}, {"reward_funcs", !c.reward_funcs.empty()},
          {"reward_weights", !c.reward_weights.empty()}, {"reward_timeout", c.reward_timeout != d.reward_timeout},
          {"log_completions", c.log_completions}, {"soft_max_length", c.soft_max_length != d.soft_max_length},
          {"soft_cache_length", c.soft_cache_length != d.soft_cache_length},
          {"repetition_n_grams", c.repetition_n_grams != d.repetition_n_grams},
          {"repetition_max_penalty", c.repetition_max_penalty != d.repetition_max_penalty},
          {"cosine_min_len_value_wrong", c.cosine_min_len_value_wrong != d.cosine_min_len_value_wrong},
          {"cosine_max_len_value_wrong", c.cosine_max_len_value_wrong != d.cosine_max_len_value_wrong},
          {"cosine_min_len_value_correct", c.cosine_min_len_value_correct != d.cosine_min_len_value_correct},
          {"cosine_max_len_value_correct", c.cosine_max_len_value_correct != d.cosine_max_len_value_correct},
          {"cosine_max_len", c.cosine_max_len != d.cosine_max_len}};
}

void validate_train_config(const TrainConfig& c) {
  if (c.model.empty()) fail<ConfigError>("'model' is required: a Hugging Face checkpoint folder");
  if (c.dataset.empty()) fail<ConfigError>("'dataset' is required: one or more data files (path or path#N)");
  if (c.train_type == "full") {
    if (!c.adapters.empty()) fail<ConfigError>("'adapters' needs train_type lora (got full)");
    if (c.use_dora) fail<ConfigError>("'use_dora' needs train_type lora (got full)");
    if (!c.modules_to_save.empty()) fail<ConfigError>("'modules_to_save' needs train_type lora (full trains everything)");
  }
  if (c.rlhf_type.empty()) {  // supervised fine-tuning: a preference key set means the wrong command or a typo
    const TrainConfig d;
    const std::vector<std::pair<const char*, bool>> set = {
        {"beta", c.beta.has_value()}, {"loss_type", !c.loss_type.empty()},
        {"label_smoothing", c.label_smoothing != d.label_smoothing}, {"rpo_alpha", c.rpo_alpha.has_value()},
        {"reference_free", c.reference_free}, {"desirable_weight", c.desirable_weight != d.desirable_weight},
        {"undesirable_weight", c.undesirable_weight != d.undesirable_weight},
        {"simpo_gamma", c.simpo_gamma != d.simpo_gamma}, {"cpo_alpha", c.cpo_alpha != d.cpo_alpha},
        {"center_rewards_coefficient", c.center_rewards_coefficient.has_value()}, {"ref_model", !c.ref_model.empty()},
        {"precompute_ref_log_probs", c.precompute_ref_log_probs}, {"max_prompt_length", c.max_prompt_length != 0}};
    for (const auto& [key, given] : set) {
      if (given) fail<ConfigError>("'{}' is a preference-training key: set rlhf_type and run 'swiftcpp rlhf'", key);
    }
  }
  if (c.rlhf_type != "grpo") {  // the online-RL keys belong to rlhf_type grpo alone
    for (const auto& [key, given] : grpo_keys_given(c)) {
      if (given) {
        fail<ConfigError>("'{}' is a GRPO key: it applies to rlhf_type grpo (run 'swiftcpp rlhf' with rlhf_type: grpo)",
                          key);
      }
    }
  }
  if (c.quant_bits != 0 && c.quant_bits != 4 && c.quant_bits != 8) {
    fail<ConfigError>("'quant_bits' must be 0 (float base), 4 or 8 (got {})", c.quant_bits);
  }
  if (c.quant_group_size == 0) fail<ConfigError>("'quant_group_size' must be positive or -1 (got 0)");
  if (c.quant_bits != 0 && c.train_type != "lora") {
    fail<ConfigError>("'quant_bits' (QLoRA) needs train_type lora: packed weights are frozen (got {})", c.train_type);
  }
  if (c.target_modules.empty()) fail<ConfigError>("'target_modules' must name at least one module (or all-linear)");
  if (c.max_steps <= 0 && c.num_train_epochs <= 0) {
    fail<ConfigError>("set max_steps > 0 or num_train_epochs > 0 (got max_steps {}, num_train_epochs {})", c.max_steps,
                      c.num_train_epochs);
  }
  if (c.packing && c.batching == "chunkflow") {
    fail<ConfigError>("packing: true and batching: chunkflow contradict each other (ChunkFlow packs short samples into "
                      "its chunks itself); drop packing");
  }
  if (effective_batching(c) == "chunkflow" && c.gradient_checkpointing) {
    fail<ConfigError>("gradient_checkpointing does not combine with batching: chunkflow; ChunkFlow bounds activation "
                      "memory itself: lower chunk_size or chunk_keep instead");
  }
  if (c.scheduler != "none") {
    if (effective_batching(c) == "chunkflow") {
      fail<ConfigError>("scheduler: {} places whole samples into packed micro-batches; it does not combine with "
                        "batching: chunkflow (use batching: padding or packing)", c.scheduler);
    }
    const int64_t budget = c.skrull_budget > 0 ? c.skrull_budget : c.max_length;
    if (budget * c.context_parallel_size < c.max_length) {
      fail<ConfigError>("skrull_budget {} x context_parallel_size {} is below max_length {}: a sample that long fits "
                        "no context-parallel group; raise skrull_budget or context_parallel_size, or lower max_length",
                        budget, c.context_parallel_size, c.max_length);
    }
  } else if (c.context_parallel_size > 1) {
    fail<ConfigError>("context_parallel_size {} needs a scheduler (e.g. scheduler: skrull) to decide which samples "
                      "are sharded", c.context_parallel_size);
  }
  if (c.bf16 && c.torch_dtype != "float32") {
    fail<ConfigError>("bf16 autocast keeps float32 master weights: use torch_dtype float32 with bf16 true (got {})",
                      c.torch_dtype);
  }
}

std::string effective_batching(const TrainConfig& c) { return c.packing ? std::string("packing") : c.batching; }

}  // namespace swiftcpp
