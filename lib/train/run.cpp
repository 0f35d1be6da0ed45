#include "train/run.h"

#include <ATen/ATen.h>
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
#include "io/safetensors.h"
#include "models/registry.h"
#include "quant/gptq.h"
#include "tokenizer/tokenizer.h"

namespace swiftcpp {

namespace {
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

std::string dataset_path(const std::string& spec) {
  const auto hash = spec.rfind('#');
  return hash == std::string::npos ? spec : spec.substr(0, hash);
}

}  // namespace

std::vector<size_t> epoch_order(size_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) + 1);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

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
Json run_fingerprint(const TrainConfig& c, const LoraConfig& lora, int64_t total_steps, int world,
                     const TrainingTask& task) {
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
  task.add_fingerprint(f);
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
fs::path save_checkpoint(const fs::path& run_dir, Trainer& trainer, const RunState& state, const fs::path& args_json,
                         const TrainingTask& task) {
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
      task.complete_model_checkpoint(tmp);
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

DataOptions data_options(const TrainConfig& config) {
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
  return data;
}

void load_job(JobContext& job) {
  const TrainConfig& config = job.config;
  LoadOptions load;
  load.device = job.device;
  load.dtype = parse_dtype(config.torch_dtype);
  job.model = load_causal_lm(config.model, load);
  if (config.quant_bits != 0) {  // QLoRA: the frozen base's linear layers packed, their float weights freed
    QuantSpec spec;
    spec.bits = config.quant_bits;
    spec.group_size = config.quant_group_size;
    spec.sym = false;
    attach_packed_weights(job.model, quantize_model_rtn(job.model, spec));
  }
  // The recipe's min_pixels / max_pixels (0: the checkpoint's preprocessor_config.json).
  vision::ImageProcessorOverrides images;
  if (config.max_pixels > 0) images.max_pixels = config.max_pixels;
  if (config.min_pixels > 0) images.min_pixels = config.min_pixels;
  job.assets = ModelAssets::open(config.model, config.chat_template, job.model->config().multimodal.get(), images);
  job.tokenizer = job.assets.tokenizer;
  if (job.config.chat_template.empty()) job.config.chat_template = job.assets.template_name;
}

TrainResult run_job(const TrainConfig& config_in, const TrainHooks& hooks, const TaskFactory& make_task,
                    const std::string& kind) {
  JobContext job;
  job.config = config_in;
  TrainConfig& config = job.config;
  validate_train_config(config);
  // Several processes (the torchrun environment, read by the caller): data parallel over a c10d group; rank 0 logs
  // and writes.
  const dist::DistEnv& env = hooks.dist_env;
  at::Device device = parse_device(config.device);
  if (device.is_cuda() && env.world_size > 1) device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  job.device = device;
  std::shared_ptr<dist::Communicator> comm;
  if (env.world_size > 1) {
    comm = std::make_shared<dist::Communicator>(
        env, device, std::chrono::milliseconds(static_cast<int64_t>(config.ddp_timeout * 1000)));
  }
  job.comm = comm;
  const int rank = env.rank, world = env.world_size;
  job.rank = rank;
  job.world = world;
  const bool writer = rank == 0;
  // Context parallelism: groups of context_parallel_size consecutive ranks share the sharded sequences; the
  // global batch is dealt to the data_ranks = world / cp groups.
  const int cp = static_cast<int>(config.context_parallel_size);
  if (world % cp != 0) {
    fail<ConfigError>("context_parallel_size {} does not divide the {} processes of this job", cp, world);
  }
  const int data_ranks = world / cp, dp_rank = rank / cp;
  job.cp = cp;
  job.data_ranks = data_ranks;
  job.dp_rank = dp_rank;
  job.cp_rank = rank % cp;
  if (cp > 1) {
    std::vector<int> members;
    for (int j = 0; j < cp; ++j) members.push_back(dp_rank * cp + j);
    job.cp_group = comm->subgroup(members, fmt::format("cp{}", dp_rank));
  }
  NullBuffer null_buffer;
  std::ostream null_stream(&null_buffer);
  std::ostream& out = hooks.out != nullptr && writer ? *hooks.out : null_stream;
  job.out = &out;
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
  job.resuming = !resume_dir.empty();

  // Model, tokenizer, then the task and its data.
  install_memory_tracking();
  load_job(job);
  std::unique_ptr<TrainingTask> task = make_task(job);
  if (!resume_dir.empty() && config.train_type == "full") {  // after the task: it may have added modules (a head)
    LoadOptions load;
    load.device = device;
    load.dtype = parse_dtype(config.torch_dtype);
    load_weights(job.model, Checkpoint::open(resume_dir), resume_dir.string(), load);
  }
  const size_t items = task->size();

  const int64_t bs = config.per_device_train_batch_size, ga = config.gradient_accumulation_steps;
  // A global batch is `per_rank` items (bs x ga unless the task says otherwise) on each of the world's ranks: rank
  // r takes the r-th run of them; the task may make several steps over one slice (steps_per_slice).
  const int64_t per_rank = task->items_per_step() > 0 ? task->items_per_step() : bs * ga;
  const int64_t per_slice = std::max<int64_t>(1, task->steps_per_slice());
  RunState state;
  state.steps_per_epoch = per_slice * std::max<int64_t>(1, (static_cast<int64_t>(items) + per_rank * data_ranks - 1) /
                                                               (per_rank * data_ranks));
  state.total_steps = config.max_steps > 0
                          ? config.max_steps
                          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(config.num_train_epochs * state.steps_per_epoch)));

  // A resumed run must be the run the checkpoint came from: compare before touching anything.
  state.fingerprint = run_fingerprint(config, config.train_type == "lora" ? requested_lora(config) : LoraConfig{},
                                      state.total_steps, data_ranks, *task);
  if (!resume_dir.empty()) check_fingerprint(resume_state.value("fingerprint", Json::object()), state.fingerprint, resume_dir);
  Trainer trainer(config, job.model, resume_dir.empty() || config.train_type == "full" ? "" : resume_dir.string(), comm);
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
  Json history = writer ? read_json_lines(log_file, "training log") : Json::array();
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
  out << task->describe();
  out << fmt::format("{} {} {}: {} trainable parameters; {} steps ({} per epoch), batch {} x {} accumulation{}\n",
                     kind, config.train_type, trainer.model()->config().model_type, trainable_count, state.total_steps,
                     state.steps_per_epoch, bs, ga,
                     world > 1 ? fmt::format(" x {} processes ({}{})", world, comm ? "c10d " : "",
                                             config.zero_stage == 1 ? ", ZeRO-1" : "")
                               : "");
  if (!resume_dir.empty()) out << fmt::format("resuming from {} at step {}\n", resume_dir.string(), state.global_step);
  if (config.bf16 && device.is_cpu() && !cpu_has_bf16()) {
    out << "warning: bf16 autocast on a CPU without bf16 instructions (no avx512_bf16 / amx_bf16): LibTorch's "
           "bfloat16 matmuls fall back to scalar code, many times slower than float32; set bf16=false here\n";
  }
  const int64_t eval_every = config.eval_steps > 0 ? config.eval_steps : config.save_steps;
  task->start(trainer, run_dir, !resume_dir.empty());

  TrainResult result;
  result.run_dir = run_dir;
  result.total_steps = state.total_steps;
  ProgressBar progress(state.total_steps, out, hooks.tty, config.logging_steps);
  progress.set_line_width(hooks.columns);
  int64_t cached_epoch = -1;
  std::vector<size_t> order;
  double window_loss = 0, window_tokens = 0, window_seconds = 0;
  // The objective's values over the window: averaged over the steps that report them (KTO's sides), or summed.
  std::map<std::string, std::pair<double, int64_t>> window_metrics;
  std::map<std::string, double> window_sums;
  int64_t window_steps = 0, window_peak_bytes = 0;
  int64_t window_trained = 0, window_skipped = 0;  // steps of the window that updated the weights / were skipped
  std::vector<double> window_rank_compute(static_cast<size_t>(world), 0.0);  // per rank: forward+backward seconds
  double train_seconds = 0;
  int64_t steps_done = 0;
  fs::path last_saved;

  const auto run_eval = [&](int64_t step) {
    const std::map<std::string, double> values = task->evaluate(trainer);
    if (values.empty()) return;
    Json record = {{"global_step", step},
                   {"epoch", static_cast<double>(step) / static_cast<double>(state.steps_per_epoch)}};
    for (const auto& [name, value] : values) record[name] = value;
    append_log(record);
    const auto loss = values.find("eval_loss");
    if (loss != values.end()) {
      result.eval_losses.emplace_back(step, loss->second);
      progress.message(fmt::format("step {}: eval_loss {:.4f}", step, loss->second));
    }
  };
  if (resume_dir.empty()) run_eval(0);

  for (int64_t step = state.global_step; step < state.total_steps; ++step) {
    const int64_t epoch = step / state.steps_per_epoch, k = step % state.steps_per_epoch;
    if (epoch != cached_epoch) {
      order = epoch_order(items, config.dataset_shuffle, static_cast<uint64_t>(config.seed), epoch);
      cached_epoch = epoch;
    }
    StepSlice slice;
    slice.order = &order;
    slice.index = k / per_slice;
    slice.iteration = k % per_slice;
    slice.first = std::min(items, static_cast<size_t>((slice.index * data_ranks + dp_rank) * per_rank));
    slice.last = std::min(items, slice.first + static_cast<size_t>(per_rank));
    slice.global_step = step;
    slice.total_steps = state.total_steps;
    reset_peak_memory(device);
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = task->step(trainer, slice);
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
      for (const auto& [name, value] : r.metrics) {
        window_metrics[name].first += value;
        window_metrics[name].second += 1;
      }
      ++window_trained;
    }
    for (const auto& [name, value] : r.window_sums) window_sums[name] += value;
    window_tokens += static_cast<double>(r.real_tokens);
    window_seconds += seconds;
    for (size_t i = 0; i < window_rank_compute.size(); ++i) {
      window_rank_compute[i] += r.rank_compute_s.empty() ? r.compute_s : r.rank_compute_s[i];
    }
    ++window_steps;
    const double remaining = train_seconds / steps_done * static_cast<double>(state.total_steps - global_step);
    const bool last_step = global_step == state.total_steps;
    bool stopping = hooks.stop != nullptr && hooks.stop->load();
    if (comm) stopping = comm->all_reduce_sum(std::vector<double>{stopping ? 1.0 : 0.0})[0] > 0;  // all stop together
    // Between two checkpointable steps (a rollout batch still in use) neither a checkpoint nor a stop happens.
    const bool boundary = task->checkpointable(global_step);
    stopping = stopping && boundary;
    if (global_step % config.logging_steps == 0 || last_step || stopping) {
      Json record = {{"loss", window_loss / std::max<int64_t>(1, window_trained)},
                  {"grad_norm", r.grad_norm},
                  {"learning_rate", r.learning_rate},
                  {"epoch", static_cast<double>(global_step) / static_cast<double>(state.steps_per_epoch)},
                  {"global_step", global_step},
                  {"tokens_per_s", window_tokens / std::max(1e-9, window_seconds)},
                  {"step_s", window_seconds},  // the window's step seconds (one step with logging_steps 1)
                  {"memory_mib", peak_rss_mib()},
                  {"peak_memory_bytes", window_peak_bytes},
                  {"elapsed_time", format_duration(elapsed())},
                  {"remaining_time", format_duration(remaining)}};
      for (const auto& [name, sum] : window_metrics) record[name] = sum.first / static_cast<double>(sum.second);
      if (world > 1 || !window_sums.empty()) {
        // Over the logged window: each rank's forward+backward seconds (its busy time before the gradient
        // reduction) and the task's summed values (the scheduler's modelled step time of the same plans).
        record["rank_compute_s"] = window_rank_compute;
        for (const auto& [name, sum] : window_sums) record[name] = sum;
      }
      if (r.skipped) record.erase("grad_norm");  // NaN/Inf has no JSON form
      if (window_trained == 0) {  // every step of the window was skipped: no loss to report
        record.erase("loss");
        for (const auto& [name, sum] : window_metrics) record.erase(name);
      }
      if (window_skipped > 0) record["skipped_steps"] = window_skipped;
      append_log(record);
      window_skipped = window_trained = 0;
      window_loss = window_tokens = window_seconds = 0;
      window_metrics.clear();
      for (auto& [name, sum] : window_sums) sum = 0;
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
    if ((global_step % config.save_steps == 0 && boundary) || last_step || stopping) {
      last_saved = save_checkpoint(run_dir, trainer, state, args_json, *task);
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

  // The loss curve of the whole run (records before a resume included), with the objective's plotted values.
  std::vector<Series> series = {{"train loss", {}, {}, ""}, {"validation loss", {}, {}, ""}};
  std::vector<std::string> keys = {"loss", "eval_loss"};
  for (const std::string& name : task->plotted_metrics()) {
    series.push_back({"train " + name, {}, {}, ""});
    keys.push_back(name);
    series.push_back({"validation " + name, {}, {}, ""});
    keys.push_back("eval_" + name);
  }
  for (const auto& record : history) {
    for (size_t i = 0; i < keys.size(); ++i) {
      // NaN/Inf (written to the log as null) has no place on the curve.
      const auto it = record.find(keys[i]);
      if (it == record.end() || !it->is_number() || !std::isfinite(it->get<double>())) continue;
      series[i].x.push_back(record["global_step"].get<double>());
      series[i].y.push_back(it->get<double>());
    }
  }
  if (writer) {
    std::vector<Series> drawn;
    for (auto& s : series) if (!s.x.empty()) drawn.push_back(std::move(s));
    ChartOptions chart;
    chart.title = fmt::format("{} {} {} on {}", kind, config.train_type, trainer.model()->config().model_type,
                              fs::path(config.model).filename().string());
    chart.x_label = "step";
    chart.y_label = task->plotted_metrics().empty() ? "loss" : "loss, " + fmt::format("{}", fmt::join(task->plotted_metrics(), ", "));
    std::error_code ec;
    fs::create_directories(run_dir / "images", ec);
    write_file_atomic(run_dir / "images" / "train_loss.svg", line_chart_svg(drawn, chart));
  }
  out << fmt::format("done: {} steps in {}, last checkpoint {}\n", state.global_step, format_duration(elapsed()),
                     result.last_checkpoint.string());
  return result;
}

}  // namespace swiftcpp
