// LoRA against the real peft library: adapters peft wrote load and reproduce its logits, our trainer reproduces
// peft + torch.optim.AdamW training steps, merging equals applying, and our adapters round-trip.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <regex>
#include <set>

#include "core/runtime.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "tests/adapter_util.h"
#include "tests/tensor_util.h"
#include "train/trainer.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::json_to_tensor;
using test::stories_dir;

// Logits: float32 forward passes that differ from the reference only in summation order (|logits| up to ~18).
constexpr double kLogitTol = 1e-4;
// Adapter tensors after training: norm-wise relative error per tensor (see adapter_rel_error). Three AdamW steps
// amplify float32 rounding on small gradient elements: the same steps measure 7.3e-6 with OpenBLAS's sgemm and
// 1.1e-5 with oneDNN's (both kernels' products are equally close to float64), so the bound sits above both.
constexpr double kAdapterRelTol = 2e-5;
// Losses: absolute.
constexpr double kLossTol = 1e-4;

fs::path stories_ref() { return assets() / "reference" / "stories260K"; }
fs::path tiny_ref() { return assets() / "reference" / "tiny"; }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

using test::adapter_rel_error;

using test::batch_from_reference;
using test::reference_config;

TEST(PeftAdapter, StoriesAdaptersReproducePeftLogits) {
  SWIFTCPP_REQUIRE_SHARED(stories_ref());
  const Json ref = load_json_file(stories_ref() / "lora_step.json");
  const at::Tensor ids = json_to_tensor(ref["base_once_upon_a_time_ids"]).to(at::kLong).unsqueeze(0);
  for (const std::string name : {"lora_init", "lora_after3"}) {
    CausalLM model = load_causal_lm(stories_dir());
    const LoraConfig c = load_adapter(model, stories_ref() / name);
    EXPECT_EQ(c.r, 8);
    EXPECT_DOUBLE_EQ(c.scale(), 2.0);
    at::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(ids)[0];
    const at::Tensor expected = json_to_tensor(ref["adapters"][name]["once_upon_a_time_logits"]);
    const double err = max_abs_diff(logits, expected);
    std::cout << "[peft logits] " << name << " max |diff| " << err << std::endl;
    EXPECT_LT(err, kLogitTol) << name;
  }
}

TEST(PeftAdapter, Qwen2AdaptersReproducePeftLogits) {
  SWIFTCPP_REQUIRE_SHARED(tiny_ref());
  const Json ref = load_json_file(tiny_ref() / "qwen2_lora_step.json");
  const at::Tensor ids = json_to_tensor(ref["batch"]["input_ids"]).to(at::kLong);
  for (const std::string name : {"qwen2_lora_init", "qwen2_lora_after1"}) {
    CausalLM model = load_causal_lm(tiny_ref() / "tiny-qwen2");
    load_adapter(model, tiny_ref() / name);
    at::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(ids);
    const double err = max_abs_diff(logits, json_to_tensor(ref["adapters"][name]["logits"]));
    std::cout << "[peft logits] " << name << " max |diff| " << err << std::endl;
    EXPECT_LT(err, 1e-5) << name;
  }
}

TEST(PeftAdapter, MergedWeightsComputeBasePlusAdapter) {
  SWIFTCPP_REQUIRE_SHARED(stories_ref());
  const Json ref = load_json_file(stories_ref() / "lora_step.json");
  const Batch batch = batch_from_reference(ref["batch"]);
  at::NoGradGuard no_grad;
  CausalLM model = load_causal_lm(stories_dir());
  load_adapter(model, stories_ref() / "lora_after3");
  const at::Tensor unmerged = model->forward(batch.input_ids);
  merge_lora(model);
  const at::Tensor merged = model->forward(batch.input_ids);
  // W + 2 B A rounded to float32 (as peft's own merge) moves logits of magnitude ~18 by a few float32 ulps: peft
  // measured 3e-5 on this batch. Relative to the logit scale that is ~1e-6.
  const double err = max_abs_diff(merged, unmerged);
  const double scale = unmerged.abs().max().item<double>();
  std::cout << "[merge] max |diff| " << err << " (|logits| <= " << scale << ")" << std::endl;
  EXPECT_LT(err / scale, 1e-5);
}

