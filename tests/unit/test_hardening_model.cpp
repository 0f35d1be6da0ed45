// Hostile model files and settings: config.json sizes far beyond any real model, non-string architectures,
// NaN/Inf weights (a warning naming them), NaN/Inf training losses (the run stops, or the step is skipped), NaN
// and Inf settings, and lengths beyond the model's context.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>

#include "config/schema.h"
#include "core/runtime.h"
#include "eval/evaluator.h"
#include "eval/scorer.h"
#include "infer/generate.h"
#include "infer/sampling.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_processor.h"
#include "train/config.h"
#include "train/trainer.h"

namespace swiftcpp {
namespace {

using test::expect_error;
using test::stories_dir;

// stories260K's config.json with `changes` merged in (a null value removes the key), in a fresh folder.
fs::path config_with(const std::string& name, const Json& changes) {
  const fs::path dir = test::temp_dir("hardening_config_" + name);
  Json config = load_json_file(stories_dir() / "config.json");
  for (const auto& [key, value] : changes.items()) {
    if (value.is_null()) config.erase(key);
    else config[key] = value;
  }
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

// Collects the warnings raised while it lives (the process-wide sink is restored afterwards).
class WarningCollector {
 public:
  WarningCollector() {
    previous_ = set_warning_sink([this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(m);
    });
  }
  ~WarningCollector() { set_warning_sink(previous_); }
  std::vector<std::string> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  std::string joined() {
    std::string out;
    for (const auto& m : messages()) out += m + "\n";
    return out;
  }

 private:
  WarningSink previous_;
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

// A copy of stories260K whose weights `poison` edits (tokenizer and config unchanged).
fs::path poisoned_stories(const std::string& name,
                          const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& poison) {
  const fs::path dir = test::temp_dir("hardening_weights_" + name);
  for (const auto& e : fs::directory_iterator(stories_dir())) {
    if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), dir / e.path().filename());
  }
  const Checkpoint source = Checkpoint::open(stories_dir());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& n : source.names()) tensors.emplace_back(n, source.tensor(n).clone());
  poison(tensors);
  save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

void set_value(std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& name, double value) {
  for (auto& [n, t] : tensors) {
    if (n == name) t.view({-1})[3] = value;
  }
}

const char* kNanTensor = "model.layers.1.mlp.down_proj.weight";
const char* kInfTensor = "model.norm.weight";

fs::path nan_and_inf_stories() {
  return poisoned_stories("nan_inf", [](auto& tensors) {
    set_value(tensors, kNanTensor, std::nan(""));
    set_value(tensors, kInfTensor, std::numeric_limits<double>::infinity());
  });
}

// ---------------------------------------------------------------------------------------------------------------
// config.json sizes

TEST(ConfigBounds, HugeSizesAreRefusedNamingFileKeyAndLimit) {
  struct Case {
    const char* key;
    Json value;
    const char* limit;
  };
  const std::vector<Case> cases = {
      {"num_hidden_layers", 1e9, "4096"},
      {"num_hidden_layers", int64_t{1} << 32, "4096"},
      {"hidden_size", int64_t{1} << 40, "1048576"},
      {"max_position_embeddings", int64_t{1} << 40, "16777216"},
      {"vocab_size", std::numeric_limits<int64_t>::max(), "16777216"},
      {"intermediate_size", std::numeric_limits<int64_t>::max() - 1, "4194304"},
      {"num_attention_heads", int64_t{1} << 62, "4096"},
      {"head_dim", int64_t{1} << 40, "4096"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    const fs::path dir = config_with(c.key, {{c.key, c.value}});
    expect_error<ConfigError>([&] { load_decoder_config(dir); },
                              {(dir / "config.json").string(), std::string("'") + c.key + "'", c.limit});
  }
}

// Qwen2.5-VL settings transformers relies on: windows of whole merged patches, special tokens inside the vocabulary
// and distinct; and a processor whose patches are not the tower's, named by file and key.
TEST(ConfigBounds, QwenVisionSettingsAndTheirProcessorAreCheckedByKey) {
  const fs::path ref = test::assets() / "reference" / "qwen2_5_vl" / "tiny-qwen2.5-vl";
  SWIFTCPP_REQUIRE_SHARED(ref / "config.json");
  const auto variant = [&](const std::string& name, const std::function<void(Json&)>& config_edit,
                           const std::function<void(Json&)>& processor_edit) {
    const fs::path dir = test::temp_dir("hardening_qwen_" + name);
    Json config = load_json_file(ref / "config.json");
    config_edit(config);
    std::ofstream(dir / "config.json") << config.dump(2);
    Json processor = load_json_file(ref / "preprocessor_config.json");
    processor_edit(processor);
    std::ofstream(dir / "preprocessor_config.json") << processor.dump(2);
    return dir;
  };
  const auto keep = [](Json&) {};
  EXPECT_NO_THROW(load_decoder_config(variant("ok", keep, keep)));
  EXPECT_NO_THROW(vision::load_image_processor(variant("ok", keep, keep), 0));

  fs::path dir = variant("window", [](Json& c) { c["vision_config"]["window_size"] = 100; }, keep);
  expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"'vision_config.window_size' 100", "28"});
  dir = variant("start_outside", [](Json& c) { c["vision_start_token_id"] = 5000; }, keep);
  expect_error<ConfigError>([&] { load_decoder_config(dir); },
                            {(dir / "config.json").string(), "'vision_start_token_id'", "vocab_size 1024", "5000"});
  dir = variant("start_is_image", [](Json& c) { c["vision_start_token_id"] = c["image_token_id"]; }, keep);
  expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"'vision_start_token_id' and 'image_token_id'"});
  dir = variant("video_is_image", [](Json& c) { c["video_token_id"] = c["image_token_id"]; }, keep);
  expect_error<ConfigError>([&] { load_decoder_config(dir); }, {"'video_token_id'"});

  for (const char* key : {"patch_size", "temporal_patch_size", "merge_size"}) {
    SCOPED_TRACE(key);
    dir = variant(std::string("processor_") + key, keep, [&](Json& p) { p[key] = 4; });
    expect_error<ConfigError>([&] { vision::load_image_processor(dir, 0); },
                              {(dir / "preprocessor_config.json").string(), std::string("'") + key + "' 4",
                               (dir / "config.json").string()});
  }
}

