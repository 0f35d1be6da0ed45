#include "train/trainer.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "nn/gemm.h"
#include "nn/row_adapters.h"
#include "train/autocast.h"

namespace swiftcpp {

LoraConfig requested_lora(const TrainConfig& config) {
  if (!config.adapters.empty()) return read_adapter_config(config.adapters);
  LoraConfig lora;
  lora.r = config.lora_rank;
  lora.lora_alpha = config.lora_alpha;
  lora.lora_dropout = config.lora_dropout;
  lora.target_modules = config.target_modules;
  lora.use_rslora = config.use_rslora;
  lora.use_dora = config.use_dora;
  lora.modules_to_save = config.modules_to_save;
  lora.base_model_name_or_path = config.model;
  if (config.rlhf_type == "rm") lora.task_type = "SEQ_CLS";
  return lora;
}

namespace {
bool under(const std::string& path, const std::string& module) {
  return path == module || path.compare(0, module.size() + 1, module + ".") == 0;
}

// Full fine-tuning of a vision-language model: whether a parameter belongs to a part the recipe freezes.
bool frozen_part(const std::string& name, const MultimodalConfig& mm, const TrainConfig& c) {
  for (const auto& m : mm.vision_tower) if (c.freeze_vit && under(name, m)) return true;
  for (const auto& m : mm.aligner) if (c.freeze_aligner && under(name, m)) return true;
  if (!mm.language_model.empty()) return c.freeze_llm && under(name, mm.language_model);
  return c.freeze_llm && [&] {  // the language model's model / lm_head sit at the top beside the vision parts
    for (const auto& m : mm.vision_tower) if (under(name, m)) return false;
    for (const auto& m : mm.aligner) if (under(name, m)) return false;
    return true;
  }();
}

// LoRA on a vision-language model: the aligner (unless frozen) and the vision tower (when not frozen) train in
// full beside the adapters, saved as PEFT saves modules_to_save.
void add_multimodal_parts(LoraConfig& lora, const MultimodalConfig& mm, const TrainConfig& c) {
  std::vector<std::string> parts;
  if (!c.freeze_aligner) parts.insert(parts.end(), mm.aligner.begin(), mm.aligner.end());
  if (!c.freeze_vit) parts.insert(parts.end(), mm.vision_tower.begin(), mm.vision_tower.end());
  for (const auto& p : parts) {
    if (std::find(lora.modules_to_save.begin(), lora.modules_to_save.end(), p) == lora.modules_to_save.end()) {
      lora.modules_to_save.push_back(p);
    }
  }
}
}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Trainer
// ---------------------------------------------------------------------------------------------------------------

Trainer::Trainer(const TrainConfig& config, CausalLM model, const std::string& adapter_dir,
                 std::shared_ptr<dist::Communicator> comm)
    : config_(config), model_(std::move(model)), comm_(comm && comm->size() > 1 ? std::move(comm) : nullptr) {
  model_->train();
  model_->set_gradient_checkpointing(config_.gradient_checkpointing);
  std::vector<TrainableTensor> params;
  if (!is_lora() && model_->has_packed_weights()) {
    fail<ConfigError>("{}: full fine-tuning cannot update packed integer weights; use train_type lora (QLoRA)",
                      config_.model);
  }
  const std::shared_ptr<const MultimodalConfig> mm = model_->config().multimodal;
  if (is_lora()) {
    const std::string dir = adapter_dir.empty() ? config_.adapters : adapter_dir;
    if (!dir.empty()) {
      lora_ = load_adapter(model_, dir);
    } else {
      lora_ = requested_lora(config_);
      if (mm) add_multimodal_parts(lora_, *mm, config_);
      if (mm && config_.freeze_llm) {
        // No adapter on the language model: only the parts trained in full remain.
        if (lora_.modules_to_save.empty()) {
          fail<ConfigError>("freeze_llm, freeze_aligner and freeze_vit together leave nothing to train");
        }
        lora_.target_modules.clear();
      }
      inject_lora(model_, lora_, static_cast<uint64_t>(config_.seed));
    }
    lora_.base_model_name_or_path = config_.model;
    params = adapter_tensors(model_, lora_);
  } else {
    for (auto& item : model_->named_parameters(true)) {
      const bool frozen = mm && frozen_part(item.key(), *mm, config_);
      item.value().requires_grad_(!frozen);
      if (!frozen) params.push_back({item.key(), item.value(), item.value().dim() >= 2});
    }
    if (params.empty()) fail<ConfigError>("freeze_llm, freeze_aligner and freeze_vit together leave nothing to train");
  }
  AdamWOptions adam;
  adam.lr = config_.learning_rate;
  adam.beta1 = config_.adam_beta1;
  adam.beta2 = config_.adam_beta2;
  adam.eps = config_.adam_epsilon;
  adam.weight_decay = config_.weight_decay;
  params_ = params;
  if (comm_ && config_.zero_stage == 1) {
    // ZeRO-1: tensors dealt largest first to the rank with the fewest elements so far (ties: lowest rank, then
    // tensor order), the same on every rank; each rank's AdamW holds state for its own tensors only.
    std::vector<size_t> order(params_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return params_[a].tensor.numel() > params_[b].tensor.numel(); });
    std::vector<int64_t> load(static_cast<size_t>(comm_->size()), 0);
    owner_.assign(params_.size(), 0);
    for (size_t i : order) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      owner_[i] = static_cast<int>(least);
      load[static_cast<size_t>(least)] += params_[i].tensor.numel();
    }
    std::vector<TrainableTensor> mine;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == comm_->rank()) mine.push_back(params_[i]);
    }
    params = std::move(mine);
  }
  optimizer_ = std::make_unique<AdamW>(std::move(params), adam);
  if (comm_) {
    std::vector<at::Tensor> tensors;
    for (const auto& p : params_) tensors.push_back(p.tensor);
    reducer_ = std::make_unique<dist::GradientReducer>(comm_, std::move(tensors));
  }
}