TEST(PeftAdapter, SaveLoadRoundTripAndPeftConfigFields) {
  CausalLM model = load_causal_lm(stories_dir());
  LoraConfig c;
  c.r = 4;
  c.lora_alpha = 8;
  c.target_modules = {"q_proj", "v_proj", "down_proj"};
  c.use_rslora = true;
  c.modules_to_save = {"lm_head"};
  c.base_model_name_or_path = "stories260K";
  if (model->config().tie_word_embeddings) c.modules_to_save = {"embed_tokens"};
  inject_lora(model, c, 7);
  // Non-zero B so that the adapter changes the output.
  {
    at::NoGradGuard no_grad;
    for (auto& t : adapter_tensors(model, c)) {
      if (t.name.find("lora_B") != std::string::npos) t.tensor.normal_(0, 0.05);
    }
  }
  const fs::path dir = test::temp_dir("lora_roundtrip");
  save_adapter(dir, model, c);
  const Json cfg = load_json_file(dir / "adapter_config.json");
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["use_rslora"], true);
  EXPECT_EQ(cfg["bias"], "none");
  const auto file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  const SafetensorsFile& f = *file;
  EXPECT_TRUE(f.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_EQ(f.info("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").shape,
            (std::vector<int64_t>{4, model->config().hidden_size}));

  const at::Tensor ids = at::tensor({1, 403, 407, 261, 378}, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  model->eval();
  const at::Tensor before = model->forward(ids);
  CausalLM fresh = load_causal_lm(stories_dir());
  const at::Tensor base = fresh->forward(ids);
  const LoraConfig back = load_adapter(fresh, dir);
  EXPECT_EQ(back.r, 4);
  EXPECT_TRUE(back.use_rslora);
  EXPECT_EQ(back.modules_to_save, c.modules_to_save);
  // Exact: the same weights through the same modules and kernels at the same thread count, in one process.
  EXPECT_TRUE(at::equal(fresh->forward(ids), before));
  EXPECT_GT(max_abs_diff(base, before), 1e-3);  // the adapter does something
}

TEST(PeftAdapter, DoraMergeEqualsForwardAndMagnitudeKeyVariantsLoad) {
  CausalLM model = load_causal_lm(stories_dir());
  LoraConfig c;
  c.r = 4;
  c.lora_alpha = 8;
  c.use_dora = true;
  inject_lora(model, c, 3);
  {
    at::NoGradGuard no_grad;
    for (auto& t : adapter_tensors(model, c)) {
      if (t.name.find("lora_B") != std::string::npos) t.tensor.normal_(0, 0.05);
      if (t.name.find("magnitude") != std::string::npos) t.tensor.mul_(1.1);
    }
  }
  const fs::path dir = test::temp_dir("dora");
  save_adapter(dir, model, c);
  // peft >= 0.12 writes the magnitude as "...lora_magnitude_vector.weight": rewrite the file that way.
  {
    const Checkpoint ours = Checkpoint::open(dir / "adapter_model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> renamed;
    for (const auto& n : ours.names()) {
      const bool mag = n.size() > 21 && n.compare(n.size() - 21, 21, "lora_magnitude_vector") == 0;
      renamed.emplace_back(mag ? n + ".weight" : n, ours.tensor(n).clone());
    }
    save_safetensors(dir / "adapter_model.safetensors", renamed);
  }
  const at::Tensor ids = at::tensor({1, 403, 407, 261, 378, 300, 301}, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  model->eval();
  const at::Tensor direct = model->forward(ids);
  CausalLM loaded = load_causal_lm(stories_dir());
  load_adapter(loaded, dir);
  EXPECT_LT(max_abs_diff(loaded->forward(ids), direct), 1e-6);
  merge_lora(loaded);
  EXPECT_LT(max_abs_diff(loaded->forward(ids), direct), 1e-4);
}

TEST(PeftAdapter, AdapterForAnotherModelIsRefusedWithTheTensors) {
  SWIFTCPP_REQUIRE_SHARED(tiny_ref());
  CausalLM model = load_causal_lm(stories_dir());
  try {
    load_adapter(model, tiny_ref() / "qwen2_lora_init");
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("adapter_model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing: base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight"), std::string::npos) << msg;
  }
  EXPECT_THROW(load_adapter(model, test::temp_dir("no_adapter")), IoError);
}

// Adapter values load_adapter checks, in every command (they all load through it): integer-typed tensors are
// refused naming the tensor; NaN or Inf values and a scale that overflows every output load with a warning naming
// them, as non-finite base weights do; a non-finite lora_alpha or a dropout outside [0, 1) is refused by key.
TEST(PeftAdapter, IntegerTensorsAreRefusedAndNonFiniteValuesOrAbsurdScalesWarned) {
  CausalLM model = load_causal_lm(stories_dir());
  LoraConfig c;
  c.r = 4;
  c.lora_alpha = 8;
  c.target_modules = {"q_proj", "v_proj"};
  inject_lora(model, c, 5);
  const fs::path good = test::temp_dir("lora_values_good");
  save_adapter(good, model, c);
  const std::string a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  const std::string b = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";
  // Rewrites the adapter in `dir` with `edit` applied to its tensors and `config_edit` to its config.
  const auto variant = [&](const std::string& name, const std::function<at::Tensor(const std::string&, at::Tensor)>& edit,
                           const std::function<void(Json&)>& config_edit) {
    const fs::path dir = test::temp_dir(name);
    const Checkpoint ours = Checkpoint::open(good / "adapter_model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& n : ours.names()) tensors.emplace_back(n, edit(n, ours.tensor(n).clone()));
    save_safetensors(dir / "adapter_model.safetensors", tensors);
    Json config = load_json_file(good / "adapter_config.json");
    config_edit(config);
    write_file_atomic(dir / "adapter_config.json", config.dump(2));
    return dir;
  };
  const auto same = [](const std::string&, at::Tensor t) { return t; };
  const auto keep = [](Json&) {};
  std::vector<std::string> warnings;
  struct SinkGuard {
    WarningSink previous;
    ~SinkGuard() { set_warning_sink(previous); }
  } guard{set_warning_sink([&](const std::string& m) { warnings.push_back(m); })};

  const fs::path integer = variant("lora_values_int", [&](const std::string& n, at::Tensor t) {
    return n == a ? t.to(at::kLong) : t;
  }, keep);
  try {
    CausalLM fresh = load_causal_lm(stories_dir());
    load_adapter(fresh, integer);
    ADD_FAILURE() << "an int64 lora_A loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(a), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Long"), std::string::npos) << e.what();
  }

  const fs::path nan = variant("lora_values_nan", [&](const std::string& n, at::Tensor t) {
    if (n == b) t.index_put_({0, 0}, std::nan(""));
    return t;
  }, keep);
  warnings.clear();
  {
    CausalLM fresh = load_causal_lm(stories_dir());
    EXPECT_NO_THROW(load_adapter(fresh, nan));
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model.layers.1.self_attn.v_proj.lora_B"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("NaN or Inf"), std::string::npos) << warnings[0];

  const fs::path absurd = variant("lora_values_alpha", same, [](Json& j) { j["lora_alpha"] = 1e30; });
  warnings.clear();
  {
    CausalLM fresh = load_causal_lm(stories_dir());
    EXPECT_NO_THROW(load_adapter(fresh, absurd));
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("lora_alpha 1e+30"), std::string::npos) << warnings[0];

  warnings.clear();
  {
    CausalLM fresh = load_causal_lm(stories_dir());
    EXPECT_NO_THROW(load_adapter(fresh, good));  // the unchanged adapter: no warning, no error
  }
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  const fs::path dropout = variant("lora_values_dropout", same, [](Json& j) { j["lora_dropout"] = 1.5; });
  CausalLM fresh = load_causal_lm(stories_dir());
  try {
    load_adapter(fresh, dropout);
    ADD_FAILURE() << "lora_dropout 1.5 loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lora_dropout"), std::string::npos) << e.what();
  }
}