TEST(ConfigBounds, SizesWithinTheirBoundsButTooManyParametersAreRefused) {
  // Each size is allowed alone; together they describe 2^24 x 2^20 embedding weights alone (> 2^40).
  const fs::path dir = config_with("params", {{"vocab_size", int64_t{1} << 24}, {"hidden_size", int64_t{1} << 20},
                                              {"num_attention_heads", 256}, {"num_key_value_heads", 256},
                                              {"head_dim", 4096}});
  expect_error<ConfigError>([&] { load_decoder_config(dir); },
                            {(dir / "config.json").string(), "parameters", "1099511627776", "vocab_size 16777216"});
}

TEST(ConfigBounds, ParameterCountMatchesTheBuiltModel) {
  CausalLM model = load_causal_lm(stories_dir());
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  EXPECT_EQ(model->config().parameter_count(), numel);
  DecoderConfig c = model->config();
  c.tie_word_embeddings = false;
  EXPECT_EQ(c.parameter_count(), numel + c.vocab_size * c.hidden_size);
  c.num_hidden_layers = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_EQ(c.parameter_count(), -1);  // overflow is reported, not wrapped
}

TEST(ConfigBounds, NonStringArchitecturesAreAConfigErrorNamingFileAndKey) {
  const fs::path with_type = config_with("arch_number", {{"architectures", Json::array({1})}});
  expect_error<ConfigError>([&] { load_decoder_config(with_type); },
                            {(with_type / "config.json").string(), "'architectures'", "must hold strings"});
  const fs::path without_type =
      config_with("arch_object", {{"model_type", nullptr}, {"architectures", Json::array({Json::object()})}});
  expect_error<ConfigError>([&] { load_decoder_config(without_type); },
                            {(without_type / "config.json").string(), "'architectures'"});
  const fs::path not_a_list = config_with("arch_string", {{"architectures", "LlamaForCausalLM"}});
  expect_error<ConfigError>([&] { load_decoder_config(not_a_list); },
                            {(not_a_list / "config.json").string(), "'architectures'", "list of strings"});
}