int64_t Trainer::global_count(int64_t local) const {
  if (!comm_) return local;
  return static_cast<int64_t>(comm_->all_reduce_sum(std::vector<double>{static_cast<double>(local)})[0]);
}

void Trainer::reduce_gradients() {
  if (reducer_) reducer_->finish();
}

void Trainer::broadcast_updated() {
  if (owner_.empty()) return;
  at::NoGradGuard no_grad;
  for (int r = 0; r < comm_->size(); ++r) {
    std::vector<at::Tensor> views;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == r) views.push_back(params_[i].tensor.detach().reshape({-1}).to(at::kFloat));
    }
    if (views.empty()) continue;
    at::Tensor flat = at::cat(views);
    comm_->broadcast(flat, r);
    if (r == comm_->rank()) continue;
    int64_t offset = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      at::Tensor t = params_[i].tensor;
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

std::pair<std::vector<std::pair<std::string, at::Tensor>>, int64_t> Trainer::optimizer_state() {
  if (owner_.empty()) return {optimizer_->state(), optimizer_->steps()};
  // Each rank's share, broadcast from its owner (exp_avg and exp_avg_sq of one tensor at a time).
  std::map<std::string, at::Tensor> mine;
  for (auto& [name, t] : optimizer_->state()) mine[name] = t;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
      const std::string name = prefix + params_[i].name;
      at::Tensor t = owner_[i] == comm_->rank() ? mine.at(name).clone()
                                                : at::empty(params_[i].tensor.sizes(), at::kFloat);
      comm_->broadcast(t, owner_[i]);
      out.emplace_back(name, t);
    }
  }
  return {out, optimizer_->steps()};
}