TEST(TrainParity, StoriesThreeLoraStepsMatchPeft) {
  SWIFTCPP_REQUIRE_SHARED(stories_ref());
  const Json ref = load_json_file(stories_ref() / "lora_step.json");
  const Batch batch = batch_from_reference(ref["batch"]);
  ASSERT_EQ(batch.label_tokens, ref["batch"]["n_loss_tokens"].get<int64_t>());
  Trainer trainer(reference_config(stories_dir().string(), stories_ref() / "lora_init"), load_causal_lm(stories_dir()));
  ASSERT_EQ(trainer.trainables().size(), 70u);
  for (int step = 0; step < 3; ++step) {
    const StepResult r = trainer.step({batch}, step, 3);
    const double want = ref["steps"][step]["loss"].get<double>();
    std::cout << "[parity] stories step " << step + 1 << " loss " << r.loss << " (peft " << want << ", |diff| "
              << std::abs(r.loss - want) << ") grad norm " << r.grad_norm << " (peft "
              << ref["steps"][step]["grad_l2_norm_total"].get<double>() << ")" << std::endl;
    EXPECT_NEAR(r.loss, want, kLossTol);
    EXPECT_NEAR(r.grad_norm, ref["steps"][step]["grad_l2_norm_total"].get<double>(), 1e-4);
  }
  const auto [sum, tokens] = trainer.evaluate({batch});
  std::cout << "[parity] stories loss after 3 steps |diff| " << std::abs(sum / tokens - ref["loss_after_step3"].get<double>())
            << std::endl;
  EXPECT_NEAR(sum / tokens, ref["loss_after_step3"].get<double>(), kLossTol);
  const double rel = adapter_rel_error(trainer.trainables(), stories_ref() / "lora_after3");
  std::cout << "[parity] stories adapters after 3 steps: max relative error " << rel << std::endl;
  EXPECT_LT(rel, kAdapterRelTol);
}