TEST(ConfigBounds, ErrorsShowLongValuesCut) {
  Json long_list = Json::array();
  for (int i = 0; i < 2000; ++i) long_list.push_back("x");
  long_list.push_back(7);
  const fs::path dir = config_with("arch_long", {{"model_type", nullptr}, {"architectures", long_list}});
  try {
    load_decoder_config(dir);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
  }
  // The same list, unsupported names only: the error shows a cut description, not the 8 kB list.
  long_list.erase(long_list.size() - 1);
  const fs::path unknown = config_with("arch_long_unknown", {{"model_type", nullptr}, {"architectures", long_list}});
  try {
    load_decoder_config(unknown);
    ADD_FAILURE() << "no error";
  } catch (const ModelError& e) {
    // The message lists the supported families (about 40 characters each) after a cut description of the list.
    EXPECT_LT(std::string(e.what()).size(), 300u + 45u * architectures().size()) << e.what();
    EXPECT_NE(std::string(e.what()).find("..."), std::string::npos) << e.what();
  }
}

TEST(ConfigBounds, NonFiniteFloatSettingsAreRefused) {
  DecoderConfig c = load_decoder_config(stories_dir());
  c.rms_norm_eps = std::nan("");
  expect_error<ConfigError>([&] { c.validate("cfg"); }, {"cfg", "rms_norm_eps"});
  c = load_decoder_config(stories_dir());
  c.rope_theta = std::numeric_limits<double>::infinity();
  expect_error<ConfigError>([&] { c.validate("cfg"); }, {"cfg", "rope_theta"});
}

TEST(ConfigBounds, RotaryTablesDoNotScaleWithALongContext) {
  // A 16M-position context is accepted and costs nothing until such positions are used.
  const fs::path dir = config_with("long_context", {{"max_position_embeddings", int64_t{1} << 24}});
  fs::copy_file(stories_dir() / "model.safetensors", dir / "model.safetensors");
  CausalLM model = load_causal_lm(dir);
  const at::Tensor logits = model->forward(at::tensor(std::vector<int64_t>{1, 5, 9}, at::kLong).view({1, 3}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{1, 3, 512}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
}

// ---------------------------------------------------------------------------------------------------------------
// NaN / Inf weights

TEST(NonFiniteWeights, LoadingWarnsNamingEveryBadTensor) {
  const fs::path dir = nan_and_inf_stories();
  WarningCollector warnings;
  const CausalLM model = load_causal_lm(dir);
  ASSERT_EQ(warnings.messages().size(), 1u) << warnings.joined();
  const std::string w = warnings.messages()[0];
  EXPECT_NE(w.find(dir.string()), std::string::npos) << w;
  EXPECT_NE(w.find(kNanTensor), std::string::npos) << w;
  EXPECT_NE(w.find(kInfTensor), std::string::npos) << w;
  EXPECT_NE(w.find("2 weight tensors"), std::string::npos) << w;
}

TEST(NonFiniteWeights, CleanWeightsRaiseNoWarningInAnyDtype) {
  WarningCollector warnings;
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    load_causal_lm(stories_dir(), {at::kCPU, dtype});
  }
  EXPECT_TRUE(warnings.messages().empty()) << warnings.joined();
}

TEST(NonFiniteWeights, AllFiniteChecksEveryChunkAndDtype) {
  at::Tensor big = at::zeros({(int64_t{1} << 22) + 7});
  EXPECT_TRUE(all_finite(big));
  big[(int64_t{1} << 22) + 5] = std::nan("");  // in the second chunk
  EXPECT_FALSE(all_finite(big));
  EXPECT_FALSE(all_finite(at::tensor({1.0, -std::numeric_limits<double>::infinity()}).to(at::kHalf)));
  EXPECT_TRUE(all_finite(at::tensor(std::vector<int64_t>{1, 2, 3})));
  EXPECT_TRUE(all_finite(at::Tensor()));
}

// ---------------------------------------------------------------------------------------------------------------
// NaN / Inf training loss

TrainConfig nan_config(const fs::path& model) {
  TrainConfig c;
  c.model = model.string();
  c.dataset = {"unused"};
  c.train_type = "lora";
  c.lora_dropout = 0.0;
  c.learning_rate = 1e-2;
  c.lr_scheduler_type = "constant";
  return c;
}

Batch small_batch() {
  Sample s;
  for (int i = 0; i < 12; ++i) s.input_ids.push_back(1 + (i * 37) % 500);
  for (size_t t = 0; t + 1 < s.input_ids.size(); ++t) s.labels.push_back(s.input_ids[t + 1]);
  s.labels.push_back(kIgnoreIndex);
  return collate_padded({&s}, 0);
}

std::vector<at::Tensor> snapshot(const Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.trainables()) out.push_back(p.tensor.detach().clone());
  return out;
}

