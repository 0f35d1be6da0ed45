// `swiftcpp rlhf` end to end on stories260K and LLaMA-Factory's dpo_en_demo pairs: the run folder with TRL's metric
// names, exact resume after SIGTERM, every method (kto, orpo, cpo, simpo, rm with its SEQ_CLS head), full
// fine-tuning with a reference copy, precomputed reference log-probabilities, two processes equal to one with
// gradient accumulation, and keys that do not fit the method refused by name.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <map>

#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;
using test::source_dir;
using test::stories_dir;

std::string data_file() { return (source_dir() / "tests/data/preference/dpo_en_demo.json").string(); }

// 24 pairs (4 held out), prompts cut to 32 tokens and answers to 96, per-device batches of 2 pairs (4 rows).
std::string rlhf_args(const fs::path& out, const std::string& extra = "", int rows = 24) {
  return fmt::format(
      "--threads 1 rlhf model={} dataset={}#{} output_dir={} template=default max_length=128 max_prompt_length=32 "
      "truncation_strategy=left per_device_train_batch_size=2 per_device_eval_batch_size=2 gradient_accumulation_steps=1 "
      "max_steps=6 save_steps=3 logging_steps=1 eval_steps=3 split_dataset_ratio=0.2 lora_rank=4 lora_alpha=8 "
      "lora_dropout=0.1 learning_rate=3e-3 warmup_steps=1 seed=7 save_total_limit=2 {}",
      stories_dir().string(), data_file(), rows, out.string(), extra);
}

fs::path only_run_dir(const fs::path& out) {
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.is_directory() && e.path().filename().string().rfind("v", 0) == 0) runs.push_back(e.path());
  }
  EXPECT_EQ(runs.size(), 1u);
  return runs.empty() ? fs::path() : runs[0];
}

