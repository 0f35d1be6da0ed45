// Multi-process training on loopback (c10d Gloo): 2 processes equal 1 process with gradient accumulation over the
// same global batch (padding, packing, ChunkFlow, ZeRO-1), torchrun's environment works as the built-in
// launcher does, checkpoints resume under another world size, and a worker that dies or hangs stops the job with
// a clear error while the last checkpoint stays intact.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <fstream>

#include "distributed/skrull.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;

// 32 Alpaca rows on stories260K, no dropout (random masks differ with the world size), 4 optimizer steps of a
// global batch of 4 samples; `world` processes each take per_device 2 x accumulation (2 / world).
std::string dist_args(const fs::path& out, int world, const std::string& extra = "") {
  return fmt::format(
      "--threads 1 train model={} dataset={}#32 output_dir={} template=default max_length=96 truncation_strategy=right "
      "per_device_train_batch_size=2 gradient_accumulation_steps={} max_steps=4 save_steps=2 logging_steps=1 "
      "eval_steps=100 lora_rank=4 lora_alpha=8 lora_dropout=0 learning_rate=3e-3 warmup_steps=1 seed=7 "
      "ddp_timeout=30 {}",
      test::stories_dir().string(), (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string(),
      out.string(), 2 / world, extra);
}

// The same command through the built-in launcher with n workers (a train option, so after "train").
std::string launched(const std::string& args, int n) {
  const size_t at = args.find(" train ");
  return args.substr(0, at) + fmt::format(" train --nproc-per-node {} ", n) + args.substr(at + 7);
}

fs::path run_dir_of(const fs::path& out) {
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.is_directory() && e.path().filename().string().rfind("v", 0) == 0) return e.path();
  }
  return {};
}