void expect_unchanged(const Trainer& t, const std::vector<at::Tensor>& before) {
  ASSERT_EQ(t.trainables().size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    // The same tensors untouched: exact.
    EXPECT_TRUE(at::equal(t.trainables()[i].tensor, before[i])) << t.trainables()[i].name;
  }
}

TEST(NonFiniteLoss, StopsTheStepNamingItAndLeavesTheWeights) {
  Trainer trainer(nan_config(stories_dir()), load_causal_lm(stories_dir()));
  const Batch batch = small_batch();
  const StepResult good = trainer.step({batch}, 0, 4);
  EXPECT_TRUE(std::isfinite(good.loss));
  EXPECT_FALSE(good.skipped);
  // The base weights go bad after a good step (a poisoned norm: every logit NaN).
  {
    at::NoGradGuard no_grad;
    trainer.model()->model->norm->weight[0] = std::nan("");
  }
  const auto before = snapshot(trainer);
  expect_error<Error>([&] { trainer.step({batch}, 1, 4); }, {"step 2", "loss is nan", "skip_nonfinite_loss"});
  expect_unchanged(trainer, before);
  for (const auto& p : trainer.trainables()) EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
  // The optimizer did not count the refused step.
  EXPECT_EQ(trainer.optimizer_state().second, 1);
}

TEST(NonFiniteLoss, SkipNonfiniteLossDropsTheStepAndKeepsTraining) {
  const fs::path dir = poisoned_stories("nan_norm", [](auto& tensors) { set_value(tensors, kInfTensor, std::nan("")); });
  TrainConfig c = nan_config(dir);
  c.skip_nonfinite_loss = true;
  Trainer trainer(c, load_causal_lm(dir));
  const auto before = snapshot(trainer);
  const StepResult r = trainer.step({small_batch()}, 0, 4);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(std::isnan(r.loss));
  expect_unchanged(trainer, before);
  EXPECT_EQ(trainer.optimizer_state().second, 0);
}

TEST(NonFiniteLoss, TheRecipeKeyIsDescribedAndDefaultsToStopping) {
  EXPECT_FALSE(TrainConfig{}.skip_nonfinite_loss);
  const TrainConfig c = load_train_config("", {"model=m", "dataset=d.jsonl", "skip_nonfinite_loss=true"});
  EXPECT_TRUE(c.skip_nonfinite_loss);
  EXPECT_NE(train_config_schema().help().find("skip_nonfinite_loss"), std::string::npos);
  EXPECT_TRUE(train_config_schema().dump(c).at("skip_nonfinite_loss").get<bool>());
}

// ---------------------------------------------------------------------------------------------------------------
// NaN / Inf settings

TEST(NonFiniteSettings, SamplingRefusesNanAndInf) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (const auto& [field, value] : std::vector<std::pair<std::string, double>>{
           {"temperature", nan}, {"temperature", inf}, {"top_p", nan}, {"min_p", nan},
           {"repetition_penalty", nan}, {"repetition_penalty", inf}}) {
    SCOPED_TRACE(field);
    SamplingParams p;
    if (field == "temperature") p.temperature = value;
    if (field == "top_p") p.top_p = value;
    if (field == "min_p") p.min_p = value;
    if (field == "repetition_penalty") p.repetition_penalty = value;
    expect_error<ConfigError>([&] { p.validate(); }, {field});
  }
}