TEST(TrainParity, TinyQwen2OneLoraStepMatchesPeft) {
  SWIFTCPP_REQUIRE_SHARED(tiny_ref());
  const Json ref = load_json_file(tiny_ref() / "qwen2_lora_step.json");
  const Batch batch = batch_from_reference(ref["batch"]);
  const fs::path model_dir = tiny_ref() / "tiny-qwen2";
  Trainer trainer(reference_config(model_dir.string(), tiny_ref() / "qwen2_lora_init"), load_causal_lm(model_dir));
  const StepResult r = trainer.step({batch}, 0, 1);
  std::cout << "[parity] qwen2 loss " << r.loss << " (peft " << ref["loss_before"].get<double>() << ", |diff| "
            << std::abs(r.loss - ref["loss_before"].get<double>()) << ") grad norm " << r.grad_norm << std::endl;
  EXPECT_NEAR(r.loss, ref["loss_before"].get<double>(), kLossTol);
  EXPECT_NEAR(r.grad_norm, ref["grad_l2_norm_total_step1"].get<double>(), 1e-5);
  const auto [sum, tokens] = trainer.evaluate({batch});
  EXPECT_NEAR(sum / tokens, ref["loss_after_step1"].get<double>(), kLossTol);
  const double rel = adapter_rel_error(trainer.trainables(), tiny_ref() / "qwen2_lora_after1");
  std::cout << "[parity] qwen2 adapters after 1 step: max relative error " << rel << std::endl;
  EXPECT_LT(rel, kAdapterRelTol);
}

// peft's matching rules, applied to an adapter_config.json (peft.tuners.tuners_utils.check_target_module_exists and
// peft.utils.other._set_trainable, peft 0.10+): a string target_modules is re.fullmatch'ed against every module
// path of the model; a list selects a path equal to an entry or ending with "." + entry; a modules_to_save entry
// selects every path that ends with it. "all-linear" (every Linear of the whole model but the output layer) is not
// emulated: an adapter that says it fails the test, since peft expands it beyond what was adapted.
struct PeftSelection {
  std::set<std::string> targets, saved;
};

PeftSelection peft_selects(const Json& config, const std::set<std::string>& modules) {
  PeftSelection out;
  const Json& tm = config.at("target_modules");
  EXPECT_NE(tm, Json("all-linear")) << "peft expands all-linear to every Linear of the whole model";
  for (const auto& m : modules) {
    const auto ends_with = [&](const std::string& s) {
      return m.size() >= s.size() && m.compare(m.size() - s.size(), s.size(), s) == 0;
    };
    if (tm.is_string()) {
      if (std::regex_match(m, std::regex(tm.get<std::string>()))) out.targets.insert(m);
    } else {
      for (const auto& t : tm) {
        if (m == t.get<std::string>() || ends_with("." + t.get<std::string>())) out.targets.insert(m);
      }
    }
    if (config.at("modules_to_save").is_array()) {
      for (const auto& t : config.at("modules_to_save")) {
        if (ends_with(t.get<std::string>())) out.saved.insert(m);
      }
    }
  }
  return out;
}