std::vector<double> losses_of(const fs::path& run) {
  std::vector<double> out;
  std::ifstream in(run / "logging.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// Largest relative difference ||a - b|| / ||a|| over the two checkpoints' adapter tensors. Per tensor, not per
// element: AdamW divides by sqrt(v), so an entry whose gradient is near zero turns the rounding of another
// summation order (packed instead of padded rows, other chunks) into a large relative change of that one entry.
double adapter_difference(const fs::path& a, const fs::path& b) {
  const auto fa = SafetensorsFile::open(a / "adapter_model.safetensors");
  const auto fb = SafetensorsFile::open(b / "adapter_model.safetensors");
  double worst = 0;
  for (const auto& info : fa->tensors()) {
    const at::Tensor x = fa->tensor(info.name).to(at::kDouble), y = fb->tensor(info.name).to(at::kDouble);
    worst = std::max(worst, ((x - y).norm() / (x.norm() + 1e-12)).item<double>());
  }
  return worst;
}

void expect_same_run(const fs::path& one, const fs::path& two, const std::string& what) {
  const auto a = losses_of(run_dir_of(one)), b = losses_of(run_dir_of(two));
  ASSERT_EQ(a.size(), 4u) << what;
  ASSERT_EQ(b.size(), 4u) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << what << " step " << i + 1;
  // Float32 rounding of two summation orders (accumulated vs all-reduced gradients), amplified where AdamW divides
  // small gradients by sqrt(v): measured up to 1.4e-5 at 2 threads per process on a 2-core AMD EPYC, below 1e-5
  // at 1 thread. A wrong reduction (a missing or doubled rank) differs by orders of magnitude more.
  EXPECT_LT(adapter_difference(run_dir_of(one) / "checkpoint-4", run_dir_of(two) / "checkpoint-4"), 5e-5) << what;
}

TEST(DistCli, TwoGlooProcessesTrainLikeOneProcessWithAccumulation) {
  const fs::path base = test::temp_dir("dist_equivalence");
  for (const std::string batching : {"padding", "packing", "chunkflow"}) {
    SCOPED_TRACE(batching);
    const std::string extra = "batching=" + batching + (batching == "chunkflow" ? " chunk_size=32" : "");
    const auto one = run_cli(dist_args(base / (batching + "1"), 1, extra));
    ASSERT_EQ(one.code, 0) << one.out;
    const auto two = run_cli(launched(dist_args(base / (batching + "2"), 2, extra), 2));
    ASSERT_EQ(two.code, 0) << two.out;
    EXPECT_NE(two.out.find("x 2 processes (c10d"), std::string::npos) << two.out;
    expect_same_run(base / (batching + "1"), base / (batching + "2"), batching);
  }
  // ZeRO-1: the same updates; the checkpoint's optimizer state (gathered from both ranks) is the whole state.
  const auto zero = run_cli(launched(dist_args(base / "zero", 2, "zero_stage=1"), 2));
  ASSERT_EQ(zero.code, 0) << zero.out;
  EXPECT_NE(zero.out.find("ZeRO-1"), std::string::npos) << zero.out;
  expect_same_run(base / "padding1", base / "zero", "ZeRO-1");
  // Skrull scheduling (the cost-aware and the published variant): the global batch's samples placed on the ranks
  // by length in packed micro-batches; the update is the same. The run measures and stores its device profile and
  // logs each rank's compute time beside the modelled step time.
  for (const std::string scheduler : {"skrull", "skrull_paper"}) {
    const auto sk = run_cli(launched(dist_args(base / scheduler, 2, "scheduler=" + scheduler), 2));
    ASSERT_EQ(sk.code, 0) << sk.out;
    EXPECT_NE(sk.out.find("scheduler " + scheduler + ": 2 processes"), std::string::npos) << sk.out;
    expect_same_run(base / "padding1", base / scheduler, scheduler);
    const fs::path run = run_dir_of(base / scheduler);
    EXPECT_NO_THROW(skrull::DeviceProfile::load((run / "device_profile.json").string()));
    std::ifstream in(run / "logging.jsonl");
    int records = 0;
    for (std::string line; std::getline(in, line);) {
      const Json j = Json::parse(line);
      if (!j.contains("loss")) continue;
      ++records;
      ASSERT_EQ(j.at("rank_compute_s").size(), 2u) << line;
      EXPECT_GT(j.at("rank_compute_s")[0].get<double>() + j.at("rank_compute_s")[1].get<double>(), 0.0) << line;
      EXPECT_GT(j.at("modelled_step_s").get<double>(), 0.0) << line;
    }
    EXPECT_EQ(records, 4);
  }
  // Context parallelism: one group of 2 processes (no data parallelism), 48 tokens per process and micro-batch,
  // so every sample longer than 48 tokens is sharded over both (K/V all-gathered per layer, their gradients summed
  // back). The same global batch of 4 samples per step: the same losses, gradient norms and weights.
  const auto cpr = run_cli(launched(dist_args(base / "cp", 1, "scheduler=skrull context_parallel_size=2 skrull_budget=48"), 2));
  ASSERT_EQ(cpr.code, 0) << cpr.out;
  EXPECT_NE(cpr.out.find("(1 data-parallel x 2 context-parallel)"), std::string::npos) << cpr.out;
  expect_same_run(base / "padding1", base / "cp", "context parallelism");
  {
    std::ifstream a(run_dir_of(base / "padding1") / "logging.jsonl"), b(run_dir_of(base / "cp") / "logging.jsonl");
    int64_t sharded = 0;
    for (std::string la, lb; std::getline(a, la) && std::getline(b, lb);) {
      const Json ja = Json::parse(la), jb = Json::parse(lb);
      if (!ja.contains("grad_norm")) continue;
      EXPECT_NEAR(ja["grad_norm"].get<double>(), jb["grad_norm"].get<double>(), 1e-5 * ja["grad_norm"].get<double>());
      sharded += jb.at("sharded_samples").get<int64_t>();
    }
    EXPECT_GT(sharded, 0) << "no sample was sharded: the test does not exercise context parallelism";
  }
  const auto oa = SafetensorsFile::open(run_dir_of(base / "padding1") / "checkpoint-4/optimizer.safetensors");
  const auto ob = SafetensorsFile::open(run_dir_of(base / "zero") / "checkpoint-4/optimizer.safetensors");
  ASSERT_EQ(oa->tensors().size(), ob->tensors().size());
  for (const auto& info : oa->tensors()) {
    const at::Tensor x = oa->tensor(info.name), y = ob->tensor(info.name);
    EXPECT_LT((x - y).abs().max().item<double>(), 1e-5 * (x.abs().max().item<double>() + 1e-12)) << info.name;
  }
}

TEST(DistCli, TorchrunEnvironmentAndResumeUnderAnotherWorldSize) {
  const fs::path base = test::temp_dir("dist_env");
  // Workers started by hand with torchrun's variables, as torchrun --no-python or srun would.
  const int port = test::free_port();
  const std::string env = fmt::format("WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={}", port);
  const std::string cmd = fmt::format(
      "bash -c '{e} RANK=0 LOCAL_RANK=0 {b} {a} >{o}/r0.txt 2>&1 & p0=$!; {e} RANK=1 LOCAL_RANK=1 {b} {a} >{o}/r1.txt 2>&1; "
      "c1=$?; wait $p0; c0=$?; exit $((c0 + c1))'",
      fmt::arg("e", env), fmt::arg("b", SWIFTCPP_BINARY), fmt::arg("a", dist_args(base / "env", 2)),
      fmt::arg("o", base.string()));
  fs::create_directories(base);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text_file(base / "r0.txt") << read_text_file(base / "r1.txt");
  // Rank 0 alone prints the checkpoint on stdout.
  EXPECT_NE(read_text_file(base / "r0.txt").find("checkpoint-4"), std::string::npos);
  const fs::path run = run_dir_of(base / "env");
  const auto straight = losses_of(run);
  ASSERT_EQ(straight.size(), 4u);
  const Json state = load_json_file(run / "checkpoint-2/trainer_state.json");
  EXPECT_EQ(state["world_size"], 2);
  // The 2-process checkpoint at step 2 resumed by one process with the same global batch (accumulation 2), and a
  // 1-process checkpoint resumed by two processes: both continue as the uninterrupted run.
  const auto single = run_cli(dist_args(base / "env", 1, fmt::format("resume_from_checkpoint={}", (run / "checkpoint-2").string())));
  ASSERT_EQ(single.code, 0) << single.out;
  EXPECT_NE(single.out.find("resuming from"), std::string::npos) << single.out;
  const auto resumed = losses_of(run);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(resumed[i], straight[i], 1e-5 * straight[i]) << "step " << i + 1;
  const auto one = run_cli(dist_args(base / "one", 1));
  ASSERT_EQ(one.code, 0) << one.out;
  const fs::path one_run = run_dir_of(base / "one");
  const auto two = run_cli(launched(dist_args(base / "one", 2, fmt::format("resume_from_checkpoint={}",
                                                                                    (one_run / "checkpoint-2").string())), 2));
  ASSERT_EQ(two.code, 0) << two.out;
  const auto after = losses_of(one_run);
  ASSERT_EQ(after.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(after[i], straight[i], 1e-5 * straight[i]) << "step " << i + 1;
}

// A worker killed (or stopped) mid-run: the other fails with a clear error within the timeout, the launcher exits
// non-zero, and the last checkpoint is complete.
TEST(DistCli, ADeadOrHungWorkerStopsTheJobAndKeepsTheLastCheckpoint) {
  const fs::path base = test::temp_dir("dist_faults");
  for (const std::string signal : {"KILL", "STOP"}) {
    SCOPED_TRACE(signal);
    const fs::path out = base / signal;
    fs::create_directories(out);
    const std::string args = launched(dist_args(out, 2, "max_steps=100000 save_steps=2 ddp_timeout=5"), 2);
    // Wait for checkpoint-2, then signal the second worker (a child of the launcher).
    const std::string cmd = fmt::format(
        "bash -c '{b} {a} >{o}/log.txt 2>&1 & pid=$!; "
        "for i in $(seq 1 3000); do ls -d {o}/v*/checkpoint-2 >/dev/null 2>&1 && break; sleep 0.01; done; "
        "w=$(pgrep -P $pid | tail -1); kill -{s} $w; start=$(date +%s); wait $pid; code=$?; "
        "echo $(( $(date +%s) - start )) > {o}/seconds.txt; exit $code'",
        fmt::arg("b", SWIFTCPP_BINARY), fmt::arg("a", args), fmt::arg("o", out.string()), fmt::arg("s", signal));
    const int status = std::system(cmd.c_str());
    const std::string log = read_text_file(out / "log.txt");
    EXPECT_NE(WEXITSTATUS(status), 0) << log;
    EXPECT_LE(std::stoi(read_text_file(out / "seconds.txt")), 30) << log;
    EXPECT_NE(log.find("exited with"), std::string::npos) << log;
    if (signal == "STOP") {
      EXPECT_NE(log.find("failed (another process died, hung"), std::string::npos) << log;
    }
    // checkpoint-2 (or a later one) is whole: its adapter and state load.
    const fs::path run = run_dir_of(out);
    ASSERT_TRUE(fs::exists(run / "checkpoint-2/trainer_state.json")) << log;
    EXPECT_NO_THROW(SafetensorsFile::open(run / "checkpoint-2/adapter_model.safetensors"));
    for (const auto& e : fs::directory_iterator(run)) {
      if (e.path().filename().string().rfind("checkpoint-", 0) == 0) {
        EXPECT_TRUE(fs::exists(e.path() / "trainer_state.json")) << e.path();
      }
    }
  }
}

}  // namespace
}  // namespace swiftcpp