void Trainer::load_optimizer_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps,
                                   const std::string& origin) {
  if (owner_.empty()) {
    optimizer_->load_state(tensors, steps, origin);
    return;
  }
  std::set<std::string> wanted;
  for (const auto& p : optimizer_->params()) {
    wanted.insert("exp_avg." + p.name);
    wanted.insert("exp_avg_sq." + p.name);
  }
  std::vector<std::pair<std::string, at::Tensor>> mine;
  for (const auto& [name, t] : tensors) {
    if (wanted.count(name)) mine.emplace_back(name, t);
  }
  if (tensors.size() != 2 * params_.size()) {
    fail<FormatError>("{}: optimizer state holds {} tensors, expected {} (another tuning setup?)", origin,
                      tensors.size(), 2 * params_.size());
  }
  optimizer_->load_state(mine, steps, origin);
}

namespace {
// The head's weight [V, D] when the head is a plain product (no adapter, packed weight, bias, observer or logit cap),
// so the loss can run chunk by chunk (nn::linear_cross_entropy); undefined otherwise.
at::Tensor plain_head_weight(CausalLM& model) {
  if (model->config().final_logit_softcapping != 0 || nn::current_row_adapters() != nullptr) return {};
  if (!model->lm_head) return model->model->embed_tokens->weight;
  const nn::LinearImpl& head = *model->lm_head;
  if (head.lora || head.packed || head.blocks || head.bias.defined() || head.input_observer) return {};
  return head.weight;
}

// The real tokens of a padded batch as one packed row [1, N]: every sample (a padded row, or a packed sample of one)
// becomes a segment of its own and keeps its positions, so attention and loss are the padded batch's while the
// projections, norms and MLP do no work on padding (attention skips other segments' keys).
Batch one_packed_row(const Batch& b) {
  const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
  const at::Tensor where = b.key_valid.reshape({-1}).nonzero().squeeze(1);  // [N]
  const auto gather = [&](const at::Tensor& t) {  // [B, T] -> [1, N]
    return t.contiguous().view({-1}).index_select(0, where.to(t.device())).unsqueeze(0);
  };
  const auto longs = b.input_ids.options().dtype(at::kLong);
  const at::Tensor rows = at::arange(B, longs).unsqueeze(1).expand({B, T});
  Batch out;
  out.input_ids = gather(b.input_ids);
  out.labels = gather(b.labels);
  out.position_ids = gather(b.position_ids.defined() ? b.position_ids : at::arange(T, longs).unsqueeze(0).expand({B, T}));
  out.segment_ids = gather(b.segment_ids.defined() ? rows * (b.segment_ids.max() + 1) + b.segment_ids : rows);
  out.label_tokens = b.label_tokens;
  out.real_tokens = b.real_tokens;
  return out;
}
}  // namespace

int64_t Trainer::warmup_steps(int64_t total_steps) const {
  if (config_.warmup_steps > 0) return config_.warmup_steps;
  return static_cast<int64_t>(std::ceil(config_.warmup_ratio * static_cast<double>(total_steps)));
}