std::vector<Json> records(const fs::path& run) {
  std::vector<Json> out;
  std::ifstream in(run / "logging.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
  return out;
}

// "step key value" of every training and validation value that a resumed run must repeat exactly.
std::vector<std::string> logged_values(const fs::path& run) {
  std::vector<std::string> out;
  for (const Json& j : records(run)) {
    for (const char* key : {"loss", "rewards/margins", "rewards/accuracies", "eval_loss", "eval_rewards/margins"}) {
      if (j.contains(key)) out.push_back(fmt::format("{} {} {}", j["global_step"].get<int64_t>(), key, j[key].dump()));
    }
  }
  return out;
}

TEST(RlhfCli, DpoWritesTrlMetricsAndResumesExactlyAfterSigterm) {
  const fs::path base = test::temp_dir("rlhf_cli");
  const fs::path straight = base / "straight";
  const auto r = run_cli(rlhf_args(straight));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dpo lora llama"), std::string::npos) << r.out;
  const fs::path run = only_run_dir(straight);
  for (const char* f : {"args.json", "logging.jsonl", "images/train_loss.svg", "checkpoint-6/adapter_model.safetensors",
                        "checkpoint-6/optimizer.safetensors", "checkpoint-6/trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(run / f)) << f;
  }
  const std::vector<Json> log = records(run);
  bool train_seen = false, eval_seen = false;
  for (const Json& j : log) {
    if (j.contains("loss") && !train_seen) {
      train_seen = true;
      for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                              "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected", "grad_norm",
                              "learning_rate", "tokens_per_s"}) {
        EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
      }
      EXPECT_FALSE(j.contains("token_acc")) << j.dump();
      // The first step starts from the base (B = 0): the policy is its reference up to float32 rounding (log-prob
      // sums of ~-400), every reward ~0, the loss log 2.
      if (j["global_step"] == 1) {
        EXPECT_NEAR(j["loss"].get<double>(), std::log(2.0), 1e-5);
        EXPECT_NEAR(j["rewards/margins"].get<double>(), 0.0, 1e-4);
      }
    }
    if (j.contains("eval_loss") && !eval_seen) {
      eval_seen = true;
      for (const char* key : {"eval_rewards/chosen", "eval_rewards/accuracies", "eval_rewards/margins",
                              "eval_logps/chosen", "eval_logits/rejected"}) {
        EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
      }
    }
  }
  EXPECT_TRUE(train_seen && eval_seen);
  const std::string svg = read_text_file(run / "images/train_loss.svg");
  EXPECT_NE(svg.find("rewards/margins"), std::string::npos);
  const Json args = load_json_file(run / "args.json");
  EXPECT_EQ(args["rlhf_type"], "dpo");
  EXPECT_EQ(args["loss_scale"], "last_round");
  EXPECT_FALSE(args.contains("tuner_type"));

  // Stopped by SIGTERM after checkpoint-3, then resumed: the same values as the uninterrupted run.
  const fs::path out = base / "term";
  EXPECT_EQ(test::run_cli_until_checkpoint(rlhf_args(out), out, "checkpoint-3", "TERM"), 143);
  ASSERT_FALSE(fs::exists(only_run_dir(out) / "checkpoint-6")) << "the run finished before the signal";
  const auto resumed = run_cli(rlhf_args(out, "resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
  EXPECT_EQ(logged_values(only_run_dir(out)), logged_values(run));
}

TEST(RlhfCli, EveryMethodTrainsAndTheRewardModelSavesItsHead) {
  const fs::path base = test::temp_dir("rlhf_methods");
  for (const std::string method : {"kto", "orpo", "cpo", "simpo", "rm"}) {
    SCOPED_TRACE(method);
    const fs::path out = base / method;
    const auto r = run_cli(rlhf_args(out, "rlhf_type=" + method + " max_steps=2 save_steps=2 eval_steps=2"));
    ASSERT_EQ(r.code, 0) << r.out;
    const fs::path run = only_run_dir(out);
    const std::vector<Json> log = records(run);
    bool trained = false;
    for (const Json& j : log) {
      if (!j.contains("loss")) continue;
      trained = true;
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
      // KTO logs the rewards of the sides a micro-batch has (margins only when it has both), and no accuracies.
      if (method == "kto") {
        EXPECT_TRUE(j.contains("kl") && (j.contains("rewards/chosen") || j.contains("rewards/rejected"))) << j.dump();
        EXPECT_FALSE(j.contains("rewards/accuracies")) << j.dump();
      } else {
        EXPECT_TRUE(j.contains("rewards/margins") && j.contains("rewards/accuracies")) << j.dump();
      }
      if (method == "orpo") {
        EXPECT_TRUE(j.contains("log_odds_ratio")) << j.dump();
      }
      if (method == "orpo" || method == "cpo" || method == "simpo") {
        EXPECT_TRUE(j.contains("nll_loss")) << j.dump();
      }
    }
    EXPECT_TRUE(trained);
    if (method == "rm") {
      const Json config = load_json_file(run / "checkpoint-2/adapter_config.json");
      EXPECT_EQ(config["task_type"], "SEQ_CLS");
      EXPECT_EQ(config["modules_to_save"], Json::array({"score"}));
      const auto file = SafetensorsFile::open(run / "checkpoint-2/adapter_model.safetensors");
      bool head = false;
      for (const auto& t : file->tensors()) {
        if (t.name == "base_model.model.score.weight") {
          head = true;
          EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 64}));
        }
      }
      EXPECT_TRUE(head);
    }
  }
  // QLoRA (an int8 base) with DoRA adapters: the reference is the packed base with the adapters switched off.
  const auto q = run_cli(rlhf_args(base / "qdora", "use_dora=true quant_bits=8 quant_group_size=-1 max_steps=2 "
                                                   "save_steps=2 eval_steps=2"));
  ASSERT_EQ(q.code, 0) << q.out;
  for (const Json& j : records(only_run_dir(base / "qdora"))) {
    if (j.contains("loss")) {
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << j.dump();
    }
  }
}

