// The trainer's parts: recipes and their errors, learning-rate schedules, AdamW details, gradient clipping,
// frozen base weights, gradient checkpointing, bf16 autocast, full fine-tuning, DoRA and dropout.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <thread>

#include "core/signals.h"
#include "io/safetensors.h"
#include "nn/attention.h"
#include "nn/kernels.h"
#include "peft/lora.h"
#include "tests/test_util.h"
#include "train/config.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace swiftcpp {
namespace {

using test::source_dir;
using test::stories_dir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

fs::path write_recipe(const std::string& name, const std::string& text) {
  const fs::path file = test::temp_dir("recipes") / name;
  std::ofstream(file) << text;
  return file;
}

TEST(Recipes, EveryShippedRecipeLoads) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(source_dir() / "recipes")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    const TrainConfig c = load_train_config(entry.path().string(), {});
    EXPECT_FALSE(c.dataset.empty());
    ++count;
    // demo/ is built by a script (llava_demo.yaml: scripts/make_mm_demo.py), so it may be absent; the rest ships.
    if (c.model.rfind("demo/", 0) == 0) {
      EXPECT_TRUE(fs::exists(source_dir() / "scripts/make_mm_demo.py"));
      continue;
    }
    EXPECT_TRUE(fs::exists(source_dir() / c.model)) << c.model;
    for (const auto& d : c.dataset) EXPECT_TRUE(fs::exists(source_dir() / d)) << d;
  }
  EXPECT_GE(count, 3);  // quickstart, lora_sft, full_sft
}