double Trainer::time_forward_backward(const Batch& batch) {
  model_->train();
  const auto t0 = std::chrono::steady_clock::now();
  {
    at::Tensor loss;
    {
      AutocastScope autocast(config_.bf16, model_->device());
      loss = forward_loss(batch, nullptr);
    }
    loss.backward();
    loss.item<double>();  // waits for the device
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
  return seconds;
}

at::Tensor Trainer::forward_loss(const Batch& batch, at::Tensor* correct, nn::ChunkKV* chunk, bool need_loss,
                                 const at::Tensor& image_features) {
  // Padding costs nothing: a padded text batch runs as one packed row of its real tokens (not with ChunkFlow's or
  // context parallelism's K/V, whose rows must stay as they are, nor with images, placed by row).
  if (chunk == nullptr && batch.key_valid.defined() && !batch.pixel_values.defined() && !image_features.defined() &&
      !batch.key_valid.all().item<bool>()) {
    return forward_loss(one_packed_row(batch), correct, chunk, need_loss, image_features);
  }
  const at::Device device = model_->device();
  ForwardOptions options;
  options.chunk = chunk;
  if (batch.position_ids.defined()) options.position_ids = batch.position_ids.to(device);
  if (batch.key_valid.defined()) options.key_valid = batch.key_valid.to(device);
  if (batch.segment_ids.defined()) options.segment_ids = batch.segment_ids.to(device);
  if (image_features.defined()) {
    options.image_features = image_features;
  } else if (batch.pixel_values.defined()) {
    options.pixel_values = batch.pixel_values.to(device);
  }
  options.image_grid_thw = batch.image_grid_thw;  // [N, 3] with variable-size images (M-RoPE positions too)
  const at::Tensor ids = batch.input_ids.to(device);
  const at::Tensor labels = batch.labels.to(device).reshape({-1});  // [B*T]
  // Mixture of experts with output_router_logits: the load-balancing loss joins the objective (as transformers).
  const MoeConfig& moe = model_->config().moe;
  const bool balance = moe.num_experts > 0 && moe.output_router_logits;
  std::vector<at::Tensor> router_logits;  // per sparse layer [B*T, E]
  if (balance) options.router_logits = &router_logits;
  // The head and the loss only where a label is: padding and prompt positions cost no vocabulary projection.
  const at::Tensor hidden = model_->hidden_states(ids, options);     // [B, T, D]
  if (!need_loss) return {};
  const at::Tensor where = (labels != kIgnoreIndex).nonzero().squeeze(1);
  const at::Tensor targets = labels.index_select(0, where);                                   // [N]
  const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)}).index_select(0, where);      // [N, D]
  at::Tensor logits, loss;  // logits [N, V] only where the head is not a plain product
  if (const at::Tensor head = plain_head_weight(model_); head.defined()) {
    loss = nn::linear_cross_entropy(rows, head, targets, correct);  // never holds [N, V]
  } else {
    logits = model_->logits(rows);
    loss = at::nll_loss(at::log_softmax(logits, -1, at::kFloat), targets, {}, at::Reduction::Sum);
  }
  if (balance && !router_logits.empty()) {
    // Over this forward's real tokens (the key mask's last T columns); weighted by the label tokens, so that
    // dividing by the step's label tokens gives CE + coef * aux for one micro-batch and a token-weighted mean of the
    // micro-batches' aux terms otherwise.
    const int64_t T = ids.size(1);
    const at::Tensor valid = options.key_valid.defined()
                                 ? options.key_valid.narrow(1, options.key_valid.size(1) - T, T).reshape({-1})
                                 : at::Tensor();
    const at::Tensor aux = load_balancing_loss(router_logits, moe.top_k, valid);
    const double weight = static_cast<double>(targets.size(0));
    aux_sum_ = aux_sum_.defined() ? aux_sum_ + aux.detach() * weight : aux.detach() * weight;
    loss = loss + aux * (moe.router_aux_loss_coef * weight);
  }
  if (correct != nullptr && logits.defined()) {
    at::NoGradGuard no_grad;
    const at::Tensor hits = logits.argmax(-1).eq(targets).sum();
    *correct = correct->defined() ? *correct + hits : hits;
  }
  return loss;
}

void Trainer::begin_step(size_t backwards) {
  model_->train();
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();  // every tensor, not only this rank's (ZeRO-1)
  backwards_ = backwards;
  backwards_done_ = 0;
  aux_sum_ = at::Tensor();
  step_start_ = std::chrono::steady_clock::now();
}

void Trainer::backward(const at::Tensor& loss) {
  // The last backward of this rank's step reduces gradients as they arrive (several processes).
  if (reducer_ && ++backwards_done_ == backwards_) reducer_->arm();
  loss.backward();
}