// Every module path of a Hugging Face checkpoint: the prefixes of its tensor names ("model.layers.0.mlp.up_proj"
// of "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp", ...), as transformers' named_modules() lists the
// modules that hold parameters.
std::set<std::string> checkpoint_modules(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& name : Checkpoint::open(dir).names()) {
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      out.insert(name.substr(0, dot));
    }
  }
  return out;
}

// For every family of the registry (a Hugging Face checkpoint each: the bundled Llama, the families' tiny
// checkpoints, the vision-language models), the adapters the trainer writes, with all-linear and with a name list,
// name under peft's rules exactly the modules they adapted and saved: no vision-tower layer that shares a name
// (Qwen2-VL's `proj`, CLIP's q_proj), no router of a mixture of experts, none missed. And each loads back.
TEST(PeftAdapter, EveryFamilysSavedConfigSelectsUnderPeftsRulesExactlyWhatWasAdapted) {
  const fs::path ref = assets() / "reference";
  SWIFTCPP_REQUIRE_SHARED(ref / "families");
  const std::vector<fs::path> checkpoints = {
      stories_dir(), ref / "tiny/tiny-llama", ref / "tiny/tiny-qwen2",
      ref / "families/gemma/tiny-gemma", ref / "families/gemma2/tiny-gemma2",
      ref / "families/starcoder2/tiny-starcoder2", ref / "families/phi/tiny-phi", ref / "families/phi3/tiny-phi3",
      ref / "families/mixtral/tiny-mixtral", ref / "families/qwen2_moe/tiny-qwen2_moe",
      ref / "llava/tiny-llava", ref / "llava_next/tiny-llava-next", ref / "qwen2_vl/tiny-qwen2-vl",
      ref / "qwen2_5_vl/tiny-qwen2.5-vl"};
  int regexes = 0;
  for (const fs::path& dir : checkpoints) {
    const std::set<std::string> modules = checkpoint_modules(dir);
    for (const std::vector<std::string>& targets :
         {std::vector<std::string>{"all-linear"}, std::vector<std::string>{"q_proj", "v_proj"}}) {
      const std::string what = dir.filename().string() + " [" + targets.front() + "]";
      TrainConfig c;
      c.model = dir.string();
      c.dataset = {"unused"};
      c.target_modules = targets;
      if (dir.filename() == "tiny-phi3") c.target_modules = targets.size() == 1 ? targets : std::vector<std::string>{"qkv_proj"};
      Trainer trainer(c, load_causal_lm(dir));
      const fs::path out = test::temp_dir("peft_rules");
      save_adapter(out, trainer.model(), trainer.lora_config());
      const Json config = load_json_file(out / "adapter_config.json");
      regexes += config["target_modules"].is_string() ? 1 : 0;
      std::cout << "[peft rules] " << what << ": target_modules " << config["target_modules"].dump() << std::endl;

      // What the adapter holds: LoRA pairs by module, whole modules by parameter.
      std::set<std::string> adapted, saved_tensors;
      const std::string prefix = "base_model.model.";
      for (const auto& name : Checkpoint::open(out / "adapter_model.safetensors").names()) {
        ASSERT_EQ(name.rfind(prefix, 0), 0u) << what << ": " << name;
        const std::string path = name.substr(prefix.size());
        const size_t lora = path.find(".lora_");
        if (lora != std::string::npos) adapted.insert(path.substr(0, lora));
        else saved_tensors.insert(path);
      }
      ASSERT_FALSE(adapted.empty()) << what;
      for (const auto& m : adapted) EXPECT_TRUE(modules.count(m)) << what << ": adapted " << m << " is no module of the checkpoint";

      const PeftSelection peft = peft_selects(config, modules);
      EXPECT_EQ(peft.targets, adapted) << what << ": target_modules " << config["target_modules"].dump();
      // Each saved module's parameters, all of them, and nothing outside a saved module.
      std::set<std::string> expected_saved;
      for (const auto& name : Checkpoint::open(dir).names()) {
        for (const auto& m : peft.saved) {
          if (name.rfind(m + ".", 0) == 0) expected_saved.insert(name);
        }
      }
      EXPECT_EQ(saved_tensors, expected_saved) << what << ": modules_to_save " << config["modules_to_save"].dump();

      CausalLM fresh = load_causal_lm(dir);
      EXPECT_NO_THROW(load_adapter(fresh, out)) << what;
    }
  }
  EXPECT_GT(regexes, 0);  // the vision-language models need a regex (their towers share the layer names)
}

}  // namespace
}  // namespace swiftcpp
