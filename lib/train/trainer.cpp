#include "train/trainer.h"

#include <ATen/autocast_mode.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/memory.h"
#include "core/plot.h"
#include "core/progress.h"
#include "core/runtime.h"
#include "data/pipeline.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "quant/gptq.h"
#include "tokenizer/tokenizer.h"
#include "train/schedule.h"

namespace swiftcpp {

namespace {

// bf16 autocast for the forward pass and the loss (backward runs outside, as torch.autocast recommends).
class AutocastScope {
 public:
  AutocastScope(bool on, const at::Device& device) : on_(on), cuda_(device.is_cuda()) {
    if (!on_) return;
    if (cuda_) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    }
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
  }

 private:
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

double peak_rss_mib() { return static_cast<double>(peak_rss_bytes()) / (1 << 20); }

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// output_dir/vN-YYYYMMDD-HHMMSS with N one above the highest existing version.
fs::path new_run_dir(const fs::path& output_dir) {
  create_folders(output_dir);
  static const std::regex version(R"(v(\d+)-.*)");
  int64_t next = 0;
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, version)) next = std::max<int64_t>(next, std::stoll(m[1]) + 1);
  }
  for (;; ++next) {
    const fs::path dir = output_dir / fmt::format("v{}-{}", next, utc_stamp());
    std::error_code ec;
    if (fs::create_directory(dir, ec)) return dir;
    if (ec) fail<IoError>("cannot create run folder {}: {}", dir.string(), ec.message());
  }
}

// checkpoint-<N> folders of a run that were completely written, by step.
std::map<int64_t, fs::path> complete_checkpoints(const fs::path& run_dir) {
  static const std::regex pattern(R"(checkpoint-(\d+))");
  std::map<int64_t, fs::path> out;
  if (!fs::is_directory(run_dir)) return out;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, pattern)) out[std::stoll(m[1])] = entry.path();
  }
  return out;
}

// The permutation of `n` items for an epoch: identity without shuffling, else Fisher-Yates from a generator
// seeded by (seed, epoch), portable across standard libraries.
std::vector<size_t> epoch_order(size_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) + 1);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

std::string dataset_path(const std::string& spec) {
  const auto hash = spec.rfind('#');
  return hash == std::string::npos ? spec : spec.substr(0, hash);
}

Json read_json_lines(const fs::path& file) {
  Json out = Json::array();
  if (!fs::exists(file)) return out;
  require_regular_file(file, "training log");
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Json row;
    std::string error;
    if (!try_parse_json(line, row, error)) break;  // a line cut by a hard kill: everything before it is intact
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

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
  return c.freeze_llm && under(name, mm.language_model);
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
  const at::Tensor ids = batch.input_ids.to(device);
  const at::Tensor labels = batch.labels.to(device).reshape({-1});  // [B*T]
  // The head and the loss only where a label is: padding and prompt positions cost no vocabulary projection.
  const at::Tensor hidden = model_->hidden_states(ids, options);     // [B, T, D]
  if (!need_loss) return {};
  const at::Tensor where = (labels != kIgnoreIndex).nonzero().squeeze(1);
  const at::Tensor targets = labels.index_select(0, where);                                   // [N]
  const at::Tensor logits = model_->logits(hidden.reshape({-1, hidden.size(-1)}).index_select(0, where));  // [N, V]
  const at::Tensor log_probs = at::log_softmax(logits, -1, at::kFloat);
  const at::Tensor loss = at::nll_loss(log_probs, targets, {}, at::Reduction::Sum);
  if (correct != nullptr) {
    at::NoGradGuard no_grad;
    const at::Tensor hits = logits.argmax(-1).eq(targets).sum();
    *correct = correct->defined() ? *correct + hits : hits;
  }
  return loss;
}