// Full fine-tuning keeps a frozen reference copy; precompute_ref_log_probs computes the same reference once, so
// the first steps' values agree (the reference rows are batched differently: float32 rounding only).
TEST(RlhfCli, FullFineTuningWithAReferenceCopyOrPrecomputedReference) {
  const fs::path base = test::temp_dir("rlhf_full");
  const std::string full = "train_type=full learning_rate=1e-4 max_steps=2 save_steps=2 eval_steps=2 lora_dropout=0";
  const auto copy = run_cli(rlhf_args(base / "copy", full));
  ASSERT_EQ(copy.code, 0) << copy.out;
  const auto pre = run_cli(rlhf_args(base / "pre", full + " precompute_ref_log_probs=true"));
  ASSERT_EQ(pre.code, 0) << pre.out;
  EXPECT_NE(pre.out.find("reference log-probabilities"), std::string::npos) << pre.out;
  const auto a = records(only_run_dir(base / "copy")), b = records(only_run_dir(base / "pre"));
  ASSERT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"loss", "rewards/margins", "eval_loss", "eval_rewards/chosen"}) {
      if (!a[i].contains(key)) continue;
      ASSERT_TRUE(b[i].contains(key)) << key;
      EXPECT_NEAR(a[i][key].get<double>(), b[i][key].get<double>(), 1e-4 + 1e-4 * std::abs(a[i][key].get<double>()))
          << key << " at record " << i;
      ++compared;
    }
  }
  EXPECT_GE(compared, 4);
  EXPECT_TRUE(fs::exists(only_run_dir(base / "copy") / "checkpoint-2/model.safetensors"));

  // A fully trained reward model is saved as a sequence-classification checkpoint.
  const auto rm = run_cli(rlhf_args(base / "rm", "rlhf_type=rm train_type=full learning_rate=1e-4 max_steps=2 "
                                                 "save_steps=2 eval_steps=2"));
  ASSERT_EQ(rm.code, 0) << rm.out;
  const fs::path checkpoint = only_run_dir(base / "rm") / "checkpoint-2";
  const Json config = load_json_file(checkpoint / "config.json");
  EXPECT_EQ(config["architectures"], Json::array({"LlamaForSequenceClassification"}));
  EXPECT_EQ(config["id2label"].size(), 1u);
  EXPECT_TRUE(config.contains("pad_token_id"));
  bool head = false;
  for (const auto& t : SafetensorsFile::open(checkpoint / "model.safetensors")->tensors()) head |= t.name == "score.weight";
  EXPECT_TRUE(head);
}

// Two processes with per-device batches of 2 pairs equal one process accumulating two such micro-batches.
TEST(RlhfCli, TwoProcessesEqualOneWithAccumulation) {
  const fs::path base = test::temp_dir("rlhf_dist");
  const std::string common = "max_steps=3 save_steps=3 eval_steps=100 lora_dropout=0 ddp_timeout=30";
  const auto one = run_cli(rlhf_args(base / "one", common + " gradient_accumulation_steps=2"));
  ASSERT_EQ(one.code, 0) << one.out;
  std::string args = rlhf_args(base / "two", common);
  args.replace(args.find(" rlhf "), 6, " rlhf --nproc-per-node 2 ");
  const auto two = run_cli(args);
  ASSERT_EQ(two.code, 0) << two.out;
  const auto a = records(only_run_dir(base / "one")), b = records(only_run_dir(base / "two"));
  std::vector<double> la, lb;
  for (const Json& j : a) if (j.contains("loss")) la.push_back(j["loss"].get<double>());
  for (const Json& j : b) if (j.contains("loss")) lb.push_back(j["loss"].get<double>());
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 + 1e-5 * std::abs(la[i])) << "step " << i + 1;
}