TEST(Recipes, UnknownKeyNamesFileLineAndTheClosestKey) {
  const fs::path r = write_recipe("typo.yaml", "model: m\ndataset: d.jsonl\nlerning_rate: 1e-4\n");
  const std::string msg = error_of([&] { load_train_config(r.string(), {}); });
  EXPECT_NE(msg.find("typo.yaml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("learning_rate"), std::string::npos) << msg;
}

TEST(Recipes, WrongTypesRangesChoicesAndCombinationsAreRefused) {
  const fs::path r = write_recipe("ok.yaml", "model: m\ndataset: d.jsonl\n");
  EXPECT_NE(error_of([&] { load_train_config(r.string(), {"lora_rank=big"}); }).find("lora_rank=big"), std::string::npos);
  EXPECT_NE(error_of([&] { load_train_config(r.string(), {"lora_rank=0"}); }).find("must be in"), std::string::npos);
  const std::string choice = error_of([&] { load_train_config(r.string(), {"lr_scheduler_type=step"}); });
  EXPECT_NE(choice.find("cosine, linear, constant"), std::string::npos) << choice;
  EXPECT_NE(error_of([&] { load_train_config(r.string(), {"train_type=full", "use_dora=true"}); }).find("use_dora"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_train_config("", {"model=m"}); }).find("dataset"), std::string::npos);
  // Overrides apply after the recipe, in order.
  const TrainConfig c = load_train_config(r.string(), {"learning_rate=3e-4", "target_modules=[q_proj, v_proj]"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST(Schedule, MatchesHuggingFaceFormulas) {
  // Warm-up: step / warmup; the first update uses 0 as transformers' LambdaLR does.
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine", 1.0, 0, 4, 20), 0.0);
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine", 1.0, 2, 4, 20), 0.5);
  // Cosine: 0.5 * (1 + cos(pi * progress)), progress = (step - warmup) / (total - warmup).
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine", 2.0, 4, 4, 20), 2.0);
  EXPECT_NEAR(scheduled_lr("cosine", 2.0, 12, 4, 20), 1.0, 1e-12);
  EXPECT_NEAR(scheduled_lr("cosine", 2.0, 20, 4, 20), 0.0, 1e-12);
  // Linear: (total - step) / (total - warmup).
  EXPECT_DOUBLE_EQ(scheduled_lr("linear", 1.0, 8, 4, 20), 0.75);
  EXPECT_DOUBLE_EQ(scheduled_lr("constant", 1.0, 8, 4, 20), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr("constant", 1.0, 1, 4, 20), 0.25);
}

TEST(AdamW, DecoupledDecaySkipsNoDecayTensorsAndMatchesTorchArithmetic) {
  at::Tensor w = at::full({3}, 2.0).requires_grad_(true);
  at::Tensor b = at::full({3}, 2.0).requires_grad_(true);
  AdamW opt({{"w", w, true}, {"b", b, false}}, {0.1, 0.9, 0.999, 1e-8, 0.5});
  w.mutable_grad() = at::full({3}, 0.5);
  b.mutable_grad() = at::full({3}, 0.5);
  opt.step(0.1);
  // torch: p *= 1 - lr*wd; m = 0.1 g; v = 0.001 g^2; p -= lr/(1-0.9) * m / (sqrt(v)/sqrt(1-0.999) + eps)
  const double m = 0.05, v = 0.001 * 0.25;
  const double update = 0.1 / 0.1 * m / (std::sqrt(v) / std::sqrt(0.001) + 1e-8);
  EXPECT_NEAR(w[0].item<double>(), 2.0 * (1 - 0.05) - update, 1e-6);
  EXPECT_NEAR(b[0].item<double>(), 2.0 - update, 1e-6);
  EXPECT_EQ(opt.steps(), 1);
}

TEST(AdamW, ClipGradNormScalesToTheLimitAndReportsTheNormBefore) {
  at::Tensor a = at::zeros({2}).requires_grad_(true);
  at::Tensor b = at::zeros({1}).requires_grad_(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  const std::vector<TrainableTensor> params = {{"a", a, true}, {"b", b, true}};
  EXPECT_NEAR(clip_grad_norm(params, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-6);
  EXPECT_NEAR(clip_grad_norm(params, 0.0), 1.0, 1e-6);  // 0: report only
}

// A fixed batch of two real-looking samples of different lengths (padding on the second).
Batch toy_batch() {
  Sample a, b;
  for (int i = 0; i < 24; ++i) a.input_ids.push_back(1 + (i * 37) % 500);
  for (int i = 0; i < 15; ++i) b.input_ids.push_back(1 + (i * 91 + 7) % 500);
  for (Sample* s : {&a, &b}) {
    for (size_t t = 0; t + 1 < s->input_ids.size(); ++t) s->labels.push_back(t < 3 ? kIgnoreIndex : s->input_ids[t + 1]);
    s->labels.push_back(kIgnoreIndex);
  }
  return collate_padded({&a, &b}, 0);
}

TrainConfig toy_config(const std::string& type) {
  TrainConfig c;
  c.model = stories_dir().string();
  c.dataset = {"unused"};
  c.train_type = type;
  c.lora_dropout = 0.0;
  c.learning_rate = 1e-2;
  c.lr_scheduler_type = "constant";
  return c;
}

std::vector<at::Tensor> grads_of(const Trainer& t) {
  std::vector<at::Tensor> g;
  for (const auto& p : t.trainables()) g.push_back(p.tensor.grad().clone());
  return g;
}

TEST(Trainer, LoraNeverModifiesBaseWeights) {
  const Checkpoint file = Checkpoint::open(stories_dir());
  Trainer trainer(toy_config("lora"), load_causal_lm(stories_dir()));
  const Batch batch = toy_batch();
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    const StepResult r = trainer.step({batch}, i, 5);
    if (i == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, first);
  for (const auto& item : trainer.model()->named_parameters(true)) {
    // Exact: untouched base weights are the file's bytes.
    EXPECT_TRUE(at::equal(item.value(), file.tensor(item.key()))) << item.key();
    EXPECT_FALSE(item.value().requires_grad()) << item.key();
  }
}

TEST(Trainer, GradientCheckpointingGivesTheSameLossAndGradients) {
  const Batch batch = toy_batch();
  TrainConfig c = toy_config("lora");
  c.lora_dropout = 0.1;  // the recomputation must replay the same dropout masks
  at::manual_seed(5);
  Trainer plain(c, load_causal_lm(stories_dir()));
  const StepResult a = plain.step({batch}, 0, 2);
  c.gradient_checkpointing = true;
  at::manual_seed(5);
  Trainer checkpointed(c, load_causal_lm(stories_dir()));
  const StepResult b = checkpointed.step({batch}, 0, 2);
  // The checkpointed forward runs without autograd (another attention kernel): the same value up to float32
  // rounding, which at 2 threads differs in the last bits (exact at 1 thread).
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * a.grad_norm);
  const auto ga = grads_of(plain), gb = grads_of(checkpointed);
  ASSERT_EQ(ga.size(), gb.size());
  // The first pass of a checkpointed layer runs without autograd (the math attention kernel), its recomputation
  // with it (the recomputing kernel): the two agree to float32 rounding, so elements are compared to 1e-5 of the
  // tensor's largest. A dropout mask that did not replay would differ by far more.
  for (size_t i = 0; i < ga.size(); ++i) {
    EXPECT_TRUE(at::allclose(ga[i], gb[i], 1e-5, 1e-5 * ga[i].abs().max().item<double>())) << i << ": max diff " << (ga[i] - gb[i]).abs().max().item<double>()
                                                       << " of " << ga[i].abs().max().item<double>();
  }
}

// A SIGTERM flood during LoRA training steps, whose products run in oneDNN's JIT GEMM (it points the stack pointer
// into a heap buffer while it runs): the stop callback runs on the signal thread, never on the computing one, and
// the heap survives. With a handler installed by std::signal, as train and bench had, the same flood corrupted the
// heap within a second ("corrupted size vs. prev_size" / "double free or corruption", SIGABRT or SIGSEGV); it was
// seen as TrainCli's SIGTERM test exiting 134 about one run in ten. In a child process (gtest's threadsafe death
// test runs the binary again), so that the mask is set before any thread starts.
[[noreturn]] void train_under_a_signal_flood() {
  block_stop_signals();
  std::atomic<int> seen{0};
  std::atomic<bool> on_computing_thread{false};
  const std::thread::id computing = std::this_thread::get_id();
  int steps = 0;
  {
    const StopSignals signals([&](int signal) {
      if (std::this_thread::get_id() == computing) on_computing_thread = true;
      if (signal == SIGTERM) ++seen;
      return true;
    });
    std::atomic<bool> done{false};
    std::thread sender([&] {
      while (!done) {
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    Trainer trainer(toy_config("lora"), load_causal_lm(stories_dir()));
    const Batch batch = toy_batch();
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < end) {
      trainer.step({batch}, steps, 1000);
      ++steps;
    }
    done = true;
    sender.join();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (seen == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  _exit(steps > 0 && seen > 0 && !on_computing_thread ? 0 : 1);
}

TEST(Trainer, ASignalFloodDuringStepsNeverRunsOnTheComputingThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(train_under_a_signal_flood(), ::testing::ExitedWithCode(0), "");
}

TEST(Trainer, PaddedBatchTrainsAsOnePackedRowWithThePaddedLossAndGradients) {
  // The trainer runs a padded batch as one packed row of its real tokens, through the fast GEMM, the chunked head
  // loss and the attention that skips masked keys; the reference is the padded batch through plain LibTorch
  // (at::mm, the math attention, logits over every position).
  const Batch batch = toy_batch();
  ASSERT_FALSE(batch.key_valid.all().item<bool>());
  TrainConfig c = toy_config("full");
  c.max_grad_norm = 0;
  Trainer trainer(c, load_causal_lm(stories_dir()));
  const StepResult r = trainer.step({batch}, 0, 1);

  kernels::set_fast_gemm(false);
  nn::set_recompute_attention(false);
  CausalLM model = load_causal_lm(stories_dir());
  model->train();
  for (auto& p : model->parameters()) p.requires_grad_(true);
  ForwardOptions o;
  o.key_valid = batch.key_valid;
  if (batch.position_ids.defined()) o.position_ids = batch.position_ids;
  const at::Tensor logits = model->forward(batch.input_ids, o);  // [B, T, V]
  const at::Tensor loss =
      at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), batch.labels.reshape({-1}), {},
                             at::Reduction::Sum, kIgnoreIndex) /
      static_cast<double>(batch.label_tokens);
  loss.backward();
  kernels::set_fast_gemm(true);
  nn::set_recompute_attention(true);

  EXPECT_NEAR(r.loss, loss.item<double>(), 1e-5 * loss.item<double>());
  std::map<std::string, at::Tensor> want;
  for (const auto& item : model->named_parameters(true)) want[item.key()] = item.value().grad();
  int compared = 0;
  for (const auto& p : trainer.trainables()) {
    const auto it = want.find(p.name);
    if (it == want.end() || !it->second.defined()) continue;
    const at::Tensor got = p.tensor.grad(), ref = it->second;
    const double scale = ref.abs().max().item<double>();
    EXPECT_LT((got - ref).abs().max().item<double>(), 1e-4 * scale + 1e-9) << p.name;
    ++compared;
  }
  EXPECT_GT(compared, 10);
}

TEST(Trainer, Bf16AutocastTrainsCloseToFloat32) {
  const Batch batch = toy_batch();
  Trainer f32(toy_config("lora"), load_causal_lm(stories_dir()));
  TrainConfig c = toy_config("lora");
  c.bf16 = true;
  Trainer bf16(c, load_causal_lm(stories_dir()));
  const StepResult a = f32.step({batch}, 0, 1), b = bf16.step({batch}, 0, 1);
  EXPECT_NE(a.loss, b.loss);  // autocast really ran in bf16
  EXPECT_NEAR(a.loss, b.loss, 2e-2 * a.loss);
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 0.1 * a.grad_norm);
  for (const auto& p : bf16.trainables()) EXPECT_EQ(p.tensor.scalar_type(), at::kFloat);  // master weights
}

TEST(Trainer, FullFineTuningTrainsEverythingAndSkipsDecayOnNorms) {
  const Batch batch = toy_batch();
  TrainConfig c = toy_config("full");
  c.learning_rate = 1e-3;
  Trainer trainer(c, load_causal_lm(stories_dir()));
  int64_t norms = 0;
  for (const auto& p : trainer.trainables()) {
    if (p.name.find("norm") != std::string::npos) {
      EXPECT_FALSE(p.decay) << p.name;
      ++norms;
    } else {
      EXPECT_TRUE(p.decay) << p.name;
    }
  }
  EXPECT_EQ(norms, 2 * 5 + 1);
  const at::Tensor before = trainer.model()->model->norm->weight.clone();
  const double first = trainer.step({batch}, 0, 3).loss;
  trainer.step({batch}, 1, 3);
  EXPECT_LT(trainer.step({batch}, 2, 3).loss, first);
  EXPECT_FALSE(at::equal(before, trainer.model()->model->norm->weight));
}

TEST(Trainer, GlobalBatchLossNormalisesByAllLabelTokens) {
  // Two micro-batches of different label counts: the step's loss and gradients equal one batch holding both.
  Sample a, b;
  for (int i = 0; i < 30; ++i) a.input_ids.push_back(5 + i * 11 % 400);
  for (int i = 0; i < 6; ++i) b.input_ids.push_back(9 + i * 29 % 400);
  for (Sample* s : {&a, &b}) {
    for (size_t t = 0; t + 1 < s->input_ids.size(); ++t) s->labels.push_back(s->input_ids[t + 1]);
    s->labels.push_back(kIgnoreIndex);
  }
  Trainer split(toy_config("lora"), load_causal_lm(stories_dir()));
  Trainer joined(toy_config("lora"), load_causal_lm(stories_dir()));
  const StepResult r1 = split.step({collate_padded({&a}, 0), collate_padded({&b}, 0)}, 0, 1);
  const StepResult r2 = joined.step({collate_padded({&a, &b}, 0)}, 0, 1);
  EXPECT_EQ(r1.label_tokens, 34);
  EXPECT_NEAR(r1.loss, r2.loss, 1e-6 * r2.loss);
  EXPECT_NEAR(r1.grad_norm, r2.grad_norm, 1e-5 * r2.grad_norm);
}

TEST(Trainer, DoraAndRsloraTrainTheirTensors) {
  TrainConfig c = toy_config("lora");
  c.use_dora = true;
  c.use_rslora = true;
  c.lora_rank = 4;
  c.lora_alpha = 8;
  Trainer trainer(c, load_causal_lm(stories_dir()));
  EXPECT_DOUBLE_EQ(trainer.lora_config().scale(), 8.0 / 2.0);
  std::vector<at::Tensor> magnitudes;
  for (const auto& p : trainer.trainables()) {
    if (p.name.find("lora_magnitude_vector") != std::string::npos) magnitudes.push_back(p.tensor.clone());
  }
  ASSERT_EQ(magnitudes.size(), 35u);  // 7 projections x 5 layers
  const Batch batch = toy_batch();
  trainer.step({batch}, 0, 2);
  trainer.step({batch}, 1, 2);
  size_t i = 0, changed = 0;
  for (const auto& p : trainer.trainables()) {
    if (p.name.find("lora_magnitude_vector") != std::string::npos) changed += !at::equal(p.tensor, magnitudes[i++]);
  }
  EXPECT_EQ(changed, magnitudes.size());
}

TEST(Trainer, ModulesToSaveTrainACopyAndTargetErrorsListTheLayers) {
  TrainConfig c = toy_config("lora");
  c.modules_to_save = {"embed_tokens"};
  Trainer trainer(c, load_causal_lm(stories_dir()));
  bool found = false;
  for (const auto& p : trainer.trainables()) found |= p.name == "base_model.model.model.embed_tokens.weight";
  EXPECT_TRUE(found);
  trainer.step({toy_batch()}, 0, 1);
  const Checkpoint file = Checkpoint::open(stories_dir());
  EXPECT_FALSE(at::equal(trainer.model()->model->embed_tokens->weight, file.tensor("model.embed_tokens.weight")));
  EXPECT_TRUE(at::equal(file.tensor("model.embed_tokens.weight"),
                        Checkpoint::open(stories_dir()).tensor("model.embed_tokens.weight")));  // file untouched

  c.modules_to_save.clear();
  c.target_modules = {"q_porj"};
  const std::string msg = error_of([&] { Trainer t(c, load_causal_lm(stories_dir())); });
  EXPECT_NE(msg.find("q_porj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("q_proj"), std::string::npos) << msg;
}

}  // namespace
}  // namespace swiftcpp