TEST(NonFiniteSettings, RecipeNumbersRefuseNanAndInf) {
  for (const std::string o : {"max_grad_norm=.inf", "lora_alpha=.inf", "learning_rate=.nan", "ddp_timeout=.nan",
                              "max_grad_norm=-.inf", "num_train_epochs=.nan"}) {
    SCOPED_TRACE(o);
    const std::string key = o.substr(0, o.find('='));
    expect_error<ConfigError>([&] { load_train_config("", {"model=m", "dataset=d.jsonl", o}); }, {key});
  }
  // A finite value beyond no bound still works.
  EXPECT_DOUBLE_EQ(load_train_config("", {"model=m", "dataset=d.jsonl", "max_grad_norm=1e30"}).max_grad_norm, 1e30);
}

// ---------------------------------------------------------------------------------------------------------------
// Lengths against the model's context (stories260K: 512 positions)

std::vector<int64_t> prompt_of(int64_t n) {
  std::vector<int64_t> ids = {1};
  for (int64_t i = 1; i < n; ++i) ids.push_back(3 + (i * 29) % 400);
  return ids;
}

TEST(ContextLimit, GenerationStopsWhenPromptAndNewTokensFillTheContext) {
  Generator gen(load_causal_lm(stories_dir()), load_tokenizer(stories_dir()));
  GenerationConfig c;
  c.sampling.temperature = 0;
  c.max_new_tokens = 100000;
  WarningCollector warnings;
  const auto r = gen.generate({prompt_of(500), prompt_of(505)}, c);
  EXPECT_EQ(r[0].new_ids.size(), 12u);  // 500 + 12 = 512
  EXPECT_EQ(r[1].new_ids.size(), 7u);
  EXPECT_EQ(r[0].finish_reason, "length");
  EXPECT_EQ(r[1].finish_reason, "length");
  ASSERT_EQ(warnings.messages().size(), 1u) << warnings.joined();
  EXPECT_NE(warnings.messages()[0].find("512"), std::string::npos) << warnings.joined();
  // A prompt that fills the context exactly gets nothing new, beside one that still has room.
  const auto full = gen.generate({prompt_of(512), prompt_of(510)}, c);
  EXPECT_TRUE(full[0].new_ids.empty());
  EXPECT_EQ(full[0].finish_reason, "length");
  EXPECT_EQ(full[1].new_ids.size(), 2u);
  // Within the context nothing is cut and nothing is said.
  c.max_new_tokens = 12;
  EXPECT_EQ(gen.generate({prompt_of(500)}, c)[0].new_ids.size(), 12u);
  EXPECT_EQ(warnings.messages().size(), 2u) << warnings.joined();
}

TEST(ContextLimit, PromptsLongerThanTheContextAreRefused) {
  Generator gen(load_causal_lm(stories_dir()), load_tokenizer(stories_dir()));
  GenerationConfig c;
  c.sampling.temperature = 0;
  c.max_new_tokens = 1;
  expect_error<ConfigError>([&] { gen.generate({prompt_of(4), prompt_of(513)}, c); },
                            {"prompt 1", "513 tokens", "512 positions"});
  expect_error<ConfigError>([&] { gen.prompt_logits(prompt_of(600)); }, {"600 tokens", "512 positions"});
}

TEST(ContextLimit, ScorerMaxLengthIsAtMostTheContext) {
  CausalLM model = load_causal_lm(stories_dir());
  expect_error<ConfigError>([&] { eval::Scorer scorer(model, {1, 100000}); },
                            {"100000", "512", "max_position_embeddings"});
  const eval::Scorer resolved(model, {1, 0});  // 0: the model's context
  EXPECT_EQ(resolved.options().max_length, 512);
  const eval::Scorer full(model, {1, 512});
  EXPECT_EQ(full.options().max_length, 512);
  eval::Evaluator evaluator(model, load_tokenizer(stories_dir()), {});  // the default fits the model
  eval::EvalOptions too_long;
  too_long.scorer.max_length = 513;
  expect_error<ConfigError>([&] { eval::Evaluator e(model, load_tokenizer(stories_dir()), too_long); }, {"513"});
}

}  // namespace
}  // namespace swiftcpp