TEST(RlhfCli, KeysThatDoNotFitTheMethodAreRefusedByName) {
  const fs::path base = test::temp_dir("rlhf_bad");
  struct Case {
    std::string args, expected;
  };
  const std::vector<Case> cases = {
      {rlhf_args(base / "a", "ref_model=" + stories_dir().string()), "'ref_model' with train_type lora"},
      {rlhf_args(base / "b", "simpo_gamma=0.5"), "'simpo_gamma'"},
      {rlhf_args(base / "c", "rlhf_type=kto per_device_train_batch_size=1"), "'per_device_train_batch_size'"},
      {rlhf_args(base / "d", "rlhf_type=orpo precompute_ref_log_probs=true"), "'precompute_ref_log_probs'"},
      {rlhf_args(base / "e", "packing=true"), "'batching' packing"},
      {rlhf_args(base / "f", "loss_scale=default"), "'loss_scale' default"},
      {rlhf_args(base / "g", "rlhf_type=rm beta=0.2"), "'beta'"},
      {rlhf_args(base / "h", "rlhf_type=ppo"), "rlhf_type"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << r.out;
  }
  // train is supervised fine-tuning: preference keys there are a mistake named as such.
  const std::string sft = fmt::format("--threads 1 train model={} dataset={} output_dir={} max_steps=1",
                                      stories_dir().string(), (source_dir() / "tests/data/sft/alpaca_en_demo.json").string(),
                                      (base / "sft").string());
  const auto beta = run_cli(sft + " beta=0.1");
  EXPECT_EQ(beta.code, 2);
  EXPECT_NE(beta.out.find("'beta' is a preference-training key"), std::string::npos) << beta.out;
  const auto type = run_cli(sft + " rlhf_type=dpo");
  EXPECT_EQ(type.code, 2);
  EXPECT_NE(type.out.find("swiftcpp rlhf"), std::string::npos) << type.out;
  // ms-swift 4's tuner_type is train_type.
  const auto alias = run_cli(sft + " tuner_type=full --print-config");
  EXPECT_EQ(alias.code, 0) << alias.out;
  EXPECT_NE(alias.out.find("\"train_type\": \"full\""), std::string::npos) << alias.out;

  // A row without a rejected answer is a bad row naming file:line; nothing is written.
  const fs::path bad = base / "bad.jsonl";
  std::ofstream(bad) << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                        "\"content\": \"hello\"}], \"rejected_response\": \"go away\"}\n"
                     << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                        "\"content\": \"hello\"}]}\n";
  const auto row = run_cli(fmt::format("--threads 1 rlhf model={} dataset={} output_dir={} max_steps=1",
                                       stories_dir().string(), bad.string(), (base / "rows").string()));
  EXPECT_NE(row.code, 0);
  EXPECT_NE(row.out.find(bad.string() + ":2"), std::string::npos) << row.out;
  EXPECT_NE(row.out.find("no rejected answer"), std::string::npos) << row.out;
  EXPECT_FALSE(fs::exists(base / "rows")) << "a refused run writes nothing";
}

// ---------------------------------------------------------------------------------------------------------------
// GRPO: the bundled story-name prompts rewarded by the bundled external command (recipes/grpo.yaml's task), small.

std::string grpo_args(const fs::path& out, const std::string& extra = "") {
  return fmt::format(
      "--threads 1 rlhf rlhf_type=grpo model={} dataset={} output_dir={} template=raw "
      "reward_funcs=\"external:sh {}\" num_generations=4 max_completion_length=20 per_device_train_batch_size=4 "
      "gradient_accumulation_steps=2 max_steps=8 save_steps=2 logging_steps=1 eval_steps=100 lora_rank=4 "
      "lora_alpha=8 lora_dropout=0 learning_rate=5e-3 seed=3 {}",
      stories_dir().string(), (source_dir() / "tests/data/grpo/story_names.jsonl").string(), out.string(),
      (source_dir() / "recipes/rewards/mentions_target.sh").string(), extra);
}

std::vector<std::string> grpo_values(const fs::path& run) {
  std::vector<std::string> out;
  for (const Json& j : records(run)) {
    for (const char* key : {"loss", "reward", "kl", "clip_ratio", "completions/mean_length", "grad_norm"}) {
      if (j.contains(key)) out.push_back(fmt::format("{} {} {}", j["global_step"].get<int64_t>(), key, j[key].dump()));
    }
  }
  return out;
}

// Two iterations per rollout batch, the KL term and completions.jsonl; a SIGTERM right after checkpoint-2 (during
// step 3, between the two steps of a batch) stops at the batch's end, and the resumed run repeats the uninterrupted
// one exactly (rollouts included).
TEST(GrpoCli, LogsTrlMetricsAndResumesExactlyAfterSigterm) {
  const fs::path base = test::temp_dir("grpo_cli");
  const std::string extra = "num_iterations=2 beta=0.04 log_completions=true";
  const auto r = run_cli(grpo_args(base / "straight", extra));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("grpo lora llama"), std::string::npos) << r.out;
  const fs::path run = only_run_dir(base / "straight");
  const std::vector<Json> log = records(run);
  int generation_steps = 0;
  for (const Json& j : log) {
    if (!j.contains("loss")) continue;
    for (const char* key : {"kl", "entropy", "clip_ratio", "clip_ratio/low_mean", "clip_ratio/high_mean",
                            "time/policy_s", "grad_norm"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
    }
    if (j["global_step"].get<int64_t>() % 2 == 1) {  // a rollout step: rewards and the time split
      ++generation_steps;
      for (const char* key : {"reward", "reward_std", "rewards/external_sh/mean", "completions/mean_length",
                              "completions/clipped_ratio", "frac_reward_zero_std", "time/rollout_s",
                              "time/reward_s", "time/reference_s", "rollout_tokens_per_s"}) {
        EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
      }
      // The first step of a batch has ratio 1 exactly: nothing clips.
      EXPECT_EQ(j["clip_ratio"].get<double>(), 0.0) << j.dump();
      EXPECT_GE(j["reward"].get<double>(), 0.0);
      EXPECT_LE(j["reward"].get<double>(), 1.0);
    }
  }
  EXPECT_EQ(generation_steps, 4);
  // completions.jsonl: every rollout step (logging_steps 1 catches the odd steps), 8 completions each.
  std::ifstream completions(run / "completions.jsonl");
  int lines = 0;
  for (std::string line; std::getline(completions, line); ++lines) {
    const Json j = Json::parse(line);
    for (const char* key : {"step", "prompt", "completion", "reward", "advantage", "rewards"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    }
  }
  EXPECT_EQ(lines, 4 * 8);
  EXPECT_EQ(load_json_file(run / "args.json")["rlhf_type"], "grpo");

  const fs::path out = base / "term";
  EXPECT_EQ(test::run_cli_until_checkpoint(grpo_args(out, extra), out, "checkpoint-2", "TERM", 0.005), 143)
      << read_text_file(out / "log.txt");
  const fs::path term_run = only_run_dir(out);
  ASSERT_FALSE(fs::exists(term_run / "checkpoint-8")) << "the run finished before the signal";
  // The signal came during step 3 at the latest: the run stopped at the end of that rollout batch.
  for (int odd : {1, 3, 5, 7}) {
    EXPECT_FALSE(fs::exists(term_run / fmt::format("checkpoint-{}", odd))) << "a checkpoint inside a rollout batch";
  }
  const auto resumed = run_cli(grpo_args(out, extra + " resume_from_checkpoint=latest"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
  EXPECT_EQ(grpo_values(term_run), grpo_values(run));
  EXPECT_EQ(read_text_file(term_run / "completions.jsonl"), read_text_file(run / "completions.jsonl"));
}

// Full fine-tuning with a reference copy, QLoRA, and two processes equal to one with accumulation (each process
// rolls out its own prompts; the sampling seeds follow the prompts, not the process).
TEST(GrpoCli, FullQloraAndTwoProcessesEqualOne) {
  const fs::path base = test::temp_dir("grpo_modes");
  const auto full = run_cli(grpo_args(base / "full", "train_type=full learning_rate=1e-4 max_steps=2 beta=0.04"));
  ASSERT_EQ(full.code, 0) << full.out;
  EXPECT_TRUE(fs::exists(only_run_dir(base / "full") / "checkpoint-2" / "model.safetensors"));
  const auto qlora = run_cli(grpo_args(base / "qlora", "quant_bits=8 quant_group_size=-1 max_steps=2"));
  ASSERT_EQ(qlora.code, 0) << qlora.out;
  EXPECT_TRUE(fs::exists(only_run_dir(base / "qlora") / "checkpoint-2" / "adapter_model.safetensors"));

  const std::string common = "max_steps=2 ddp_timeout=30 beta=0.04 scale_rewards=batch";
  const auto one = run_cli(grpo_args(base / "one", common));
  ASSERT_EQ(one.code, 0) << one.out;
  std::string args = grpo_args(base / "two", common + " gradient_accumulation_steps=1");
  args.replace(args.find(" rlhf "), 6, " rlhf --nproc-per-node 2 ");
  const auto two = run_cli(args);
  ASSERT_EQ(two.code, 0) << two.out;
  const auto a = records(only_run_dir(base / "one")), b = records(only_run_dir(base / "two"));
  std::vector<std::pair<double, double>> la, lb;  // (loss, reward) per step
  for (const Json& j : a) if (j.contains("loss")) la.emplace_back(j["loss"].get<double>(), j["reward"].get<double>());
  for (const Json& j : b) if (j.contains("loss")) lb.emplace_back(j["loss"].get<double>(), j["reward"].get<double>());
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  for (size_t i = 0; i < la.size(); ++i) {
    // The same seeds draw the same tokens: the only difference is the engine's batch (8 rows in one process, 4 in
    // each of two), whose logits agree up to float32 rounding, far from moving a draw across a probability
    // boundary; the rewards are 0/1 counts, so their mean is exact.
    EXPECT_EQ(la[i].second, lb[i].second) << "step " << i + 1 << ": the same completions and rewards";
    EXPECT_NEAR(la[i].first, lb[i].first, 1e-5 + 1e-5 * std::abs(la[i].first)) << "step " << i + 1;
  }
}

// The shipped demo, shortened to 10 steps: the held-out reward (8 openings the training never sees) rises by more
// than 0.3 (0.05 to 0.97 on the dev machine).
TEST(GrpoCli, TheDemoRecipeLearnsToNameItsHeroes) {
  const fs::path out = test::temp_dir("grpo_demo");
  // From the source folder, as the recipe's relative paths (model, data, reward command) expect.
  const auto r = run_cli(fmt::format("--threads 1 rlhf --recipe recipes/grpo.yaml max_steps=10 eval_steps=10 "
                                     "save_steps=10 output_dir={}", out.string()),
                         fmt::format("cd '{}' &&", source_dir().string()));
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<int64_t, double> eval;
  for (const Json& j : records(only_run_dir(out))) {
    if (j.contains("eval_reward")) eval[j["global_step"].get<int64_t>()] = j["eval_reward"].get<double>();
  }
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_LT(eval[0], 0.3);
  EXPECT_GE(eval[10] - eval[0], 0.3) << "eval_reward " << eval[0] << " -> " << eval[10];
}

// The preference recipe as shipped learns what a newcomer can see: held-out pairs (story openings never trained on)
// go from tied rewards to the chosen answer preferred in every pair.
TEST(RlhfCli, TheDpoRecipeAsShippedLearnsOnHeldOutPairs) {
  const fs::path out = test::temp_dir("dpo_recipe");
  const auto r = run_cli(fmt::format("--threads 1 rlhf --recipe recipes/dpo.yaml output_dir={}", out.string()),
                         fmt::format("cd '{}' &&", source_dir().string()));
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<int64_t, Json> eval;
  for (const Json& j : records(only_run_dir(out))) {
    if (j.contains("eval_loss")) eval[j["global_step"].get<int64_t>()] = j;
  }
  ASSERT_GE(eval.size(), 2u);
  EXPECT_NEAR(eval.begin()->second["eval_loss"].get<double>(), std::log(2.0), 1e-4);  // policy = reference
  const Json& last = eval.rbegin()->second;
  EXPECT_GE(last["eval_rewards/accuracies"].get<double>(), 0.9) << last.dump();
  EXPECT_GT(last["eval_rewards/margins"].get<double>(), 1.0) << last.dump();
}

TEST(GrpoCli, BadKeysAndAFailingRewardCommandStopWithTheirReason) {
  const fs::path base = test::temp_dir("grpo_bad");
  struct Case {
    std::string args, expected;
  };
  const std::vector<Case> cases = {
      {grpo_args(base / "a", "reward_funcs=[]"), "'reward_funcs' is required"},
      {grpo_args(base / "b", "reward_weights=[1,2]"), "'reward_weights' has 2 values for 1"},
      {grpo_args(base / "c", "per_device_train_batch_size=3 gradient_accumulation_steps=1"), "num_generations 4"},
      {grpo_args(base / "d", "label_smoothing=0.1"), "'label_smoothing' does not apply to rlhf_type grpo"},
      {grpo_args(base / "e", "num_iterations=2 save_steps=3"), "'save_steps' 3 is not a multiple"},
      {grpo_args(base / "f", "loss_type=sigmoid"), "'loss_type' sigmoid does not apply"},
      {grpo_args(base / "g", "reward_funcs=nope"), "unknown reward 'nope'"},
      {grpo_args(base / "h", "rlhf_type=dpo"), "'num_generations' is a GRPO key"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << r.out;
  }
  for (const char* dir : {"a", "b", "c", "d", "e", "f", "g", "h"}) EXPECT_FALSE(fs::exists(base / dir)) << dir;
  const auto crash = run_cli(grpo_args(base / "crash", "reward_funcs='external:echo reward service down >&2; exit 1'"));
  EXPECT_NE(crash.code, 0);
  EXPECT_NE(crash.out.find("reward service down"), std::string::npos) << crash.out;
  EXPECT_NE(crash.out.find("exit status 1"), std::string::npos) << crash.out;
}

}  // namespace
}  // namespace swiftcpp