StepResult Trainer::step(const std::vector<Batch>& micro_batches, int64_t global_step, int64_t total_steps,
                         const std::vector<ShardBatch>& shards) {
  StepResult r;
  for (const auto& b : micro_batches) {
    r.label_tokens += b.label_tokens;
    r.real_tokens += b.real_tokens;
  }
  for (const auto& s : shards) {
    r.label_tokens += s.batch.label_tokens;
    r.real_tokens += s.batch.real_tokens;
  }
  r.label_tokens = global_count(r.label_tokens);  // every rank's: the loss is normalised over the global batch
  const double denominator = static_cast<double>(std::max<int64_t>(1, r.label_tokens));
  size_t backwards = shards.size();
  for (const auto& batch : micro_batches) backwards += batch.label_tokens > 0 ? 1 : 0;
  begin_step(backwards);
  // Loss and accuracy stay on the device until the step ends: one host sync per step, not per micro-batch.
  at::Tensor loss_sum, correct;
  for (const auto& batch : micro_batches) {
    if (batch.label_tokens == 0) continue;
    at::Tensor loss;
    {
      AutocastScope autocast(config_.bf16, model_->device());
      loss = forward_loss(batch, &correct);
    }
    backward(loss / denominator);
    ++r.forwards;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  for (const auto& s : shards) {  // every rank of the group runs every shard: the layers exchange K/V
    nn::ChunkKV state;
    state.past_length = s.shard->offset();
    state.exchange = s.shard.get();
    at::Tensor loss;
    {
      AutocastScope autocast(config_.bf16, model_->device());
      loss = forward_loss(s.batch, &correct, &state);
    }
    backward(loss / denominator);
    ++r.forwards;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  finish_step(r, {loss_sum, correct}, [&](const std::vector<double>& sums) {
    r.loss = sums[0] / denominator;
    r.token_acc = sums[1] / denominator;
    r.metrics["token_acc"] = r.token_acc;
  }, global_step, total_steps);
  return r;
}

StepResult Trainer::step(const ChunkedBatch& batch, int64_t global_step, int64_t total_steps) {
  StepResult r;
  r.label_tokens = global_count(batch.label_tokens);
  r.real_tokens = batch.real_tokens;
  const double denominator = static_cast<double>(std::max<int64_t>(1, r.label_tokens));
  begin_step(0);  // ChunkFlow's backwards run inside chunkflow_backward: gradients are reduced at the end
  at::Tensor correct;
  // The images of a split sequence's chunks are encoded once, here: ChunkFlow runs a chunk whose graph it did not
  // keep twice (without autograd for its K/V, then again in backward), and the vision tower must not run twice.
  // Each chunk's features take part in exactly one backward, so their graph (projector, and a trainable tower)
  // is kept until then and freed by it.
  std::map<const Batch*, at::Tensor> features;  // chunk -> [N, F, D]
  for (const auto& chunks : batch.sequences) {
    for (const Batch& chunk : chunks) {
      if (!chunk.pixel_values.defined()) continue;
      AutocastScope autocast(config_.bf16, model_->device());
      features[&chunk] = model_->vision()->encode(chunk.pixel_values.to(model_->device()), chunk.image_grid_thw);
    }
  }
  const ChunkLossFn loss = [&](const Batch& chunk, nn::ChunkKV* state, bool need_loss) {
    AutocastScope autocast(config_.bf16, model_->device());
    const auto it = features.find(&chunk);
    return forward_loss(chunk, need_loss ? &correct : nullptr, state, need_loss,
                        it == features.end() ? at::Tensor() : it->second);
  };
  ChunkFlowOptions options;
  options.keep = config_.chunk_keep;
  ChunkFlowCounters counters;
  const at::Tensor loss_sum = chunkflow_backward(batch, loss, 1.0 / denominator, options, model_->device(), &counters);
  r.forwards = counters.forwards;
  finish_step(r, {loss_sum, correct}, [&](const std::vector<double>& sums) {
    r.loss = sums[0] / denominator;
    r.token_acc = sums[1] / denominator;
    r.metrics["token_acc"] = r.token_acc;
  }, global_step, total_steps);
  return r;
}

void Trainer::finish_step(StepResult& r, const std::vector<at::Tensor>& objective_sums,
                          const std::function<void(const std::vector<double>&)>& finalize, int64_t global_step,
                          int64_t total_steps) {
  // The load-balancing loss of a mixture of experts travels with the objective's sums and is logged as aux_loss.
  std::vector<at::Tensor> sums = objective_sums;
  const bool balance = model_->config().moe.num_experts > 0 && model_->config().moe.output_router_logits;
  if (balance) sums.push_back(aux_sum_.defined() ? aux_sum_ : at::zeros({}, at::kDouble));
  std::vector<double> values(sums.size(), 0.0);
  {
    std::vector<at::Tensor> defined;  // the first waits for the device; the others are ready by then
    for (const auto& t : sums) defined.push_back(t.defined() ? t.detach().to(at::kCPU, at::kDouble).reshape({}) : at::Tensor());
    std::vector<at::Tensor> present;
    for (const auto& t : defined) if (t.defined()) present.push_back(t);
    if (!present.empty()) {
      const at::Tensor host = at::stack(present).cpu();
      const double* data = host.data_ptr<double>();
      size_t k = 0;
      for (size_t i = 0; i < defined.size(); ++i) if (defined[i].defined()) values[i] = data[k++];
    }
  }
  // The values above waited for the device: this rank's forward and backward work is done.
  r.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  reduce_gradients();  // first: buckets may already be in flight, and collectives must start in one order
  if (comm_) {
    // One collective: the objective's sums, the token count and each rank's compute time in its own slot.
    const size_t n = values.size();
    std::vector<double> v(n + 1 + static_cast<size_t>(comm_->size()), 0.0);
    std::copy(values.begin(), values.end(), v.begin());
    v[n] = static_cast<double>(r.real_tokens);
    v[n + 1 + static_cast<size_t>(comm_->rank())] = r.compute_s;
    const auto all = comm_->all_reduce_sum(v);
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), values.begin());
    r.real_tokens = static_cast<int64_t>(all[n]);
    r.rank_compute_s.assign(all.begin() + static_cast<std::ptrdiff_t>(n + 1), all.end());
  }
  if (balance) {  // objectives without the token loss (preference, GRPO) compute none: nothing to log
    if (values.back() > 0) r.metrics["aux_loss"] = values.back() / static_cast<double>(std::max<int64_t>(1, r.label_tokens));
    values.pop_back();
  }
  finalize(values);
  r.grad_norm = clip_grad_norm(trainables(), config_.max_grad_norm);
  r.learning_rate = scheduled_lr(config_.lr_scheduler_type, config_.learning_rate, global_step,
                                 warmup_steps(total_steps), total_steps);
  // A NaN/Inf loss or gradient never reaches the weights. Every rank sees the same loss (all-reduced) and the same
  // summed gradients, so all of them take the same branch.
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
    if (!config_.skip_nonfinite_loss) {
      fail<Error>("step {}: the training {} is {}; stopped before the optimizer update, so the weights and the last "
                  "checkpoint are as they were (check the model's weights for NaN/Inf, lower learning_rate, or set "
                  "skip_nonfinite_loss: true to skip such steps)", global_step + 1,
                  std::isfinite(r.loss) ? "gradient norm" : "loss", std::isfinite(r.loss) ? r.grad_norm : r.loss);
    }
    r.skipped = true;
    return;
  }
  optimizer_->step(r.learning_rate);
  broadcast_updated();
}

std::pair<double, int64_t> Trainer::evaluate(const std::vector<Batch>& batches) {
  model_->eval();
  at::NoGradGuard no_grad;
  at::Tensor sum;
  int64_t tokens = 0;
  for (const auto& batch : batches) {
    if (batch.label_tokens == 0) continue;
    AutocastScope autocast(config_.bf16, model_->device());
    const at::Tensor loss = forward_loss(batch, nullptr);
    sum = sum.defined() ? sum + loss : loss;
    tokens += batch.label_tokens;
  }
  model_->train();
  return {sum.defined() ? sum.item<double>() : 0.0, tokens};
}

}  // namespace swiftcpp