StepResult Trainer::step(const std::vector<Batch>& micro_batches, int64_t global_step, int64_t total_steps,
                         const std::vector<ShardBatch>& shards) {
  model_->train();
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
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();  // every tensor, not only this rank's (ZeRO-1)
  // Loss and accuracy stay on the device until the step ends: one host sync per step, not per micro-batch.
  step_start_ = std::chrono::steady_clock::now();
  at::Tensor loss_sum, correct;
  // The last backward of this rank's step reduces gradients as they arrive (several processes).
  size_t backwards = shards.size(), done = 0;
  for (const auto& batch : micro_batches) backwards += batch.label_tokens > 0 ? 1 : 0;
  const auto arm_if_last = [&] {
    if (reducer_ && ++done == backwards) reducer_->arm();
  };
  for (const auto& batch : micro_batches) {
    if (batch.label_tokens == 0) continue;
    arm_if_last();
    at::Tensor loss;
    {
      AutocastScope autocast(config_.bf16, model_->device());
      loss = forward_loss(batch, &correct);
    }
    (loss / denominator).backward();
    ++r.forwards;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  for (const auto& s : shards) {  // every rank of the group runs every shard: the layers exchange K/V
    nn::ChunkKV state;
    state.past_length = s.shard->offset();
    state.exchange = s.shard.get();
    arm_if_last();
    at::Tensor loss;
    {
      AutocastScope autocast(config_.bf16, model_->device());
      loss = forward_loss(s.batch, &correct, &state);
    }
    (loss / denominator).backward();
    ++r.forwards;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  finish_step(r, loss_sum, correct, global_step, total_steps);
  return r;
}

StepResult Trainer::step(const ChunkedBatch& batch, int64_t global_step, int64_t total_steps) {
  model_->train();
  StepResult r;
  r.label_tokens = global_count(batch.label_tokens);
  r.real_tokens = batch.real_tokens;
  const double denominator = static_cast<double>(std::max<int64_t>(1, r.label_tokens));
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();  // every tensor, not only this rank's (ZeRO-1)
  at::Tensor correct;
  step_start_ = std::chrono::steady_clock::now();
  // The images of a split sequence's chunks are encoded once, here: ChunkFlow runs a chunk whose graph it did not
  // keep twice (without autograd for its K/V, then again in backward), and the vision tower must not run twice.
  // Each chunk's features take part in exactly one backward, so their graph (projector, and a trainable tower)
  // is kept until then and freed by it.
  std::map<const Batch*, at::Tensor> features;  // chunk -> [N, F, D]
  for (const auto& chunks : batch.sequences) {
    for (const Batch& chunk : chunks) {
      if (!chunk.pixel_values.defined()) continue;
      AutocastScope autocast(config_.bf16, model_->device());
      features[&chunk] = model_->vision()->encode(chunk.pixel_values.to(model_->device()));
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
  finish_step(r, loss_sum, correct, global_step, total_steps);
  return r;
}

void Trainer::finish_step(StepResult& r, const at::Tensor& loss_sum, const at::Tensor& correct, int64_t global_step,
                          int64_t total_steps) {
  const double denominator = static_cast<double>(std::max<int64_t>(1, r.label_tokens));
  double loss = loss_sum.defined() ? loss_sum.item<double>() : 0.0;
  double hits = correct.defined() ? static_cast<double>(correct.item<int64_t>()) : 0.0;
  // The values above waited for the device: this rank's forward and backward work is done.
  r.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  reduce_gradients();  // first: buckets may already be in flight, and collectives must start in one order
  if (comm_) {
    // One collective: the loss sums, the token counts and each rank's compute time in its own slot.
    std::vector<double> v(3 + static_cast<size_t>(comm_->size()), 0.0);
    v[0] = loss;
    v[1] = hits;
    v[2] = static_cast<double>(r.real_tokens);
    v[3 + static_cast<size_t>(comm_->rank())] = r.compute_s;
    const auto sums = comm_->all_reduce_sum(v);
    loss = sums[0];
    hits = sums[1];
    r.real_tokens = static_cast<int64_t>(sums[2]);
    r.rank_compute_s.assign(sums.begin() + 3, sums.end());
  }
  r.loss = loss / denominator;
  r.token_acc = hits / denominator;
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

// ---------------------------------------------------------------------------------------------------------------
// run_training
// ---------------------------------------------------------------------------------------------------------------

fs::path find_latest_checkpoint(const fs::path& output_dir) {
  if (!fs::is_directory(output_dir)) fail<IoError>("resume_from_checkpoint latest: output_dir {} does not exist", output_dir.string());
  static const std::regex version(R"(v(\d+)-.*)");
  std::map<int64_t, fs::path> runs;
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, version)) runs[std::stoll(m[1])] = entry.path();
  }
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    const auto checkpoints = complete_checkpoints(it->second);
    for (auto c = checkpoints.rbegin(); c != checkpoints.rend(); ++c) {
      if (fs::exists(c->second / "trainer_state.json")) return c->second;
    }
  }
  fail<IoError>("resume_from_checkpoint latest: no resumable checkpoint under {}", output_dir.string());
}

namespace {

// Everything a resumed run must share with the run that wrote the checkpoint.
// The batch keys are a single process's equivalent (accumulation x world size), so a run resumes under another
// world size with the same global batch.
Json run_fingerprint(const TrainConfig& c, const LoraConfig& lora, int64_t total_steps, int world) {
  Json f = Json::object();
  f["model_config"] = fmt::format("{:016x}", hash_file(fs::path(c.model) / "config.json"));
  f["train_type"] = c.train_type;
  if (c.train_type == "lora") {
    f["lora"] = {{"r", lora.r}, {"lora_alpha", lora.lora_alpha}, {"target_modules", lora.target_modules},
                 {"use_rslora", lora.use_rslora}, {"use_dora", lora.use_dora}, {"modules_to_save", lora.modules_to_save}};
  }
  if (c.quant_bits != 0) {  // absent for a float base, so earlier checkpoints still resume
    f["quant_bits"] = c.quant_bits;
    f["quant_group_size"] = c.quant_group_size;
  }
  std::vector<std::string> data;
  for (const auto& spec : c.dataset) data.push_back(fmt::format("{}@{:016x}", spec, hash_file(dataset_path(spec))));
  f["dataset"] = data;
  f["template"] = c.chat_template;
  f["max_length"] = c.max_length;
  const std::string batching = effective_batching(c);
  f["packing"] = batching == "packing";
  if (batching == "chunkflow") {  // absent otherwise, so checkpoints written before ChunkFlow still resume
    f["batching"] = batching;
    f["chunk_size"] = c.chunk_size;
    f["chunk_keep"] = c.chunk_keep;
  }
  if (c.scheduler != "none") {  // the scheduler changes which samples share a micro-batch, not the update
    f["scheduler"] = c.scheduler;
    f["skrull_budget"] = c.skrull_budget > 0 ? c.skrull_budget : c.max_length;
  }
  f["per_device_train_batch_size"] = c.per_device_train_batch_size;
  f["gradient_accumulation_steps"] = c.gradient_accumulation_steps * world;
  f["seed"] = c.seed;
  f["dataset_shuffle"] = c.dataset_shuffle;
  f["split_dataset_ratio"] = c.split_dataset_ratio;
  f["learning_rate"] = c.learning_rate;
  f["lr_scheduler_type"] = c.lr_scheduler_type;
  f["total_steps"] = total_steps;
  f["torch_dtype"] = c.torch_dtype;
  return f;
}

void check_fingerprint(const Json& saved, const Json& now, const fs::path& checkpoint) {
  std::vector<std::string> diffs;
  for (const auto& [key, value] : now.items()) {
    if (!saved.contains(key)) {
      diffs.push_back(fmt::format("{} (missing in the checkpoint)", key));
    } else if (saved[key] != value) {
      diffs.push_back(fmt::format("{}: checkpoint {}, now {}", key, saved[key].dump(), value.dump()));
    }
  }
  for (const auto& [key, value] : saved.items()) {
    if (!now.contains(key)) diffs.push_back(fmt::format("{}: checkpoint {}, now not set", key, value.dump()));
  }
  if (!diffs.empty()) {
    fail<ConfigError>("cannot resume from {}: it was made by a different setup (model, data or recipe):\n  {}",
                      checkpoint.string(), fmt::join(diffs, "\n  "));
  }
}

void copy_model_files(const fs::path& from, const fs::path& to) {
  std::vector<std::string> names = model_asset_files();
  names.insert(names.begin(), "config.json");
  for (const std::string& name : names) {
    if (!fs::exists(from / name)) continue;
    std::error_code ec;
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec) fail<IoError>("cannot copy {} to {}: {}", (from / name).string(), to.string(), ec.message());
  }
}

struct RunState {
  int64_t global_step = 0;
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
  Json fingerprint;
};

// Writes checkpoint-<step> under a temporary name and renames it into place; then trims to save_total_limit.
// Several processes: every rank calls it (the optimizer state and RNG states are gathered), rank 0 writes, and all
// wait for the checkpoint to be in place.
fs::path save_checkpoint(const fs::path& run_dir, Trainer& trainer, const RunState& state, const fs::path& args_json) {
  const TrainConfig& c = trainer.config();
  const fs::path final_dir = run_dir / fmt::format("checkpoint-{}", state.global_step);
  dist::Communicator* comm = trainer.comm().get();
  std::vector<std::pair<std::string, at::Tensor>> rng_states;
  std::pair<std::vector<std::pair<std::string, at::Tensor>>, int64_t> opt;
  if (!c.save_only_model) {
    opt = trainer.optimizer_state();
    const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    rng_states.emplace_back("cpu", rng);  // rank 0's (and a single process's)
    if (comm != nullptr) {
      const auto all = comm->all_gather(rng);
      for (size_t r = 1; r < all.size(); ++r) rng_states.emplace_back(fmt::format("cpu.rank{}", r), all[r]);
    }
  }
  if (comm != nullptr && comm->rank() != 0) {
    comm->barrier();
    return final_dir;
  }
  // Everything goes into a hidden temporary folder (never matched by complete_checkpoints) that replaces
  // checkpoint-<step> in one rename; a failure removes it, a kill leaves it hidden and the old checkpoint intact.
  const fs::path tmp = run_dir / fmt::format(".checkpoint-{}.tmp-{}", state.global_step, getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail<IoError>("cannot create {}: {}", tmp.string(), ec.message());
  try {
    if (trainer.is_lora()) {
      save_adapter(tmp, trainer.model(), trainer.lora_config());
    } else {
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (const auto& item : trainer.model()->named_parameters(true)) tensors.emplace_back(item.key(), item.value().detach());
      save_safetensors(tmp / "model.safetensors", tensors, {{"format", "pt"}});
      copy_model_files(c.model, tmp);
    }
    if (!c.save_only_model) {
      save_safetensors(tmp / "optimizer.safetensors", opt.first, {{"step", std::to_string(opt.second)}});
      save_safetensors(tmp / "rng_state.safetensors", rng_states,
                       {{"world_size", std::to_string(comm != nullptr ? comm->size() : 1)}});
      Json ts = {{"global_step", state.global_step},
                 {"total_steps", state.total_steps},
                 {"steps_per_epoch", state.steps_per_epoch},
                 {"epoch", static_cast<double>(state.global_step) / static_cast<double>(state.steps_per_epoch)},
                 {"optimizer_steps", opt.second},
                 {"world_size", comm != nullptr ? comm->size() : 1},
                 {"fingerprint", state.fingerprint}};
      write_file_atomic(tmp / "trainer_state.json", ts.dump(2) + "\n");
    }
    if (fs::exists(args_json)) fs::copy_file(args_json, tmp / "args.json", fs::copy_options::overwrite_existing, ec);
    replace_folder(tmp, final_dir);  // an earlier checkpoint-<step> is swapped out in the same step
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (c.save_total_limit > 0) {
    auto all = complete_checkpoints(run_dir);
    while (static_cast<int64_t>(all.size()) > c.save_total_limit) {
      if (all.begin()->second == final_dir) break;
      // Hidden first, so a kill during the removal leaves no half-deleted checkpoint-<step> for a resume to find.
      const fs::path doomed = run_dir / fmt::format(".{}.old-{}", all.begin()->second.filename().string(), getpid());
      fs::rename(all.begin()->second, doomed, ec);
      fs::remove_all(ec ? all.begin()->second : doomed, ec);
      all.erase(all.begin());
    }
  }
  if (comm != nullptr) comm->barrier();
  return final_dir;
}

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

}  // namespace

TrainResult run_training(const TrainConfig& config_in, const TrainHooks& hooks) {
  TrainConfig config = config_in;
  validate_train_config(config);
  // Several processes (torchrun environment): data parallel over a c10d group; rank 0 logs and writes.
  const dist::DistEnv env = dist::read_env();
  at::Device device = parse_device(config.device);
  if (device.is_cuda() && env.world_size > 1) device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  std::shared_ptr<dist::Communicator> comm;
  if (env.world_size > 1) {
    comm = std::make_shared<dist::Communicator>(
        env, device, std::chrono::milliseconds(static_cast<int64_t>(config.ddp_timeout * 1000)));
  }
  const int rank = env.rank, world = env.world_size;
  const bool writer = rank == 0;
  // Context parallelism: groups of context_parallel_size consecutive ranks share the sharded sequences; the
  // global batch is dealt to the data_ranks = world / cp groups.
  const int cp = static_cast<int>(config.context_parallel_size);
  if (world % cp != 0) {
    fail<ConfigError>("context_parallel_size {} does not divide the {} processes of this job", cp, world);
  }
  const int data_ranks = world / cp, dp_rank = rank / cp, cp_rank = rank % cp;
  std::shared_ptr<dist::Communicator> cp_group;
  if (cp > 1) {
    std::vector<int> members;
    for (int j = 0; j < cp; ++j) members.push_back(dp_rank * cp + j);
    cp_group = comm->subgroup(members, fmt::format("cp{}", dp_rank));
  }
  NullBuffer null_buffer;
  std::ostream null_stream(&null_buffer);
  std::ostream& out = hooks.out != nullptr && writer ? *hooks.out : null_stream;
  const auto start_time = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count(); };

  // Resume or start a run folder.
  fs::path resume_dir;
  Json resume_state;
  if (!config.resume_from_checkpoint.empty()) {
    resume_dir = config.resume_from_checkpoint == "latest" ? find_latest_checkpoint(config.output_dir)
                                                           : fs::path(config.resume_from_checkpoint);
    if (!fs::is_directory(resume_dir)) fail<IoError>("resume_from_checkpoint: {} is not a folder", resume_dir.string());
    if (!fs::exists(resume_dir / "trainer_state.json")) {
      fail<ConfigError>("resume_from_checkpoint: {} has no trainer_state.json (written with save_only_model, or "
                        "not a swiftcpp checkpoint)", resume_dir.string());
    }
    resume_state = load_json_file(resume_dir / "trainer_state.json");
  }

  // Model, tokenizer, data.
  install_memory_tracking();
  LoadOptions load;
  load.device = device;
  load.dtype = parse_dtype(config.torch_dtype);
  CausalLM model = load_causal_lm(config.model, load);
  if (config.quant_bits != 0) {  // QLoRA: the frozen base's linear layers packed, their float weights freed
    QuantSpec spec;
    spec.bits = config.quant_bits;
    spec.group_size = config.quant_group_size;
    spec.sym = false;
    attach_packed_weights(model, quantize_model_rtn(model, spec));
  }
  if (!resume_dir.empty() && config.train_type == "full") {
    load_weights(model, Checkpoint::open(resume_dir), resume_dir.string(), load);
  }
  std::shared_ptr<const TextTokenizer> tokenizer = load_tokenizer(config.model);
  if (config.chat_template.empty()) config.chat_template = detect_chat_template(config.model);
  const auto tmpl = chat_template_for(*tokenizer, config.chat_template);
  EncodeOptions enc;
  enc.max_length = config.max_length;
  enc.truncation = parse_truncation_strategy(config.truncation_strategy);
  enc.loss_scale = parse_loss_scale(config.loss_scale);
  std::string image_fingerprint;
  if (const auto& mm = model->config().multimodal) {
    // Vision-language model: <image> placeholders become runs of image tokens, images preprocessed as the
    // checkpoint's preprocessor_config.json says.
    if (cp > 1) {
      fail<ConfigError>("context_parallel_size {} with a vision-language model: images cannot be sharded across "
                        "ranks; use data parallelism", cp);
    }
    enc.images = make_image_encoding(config.model, mm->image_token_index, mm->image_seq_length);
    image_fingerprint = "|images=" + image_encoding_fingerprint(*enc.images);
  }
  SampleEncoder encoder(tokenizer, tmpl, enc);
  DataOptions data;
  data.dataset = config.dataset;
  data.val_dataset = config.val_dataset;
  data.split_dataset_ratio = config.split_dataset_ratio;
  data.dataset_shuffle = config.dataset_shuffle;
  data.seed = static_cast<uint64_t>(config.seed);
  data.strict = config.strict;
  if (!config.system.empty()) data.system = config.system;
  data.num_threads = static_cast<int>(config.dataset_num_proc);
  data.cache_dir = config.data_cache_dir;
  const std::string data_fingerprint =
      fmt::format("{}|template={}|max_length={}|trunc={}|loss={}{}", tokenizer_files_fingerprint(config.model),
                  config.chat_template, config.max_length, config.truncation_strategy, config.loss_scale,
                  image_fingerprint);
  TokenizedData tokenized = prepare_data(data, encoder, data_fingerprint);
  if (tokenized.train.empty()) {
    fail<ConfigError>("no training samples: all {} rows of {} were skipped or longer than max_length {}",
                      tokenized.stats.rows, fmt::join(config.dataset, ", "), config.max_length);
  }
  const int32_t pad_id = tokenizer->specials().pad.value_or(0);
  // ChunkFlow keeps each image's run of tokens in one chunk.
  ImageTokenLayout image_layout;
  if (const auto& mm = model->config().multimodal) {
    image_layout = {static_cast<int32_t>(mm->image_token_index), mm->image_seq_length};
  }

  // Items: samples, or packed rows of samples. ChunkFlow chunks each step's samples itself.
  const std::string batching = effective_batching(config);
  const bool packing = batching == "packing", chunkflow = batching == "chunkflow";
  const bool scheduled = config.scheduler != "none";  // items are samples; the scheduler forms the micro-batches
  std::vector<std::vector<size_t>> items;
  if (packing && !scheduled) {
    std::vector<int64_t> lengths;
    for (const auto& s : tokenized.train) lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
    items = pack_best_fit_decreasing(lengths, config.max_length);
  } else {
    for (size_t i = 0; i < tokenized.train.size(); ++i) items.push_back({i});
  }
  const int64_t bs = config.per_device_train_batch_size, ga = config.gradient_accumulation_steps;
  const int64_t micro_per_epoch = (static_cast<int64_t>(items.size()) + bs - 1) / bs;
  RunState state;
  // A global batch is bs x ga items on each of the world's ranks: rank r takes the r-th run of bs x ga of it.
  state.steps_per_epoch = std::max<int64_t>(1, (micro_per_epoch + ga * data_ranks - 1) / (ga * data_ranks));
  state.total_steps = config.max_steps > 0
                          ? config.max_steps
                          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(config.num_train_epochs * state.steps_per_epoch)));

  // A resumed run must be the run the checkpoint came from: compare before touching anything.
  state.fingerprint = run_fingerprint(config, config.train_type == "lora" ? requested_lora(config) : LoraConfig{},
                                      state.total_steps, data_ranks);
  if (!resume_dir.empty()) check_fingerprint(resume_state.value("fingerprint", Json::object()), state.fingerprint, resume_dir);
  Trainer trainer(config, model, resume_dir.empty() || config.train_type == "full" ? "" : resume_dir.string(), comm);
  fs::path run_dir;
  if (!resume_dir.empty()) {
    const auto opt = SafetensorsFile::open(resume_dir / "optimizer.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& info : opt->tensors()) tensors.emplace_back(info.name, opt->tensor(info.name));
    const auto steps_it = opt->metadata().find("step");
    if (steps_it == opt->metadata().end()) fail<FormatError>("{}: no 'step' in the metadata", opt->path().string());
    trainer.load_optimizer_state(tensors, std::stoll(steps_it->second), opt->path().string());
    state.global_step = resume_state.at("global_step").get<int64_t>();
    // Each rank continues its own random stream; ranks the checkpoint has no stream for (another world size)
    // start one from the seed, the rank and the step.
    const auto rng = SafetensorsFile::open(resume_dir / "rng_state.safetensors");
    const std::string key = rank == 0 ? "cpu" : fmt::format("cpu.rank{}", rank);
    bool restored = false;
    for (const auto& info : rng->tensors()) restored = restored || info.name == key;
    if (restored) {
      auto generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(rng->tensor(key).clone());
    } else {
      at::manual_seed(static_cast<uint64_t>(config.seed) + static_cast<uint64_t>(rank) +
                      1000003ULL * static_cast<uint64_t>(state.global_step));
    }
    run_dir = resume_dir.parent_path();
  } else {
    at::manual_seed(static_cast<uint64_t>(config.seed) + static_cast<uint64_t>(rank));
    run_dir = writer ? new_run_dir(config.output_dir) : fs::path();
    if (comm) run_dir = comm->broadcast_string(run_dir.string(), 0, "swiftcpp/run_dir");
  }

  // args.json and the log (a resumed run keeps the records up to its checkpoint).
  const fs::path args_json = run_dir / "args.json";
  Json args = train_config_schema().dump(config);
  args["command_line"] = hooks.command_line;
  args["run_dir"] = run_dir.string();
  args["model_type"] = trainer.model()->config().model_type;
  args["total_steps"] = state.total_steps;
  args["steps_per_epoch"] = state.steps_per_epoch;
  args["world_size"] = world;
  if (writer) write_file_atomic(args_json, args.dump(2) + "\n");
  const fs::path log_file = run_dir / "logging.jsonl";
  Json history = writer ? read_json_lines(log_file) : Json::array();
  if (writer) {
    std::string kept;
    Json filtered = Json::array();
    for (const auto& record : history) {
      if (record.value("global_step", int64_t{0}) <= state.global_step) {
        kept += record.dump() + "\n";
        filtered.push_back(record);
      }
    }
    history = filtered;
    write_file_atomic(log_file, kept);
  }
  std::ofstream log;
  if (writer) {
    log.open(log_file, std::ios::app);
    if (!log) fail<IoError>("cannot append to {}", log_file.string());
  }
  const auto append_log = [&](const Json& record) {
    if (!writer) return;
    log << record.dump() << "\n";
    log.flush();
    history.push_back(record);
  };

  const int64_t trainable_count = [&] {
    int64_t n = 0;
    for (const auto& t : trainer.trainables()) n += t.tensor.numel();
    return n;
  }();
  out << fmt::format("run folder: {}\n", run_dir.string());
  std::string layout;
  if (packing) layout = fmt::format(", packed into {} rows of <= {}", items.size(), config.max_length);
  if (chunkflow) {
    int64_t longest = 0;
    for (const auto& s : tokenized.train) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.input_ids.size()));
    layout = fmt::format(", ChunkFlow chunks of {} tokens keeping {} (longest sample {} = {} chunks)", config.chunk_size,
                         config.chunk_keep, longest, (longest + config.chunk_size - 1) / config.chunk_size);
  }
  out << fmt::format("data: {} train samples, {} validation, {} tokens ({} trained){}\n", tokenized.train.size(),
                     tokenized.validation.size(), tokenized.stats.tokens, tokenized.stats.label_tokens, layout);
  // strict: false skips bad rows; say how many and why, so that nothing is dropped unseen.
  if (const std::string skipped = tokenized.stats.skipped.summary(); !skipped.empty()) out << "data: " << skipped << "\n";
  out << fmt::format("{} {}: {} trainable parameters; {} steps ({} per epoch), batch {} x {} accumulation{}\n",
                     config.train_type, trainer.model()->config().model_type, trainable_count, state.total_steps,
                     state.steps_per_epoch, bs, ga,
                     world > 1 ? fmt::format(" x {} processes ({}{})", world, comm ? "c10d " : "",
                                             config.zero_stage == 1 ? ", ZeRO-1" : "")
                               : "");
  if (!resume_dir.empty()) out << fmt::format("resuming from {} at step {}\n", resume_dir.string(), state.global_step);
  if (config.bf16 && device.is_cpu() && !cpu_has_bf16()) {
    out << "warning: bf16 autocast on a CPU without bf16 instructions (no avx512_bf16 / amx_bf16): LibTorch's "
           "bfloat16 matmuls fall back to scalar code, many times slower than float32; set bf16=false here\n";
  }

  // Validation batches, built once.
  std::vector<Batch> val_batches;
  for (size_t i = 0; i < tokenized.validation.size(); i += config.per_device_eval_batch_size) {
    std::vector<const Sample*> group;
    for (size_t j = i; j < std::min(tokenized.validation.size(), i + config.per_device_eval_batch_size); ++j) {
      group.push_back(&tokenized.validation[j]);
    }
    val_batches.push_back(collate_padded(group, pad_id));
  }
  const int64_t eval_every = config.eval_steps > 0 ? config.eval_steps : config.save_steps;

  TrainResult result;
  result.run_dir = run_dir;
  result.total_steps = state.total_steps;
  ProgressBar progress(state.total_steps, out, hooks.tty, config.logging_steps);
  progress.set_line_width(hooks.columns);
  int64_t cached_epoch = -1;
  std::vector<size_t> order;
  double window_loss = 0, window_acc = 0, window_tokens = 0, window_seconds = 0;
  int64_t window_steps = 0, window_peak_bytes = 0;
  int64_t window_trained = 0, window_skipped = 0;  // steps of the window that updated the weights / were skipped
  std::vector<double> window_rank_compute(static_cast<size_t>(world), 0.0);  // per rank: forward+backward seconds
  double window_modelled = 0;  // scheduler: the cost model's step time of the plans, summed
  int64_t window_sharded = 0;  // scheduler: samples sharded over a context-parallel group
  double train_seconds = 0;
  int64_t steps_done = 0;
  fs::path last_saved;

  // The scheduler's cost model: the model's shape and a device profile, read from skrull_profile or measured
  // here (every rank takes part; rank 0's numbers are used by all) and saved as the run's device_profile.json.
  GlobalBatchScheduler scheduler;
  if (scheduled) {
    scheduler.options.scheduler = skrull::parse_scheduler(config.scheduler);
    scheduler.options.dp = data_ranks;
    scheduler.options.cp = cp;
    scheduler.options.budget = config.skrull_budget > 0 ? config.skrull_budget : config.max_length;
    scheduler.cost.shape = model_shape(trainer.model()->config());
    const fs::path stored = run_dir / "device_profile.json";
    if (!config.skrull_profile.empty()) {
      scheduler.cost.device = skrull::DeviceProfile::load(config.skrull_profile);
    } else if (!resume_dir.empty() && fs::exists(stored)) {  // a resumed run plans as the run it continues
      scheduler.cost.device = skrull::DeviceProfile::load(stored.string());
    } else {
      out << "measuring the device for the scheduler's cost model...\n";
      // The probes must not move the random stream (dropout) the training continues with.
      auto generator = at::detail::getDefaultCPUGenerator();
      const at::Tensor rng = generator.get_state();
      scheduler.cost.device = measure_device_profile(trainer, comm.get(), scheduler.options.budget);
      generator.set_state(rng);
    }
    scheduler.cost.validate();
    if (writer) write_file_atomic(stored, scheduler.cost.device.to_json().dump(2) + "\n");
    out << fmt::format("scheduler {}: {} process{} ({} data-parallel x {} context-parallel), {} tokens per "
                       "micro-batch, device profile {}\n", config.scheduler, world, world > 1 ? "es" : "", data_ranks, cp,
                       scheduler.options.budget,
                       config.skrull_profile.empty() ? stored.string() : config.skrull_profile);
  }

  const auto run_eval = [&](int64_t step) {
    if (val_batches.empty()) return;
    // Each rank scores every world-th batch; the sums are combined.
    std::vector<Batch> mine;
    for (size_t i = static_cast<size_t>(rank); i < val_batches.size(); i += static_cast<size_t>(world)) mine.push_back(val_batches[i]);
    auto [sum, tokens] = trainer.evaluate(mine);
    if (comm) {
      const auto sums = comm->all_reduce_sum(std::vector<double>{sum, static_cast<double>(tokens)});
      sum = sums[0];
      tokens = static_cast<int64_t>(sums[1]);
    }
    const double loss = sum / static_cast<double>(std::max<int64_t>(1, tokens));
    append_log({{"eval_loss", loss}, {"eval_tokens", tokens}, {"global_step", step},
                {"epoch", static_cast<double>(step) / static_cast<double>(state.steps_per_epoch)}});
    result.eval_losses.emplace_back(step, loss);
    progress.message(fmt::format("step {}: eval_loss {:.4f}", step, loss));
  };
  if (resume_dir.empty()) run_eval(0);

  for (int64_t step = state.global_step; step < state.total_steps; ++step) {
    const int64_t epoch = step / state.steps_per_epoch, k = step % state.steps_per_epoch;
    if (epoch != cached_epoch) {
      order = epoch_order(items.size(), config.dataset_shuffle, static_cast<uint64_t>(config.seed), epoch);
      cached_epoch = epoch;
    }
    std::vector<Batch> micro;
    std::vector<ShardBatch> shards;
    ChunkedBatch chunked;
    // This rank's share of the global batch: items [first, last).
    const size_t first = std::min(items.size(), static_cast<size_t>((k * world + rank) * bs * ga));
    const size_t last = std::min(items.size(), first + static_cast<size_t>(bs * ga));
    double modelled_s = 0;
    if (scheduled) {  // the whole global batch's samples, placed by the scheduler; this rank's micro-batches packed
      const size_t g0 = std::min(items.size(), static_cast<size_t>(k * data_ranks * bs * ga));
      const size_t g1 = std::min(items.size(), g0 + static_cast<size_t>(data_ranks * bs * ga));
      std::vector<int64_t> lengths;
      for (size_t j = g0; j < g1; ++j) {
        lengths.push_back(static_cast<int64_t>(tokenized.train[items[order[j]][0]].input_ids.size()));
      }
      const skrull::Plan plan = scheduler.plan(lengths);
      modelled_s = skrull::model_step(plan, lengths, scheduler.cost).step_s;
      if (cp > 1) window_sharded += plan.stats.distributed;  // a group of one holds "distributed" samples whole
      for (const auto& mb : GlobalBatchScheduler::micro_batches_of(plan, dp_rank, cp_rank)) {
        std::vector<const Sample*> row;
        for (size_t pos : mb.local) row.push_back(&tokenized.train[items[order[g0 + pos]][0]]);
        if (!row.empty()) micro.push_back(collate_packed({row}, pad_id));
        for (size_t pos : mb.sharded) {  // this CP rank's shard of the sequence
          const Sample& whole = tokenized.train[items[order[g0 + pos]][0]];
          ShardBatch sb;
          sb.shard = std::make_shared<dist::SequenceShard>(cp_group, static_cast<int64_t>(whole.input_ids.size()));
          Sample part;
          const auto from = static_cast<std::ptrdiff_t>(sb.shard->offset());
          const auto to = from + static_cast<std::ptrdiff_t>(sb.shard->size());
          part.input_ids.assign(whole.input_ids.begin() + from, whole.input_ids.begin() + to);
          part.labels.assign(whole.labels.begin() + from, whole.labels.begin() + to);  // labels are already shifted
          sb.batch = collate_packed({{&part}}, pad_id);
          sb.batch.position_ids = sb.batch.position_ids + sb.shard->offset();
          sb.batch.segment_ids = at::Tensor();
          sb.batch.key_valid = at::Tensor();
          shards.push_back(std::move(sb));
        }
      }
    }
    if (chunkflow) {  // the whole global batch, re-cut into chunks
      std::vector<const Sample*> group;
      for (size_t j = first; j < last; ++j) group.push_back(&tokenized.train[items[order[j]][0]]);
      chunked = build_chunked_batch(group, config.chunk_size, pad_id, image_layout);
    }
    for (size_t i = first; i < last && !chunkflow && !scheduled; i += bs) {
      const size_t end = std::min(last, i + static_cast<size_t>(bs));
      if (packing) {
        std::vector<std::vector<const Sample*>> rows;
        for (size_t j = i; j < end; ++j) {
          rows.emplace_back();
          for (size_t s : items[order[j]]) rows.back().push_back(&tokenized.train[s]);
        }
        micro.push_back(collate_packed(rows, pad_id));
      } else {
        std::vector<const Sample*> group;
        for (size_t j = i; j < end; ++j) group.push_back(&tokenized.train[items[order[j]][0]]);
        micro.push_back(collate_padded(group, pad_id));
      }
    }
    reset_peak_memory(device);
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = chunkflow ? trainer.step(chunked, step, state.total_steps)
                                   : trainer.step(micro, step, state.total_steps, shards);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window_peak_bytes = std::max(window_peak_bytes, peak_memory_bytes(device));
    const int64_t global_step = step + 1;
    state.global_step = global_step;
    ++steps_done;
    train_seconds += seconds;
    result.losses.push_back(r.loss);
    if (r.skipped) {  // skip_nonfinite_loss: nothing was learned; the window's averages leave the step out
      ++window_skipped;
      append_log({{"global_step", global_step}, {"skipped", true},
                  {"reason", fmt::format("loss {}, gradient norm {}", r.loss, r.grad_norm)}});
      progress.message(fmt::format("step {}: loss {}, gradient norm {}: skipped (skip_nonfinite_loss), no update",
                                   global_step, r.loss, r.grad_norm));
    } else {
      window_loss += r.loss;
      window_acc += r.token_acc;
      ++window_trained;
    }
    window_tokens += static_cast<double>(r.real_tokens);
    window_seconds += seconds;
    window_modelled += modelled_s;
    for (size_t i = 0; i < window_rank_compute.size(); ++i) {
      window_rank_compute[i] += r.rank_compute_s.empty() ? r.compute_s : r.rank_compute_s[i];
    }
    ++window_steps;
    const double remaining = train_seconds / steps_done * static_cast<double>(state.total_steps - global_step);
    const bool last_step = global_step == state.total_steps;
    bool stopping = hooks.stop != nullptr && hooks.stop->load();
    if (comm) stopping = comm->all_reduce_sum(std::vector<double>{stopping ? 1.0 : 0.0})[0] > 0;  // all stop together
    if (global_step % config.logging_steps == 0 || last_step || stopping) {
      Json record = {{"loss", window_loss / std::max<int64_t>(1, window_trained)},
                  {"grad_norm", r.grad_norm},
                  {"learning_rate", r.learning_rate},
                  {"token_acc", window_acc / std::max<int64_t>(1, window_trained)},
                  {"epoch", static_cast<double>(global_step) / static_cast<double>(state.steps_per_epoch)},
                  {"global_step", global_step},
                  {"tokens_per_s", window_tokens / std::max(1e-9, window_seconds)},
                  {"memory_mib", peak_rss_mib()},
                  {"peak_memory_bytes", window_peak_bytes},
                  {"elapsed_time", format_duration(elapsed())},
                  {"remaining_time", format_duration(remaining)}};
      if (world > 1 || scheduled) {
        // Over the logged window: each rank's forward+backward seconds (its busy time before the gradient
        // reduction) and, with a scheduler, what the cost model predicted for the same plans.
        record["rank_compute_s"] = window_rank_compute;
        record["step_s"] = window_seconds;
        if (scheduled) {
          record["modelled_step_s"] = window_modelled;
          record["sharded_samples"] = window_sharded;
        }
      }
      if (r.skipped) record.erase("grad_norm");  // NaN/Inf has no JSON form
      if (window_trained == 0) {  // every step of the window was skipped: no loss to report
        record.erase("loss");
        record.erase("token_acc");
      }
      if (window_skipped > 0) record["skipped_steps"] = window_skipped;
      append_log(record);
      window_skipped = window_trained = 0;
      window_loss = window_acc = window_tokens = window_seconds = window_modelled = 0;
      window_sharded = 0;
      std::fill(window_rank_compute.begin(), window_rank_compute.end(), 0.0);
      window_steps = window_peak_bytes = 0;
    }
    ProgressStats stats;
    stats.loss = r.loss;
    stats.learning_rate = r.learning_rate;
    stats.tokens_per_s = static_cast<double>(r.real_tokens) / std::max(1e-9, seconds);
    stats.elapsed_s = elapsed();
    progress.update(global_step, stats);
    if (global_step % eval_every == 0 || last_step) run_eval(global_step);
    if (global_step % config.save_steps == 0 || last_step || stopping) {
      last_saved = save_checkpoint(run_dir, trainer, state, args_json);
      progress.message(fmt::format("saved {}", last_saved.string()));
    }
    if (stopping && !last_step) {
      result.interrupted = true;
      progress.message(fmt::format("stopped at step {}; resume with resume_from_checkpoint={}", global_step,
                                   last_saved.string()));
      break;
    }
  }
  progress.finish();
  result.global_step = state.global_step;
  result.last_checkpoint = last_saved.empty() ? fs::path(resume_dir) : last_saved;

  // The loss curve of the whole run (records before a resume included).
  Series train_curve{"train loss", {}, {}, ""}, eval_curve{"validation loss", {}, {}, ""};
  for (const auto& record : history) {
    // NaN/Inf (written to the log as null) has no place on the curve.
    const auto finite = [&](const char* key) {
      return record.contains(key) && record[key].is_number() && std::isfinite(record[key].get<double>());
    };
    if (finite("loss")) {
      train_curve.x.push_back(record["global_step"].get<double>());
      train_curve.y.push_back(record["loss"].get<double>());
    }
    if (finite("eval_loss")) {
      eval_curve.x.push_back(record["global_step"].get<double>());
      eval_curve.y.push_back(record["eval_loss"].get<double>());
    }
  }
  std::error_code ec;
  if (writer) fs::create_directories(run_dir / "images", ec);
  if (writer) write_loss_curve_svg(run_dir / "images" / "train_loss.svg", train_curve, eval_curve,
                       fmt::format("{} {} on {}", config.train_type, trainer.model()->config().model_type,
                                   fs::path(config.model).filename().string()));
  out << fmt::format("done: {} steps in {}, last checkpoint {}\n", state.global_step, format_duration(elapsed()),
                     result.last_checkpoint.string());
  return result;
}

}  // namespace swiftcpp
