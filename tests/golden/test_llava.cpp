// Golden tests: LLaVA-1.5 (CLIP tower + projector + Llama) against transformers 4.40.2 on the tiny reference
// checkpoint (../shared/assets/reference/llava).
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "models/vision/clip.h"
#include "data/collate.h"
#include "data/encode.h"
#include "infer/generate.h"
#include "peft/lora.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"
#include "tests/adapter_util.h"
#include "tests/tensor_util.h"

namespace swiftcpp {
namespace {

using test::assets;
using test::json_to_tensor;

// float32: transformers computed the reference in float32 (netlib BLAS); only summation order differs. The README
// measures OpenBLAS against it at 2.4e-6 on |logits| <= 3.2.
constexpr double kF32Tol = 1e-4;
constexpr double kLossTol = 1e-5;

fs::path llava_dir() { return assets() / "reference/llava"; }

at::Tensor long_tensor(const Json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct LlavaFixture {
  Json ref;
  Checkpoint tensors = Checkpoint::open(llava_dir() / "llava_logits.safetensors");
  CausalLM model = load_causal_lm(llava_dir() / "tiny-llava", {test::test_device(), at::kFloat});
  LlavaFixture() : ref(load_json_file(llava_dir() / "llava_logits.json")) {}

  /// Logits of a case's expanded ids with its pixel values: [B, L, V] on the CPU.
  at::Tensor logits(const Json& c) {
    const at::Tensor ids = long_tensor(c["input_ids_expanded"]).to(test::test_device());
    const at::Tensor mask = long_tensor(c["final_attention_mask"]).to(at::kBool).to(test::test_device());
    ForwardOptions o;
    o.pixel_values = tensors.tensor(c["pixel_values_key"].get<std::string>()).to(test::test_device());
    o.position_ids = long_tensor(c["position_ids"]).to(test::test_device());
    o.key_valid = mask;
    return model->forward(ids, o).cpu();
  }
};

TEST(GoldenLlava, ConfigNamesTheCompositeModel) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  const DecoderConfig c = load_decoder_config(llava_dir() / "tiny-llava");
  EXPECT_EQ(c.model_type, "llava");
  EXPECT_EQ(c.architecture, "LlavaForConditionalGeneration");
  ASSERT_TRUE(c.multimodal);
  EXPECT_EQ(c.multimodal->image_token_index, 512);
  EXPECT_EQ(c.multimodal->image_seq_length, 16);
  EXPECT_EQ(c.multimodal->image_size, 56);
  // The text part took LlamaConfig's defaults where config.json leaves keys out.
  EXPECT_EQ(c.vocab_size, 520);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_FALSE(c.tie_word_embeddings);
  CausalLM model(c);
  int64_t n = 0;
  for (const auto& p : model->named_parameters(true)) n += p.value().numel();
  EXPECT_EQ(n, 204000);  // model_summary: 204,000 parameters
  EXPECT_EQ(c.parameter_count(), 204000);
  EXPECT_EQ(model->language_model_prefix(), "language_model.");
}

TEST(GoldenLlava, VisionTowerAndProjectorMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  c10::InferenceMode guard;
  const at::Tensor px = f.tensors.tensor("a_one_image.pixel_values").to(test::test_device());  // [1, 3, 56, 56]
  auto* tower = f.model->named_modules()["vision_tower.vision_model"]->as<ClipVisionTransformer>();
  ASSERT_NE(tower, nullptr);
  for (int i = 0; i < 3; ++i) {
    const at::Tensor h = tower->hidden_state(px, i).cpu();
    const at::Tensor expected = f.tensors.tensor(fmt::format("a_one_image.vision_hidden_states.{}", i));
    EXPECT_LE(max_abs_diff(h, expected), 1e-5) << "hidden state " << i;
  }
  const at::Tensor features = f.model->vision()->encode(px).cpu();  // [1, 16, 64]
  EXPECT_LE(max_abs_diff(features, f.tensors.tensor("a_one_image.image_features")), 1e-5);
  const at::Tensor merged = f.model->embed(long_tensor(f.ref["cases"]["a_one_image"]["input_ids_expanded"])
                                               .to(test::test_device()), px).cpu();
  EXPECT_LE(max_abs_diff(merged, f.tensors.tensor("a_one_image.inputs_embeds_merged")), 1e-5);
}

TEST(GoldenLlava, LogitsMatchTransformersForOneImageTwoImagesAndAPaddedBatch) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  c10::InferenceMode guard;
  for (const char* name : {"a_one_image", "b_two_images", "c_batch_right_pad"}) {
    const Json& c = f.ref["cases"][name];
    const at::Tensor logits = f.logits(c);
    const at::Tensor expected = f.tensors.tensor(c["logits_key"].get<std::string>());
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const at::Tensor valid = long_tensor(c["final_attention_mask"]).to(at::kBool);  // [B, L]
    const double diff = max_abs_diff(logits.index({valid}), expected.index({valid}));
    std::cout << "[llava " << name << "] max |logit - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
  }
}

TEST(GoldenLlava, LossesMatchTransformers) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  c10::InferenceMode guard;
  for (const char* name : {"loss_single", "loss_batch"}) {
    const Json& lc = f.ref["cases"][name];
    const Json& c = f.ref["cases"][lc["same_inputs_and_logits_as"].get<std::string>()];
    const at::Tensor logits = f.logits(c);  // [B, L, V]
    // final_labels are unshifted (HF): position t predicts label t + 1; ours are shifted.
    const at::Tensor labels = long_tensor(lc["final_labels"]);
    const at::Tensor mask = long_tensor(c["final_attention_mask"]);
    at::Tensor shifted = at::full_like(labels, kIgnoreIndex);
    const int64_t L = labels.size(1);
    shifted.narrow(1, 0, L - 1).copy_(labels.narrow(1, 1, L - 1).masked_fill(mask.narrow(1, 1, L - 1) == 0, kIgnoreIndex));
    const int64_t targets = (shifted != kIgnoreIndex).sum().item<int64_t>();
    EXPECT_EQ(targets, lc["n_loss_targets"].get<int64_t>()) << name;
    const double loss = cross_entropy_sum(logits, shifted).item<double>() / static_cast<double>(targets);
    EXPECT_NEAR(loss, lc["loss"].get<double>(), kLossTol) << name;
  }
}

TEST(GoldenLlava, PaddedRowsWithDifferentImageCountsEqualEachRowAlone) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  c10::InferenceMode guard;
  // Row 0: two images (case b, 38 positions); row 1: one image (case a, 21 positions) right-padded to 38.
  const Json& a = f.ref["cases"]["a_one_image"];
  const Json& b = f.ref["cases"]["b_two_images"];
  const at::Tensor ids_b = long_tensor(b["input_ids_expanded"]), ids_a = long_tensor(a["input_ids_expanded"]);
  const int64_t L = ids_b.size(1), La = ids_a.size(1);
  at::Tensor ids = at::zeros({2, L}, at::kLong);
  ids[0].copy_(ids_b[0]);
  ids[1].narrow(0, 0, La).copy_(ids_a[0]);
  at::Tensor valid = at::ones({2, L}, at::kBool);
  valid[1].narrow(0, La, L - La).fill_(false);
  at::Tensor positions = at::arange(L, at::kLong).unsqueeze(0).repeat({2, 1});
  const at::Tensor px = at::cat({f.tensors.tensor("b_two_images.pixel_values"), f.tensors.tensor("a_one_image.pixel_values")});
  ForwardOptions o;
  o.pixel_values = px.to(test::test_device());
  o.key_valid = valid.to(test::test_device());
  o.position_ids = positions.to(test::test_device());
  const at::Tensor batch = f.model->forward(ids.to(test::test_device()), o).cpu();
  const at::Tensor alone_b = f.logits(b), alone_a = f.logits(a);
  EXPECT_LE(max_abs_diff(batch[0], alone_b[0]), 1e-5);
  EXPECT_LE(max_abs_diff(batch[1].narrow(0, 0, La), alone_a[0]), 1e-5);
  // And both against transformers' own single-row logits.
  EXPECT_LE(max_abs_diff(batch[1].narrow(0, 0, La), f.tensors.tensor("a_one_image.logits")[0]), kF32Tol);
}

TEST(GoldenLlava, GreedyGenerationWithAnImageEqualsTransformersGenerate) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  Generator gen(f.model, load_tokenizer(llava_dir() / "tiny-llava"));
  std::vector<int64_t> prompt;
  for (const auto& v : f.ref["cases"]["a_one_image"]["input_ids_expanded"][0]) prompt.push_back(v.get<int64_t>());
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.sampling.temperature = 0;  // greedy
  const auto out = gen.generate({prompt}, config, {}, {ImageInputs{f.tensors.tensor("a_one_image.pixel_values"), {}}});
  std::vector<int64_t> expected;
  for (const auto& v : f.ref["greedy_generate_a_one_image"]["new_ids"]) expected.push_back(v.get<int64_t>());
  EXPECT_EQ(out.at(0).new_ids, expected);
}

// The LoRA step's batch (case c_batch_right_pad with the loss_batch labels) as our shifted-label Batch.
Batch lora_step_batch(LlavaFixture& f) {
  const Json& c = f.ref["cases"]["c_batch_right_pad"];
  const Json& lc = f.ref["cases"]["loss_batch"];
  Batch batch;
  batch.input_ids = long_tensor(c["input_ids_expanded"]);
  const at::Tensor labels = long_tensor(lc["final_labels"]);
  const at::Tensor mask = long_tensor(c["final_attention_mask"]);
  const int64_t L = labels.size(1);
  batch.labels = at::full_like(labels, kIgnoreIndex);
  batch.labels.narrow(1, 0, L - 1).copy_(labels.narrow(1, 1, L - 1).masked_fill(mask.narrow(1, 1, L - 1) == 0, kIgnoreIndex));
  batch.key_valid = mask.to(at::kBool);
  batch.position_ids = long_tensor(c["position_ids"]);
  batch.pixel_values = f.tensors.tensor("c_batch_right_pad.pixel_values").clone();
  batch.label_tokens = (batch.labels != kIgnoreIndex).sum().item<int64_t>();
  batch.real_tokens = batch.key_valid.sum().item<int64_t>();
  return batch;
}

using test::adapter_rel_error;

TEST(GoldenLlava, PeftAdaptersWithTheProjectorReproducePeftLogits) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "lora_step.json");
  LlavaFixture f;
  const Checkpoint step = Checkpoint::open(llava_dir() / "lora_step.safetensors");
  const Json& a = f.ref["cases"]["a_one_image"];
  for (const char* name : {"init", "after1"}) {
    CausalLM model = load_causal_lm(llava_dir() / "tiny-llava");
    const LoraConfig c = load_adapter(model, llava_dir() / name);
    EXPECT_TRUE(c.target_modules_regex);
    EXPECT_EQ(c.modules_to_save, std::vector<std::string>{"multi_modal_projector"});
    // The regex puts LoRA on the 7 projections of both language-model layers, not on CLIP's q/k/v.
    int adapted = 0;
    for (const auto& m : model->named_modules("", false)) {
      if (const auto* l = m.value()->as<nn::Linear>(); l != nullptr && l->lora) {
        ++adapted;
        EXPECT_EQ(m.key().rfind("language_model.", 0), 0u) << m.key();
      }
    }
    EXPECT_EQ(adapted, 14);
    f.model = model;
    at::NoGradGuard no_grad;
    const at::Tensor logits = f.logits(a);
    const double diff = max_abs_diff(logits, step.tensor(fmt::format("{}.logits_a_one_image", name)));
    std::cout << "[llava peft " << name << "] max |logit - peft| = " << diff << std::endl;
    EXPECT_LE(diff, kF32Tol) << name;
  }
}

TEST(GoldenLlava, OneLoraStepWithTheProjectorMatchesPeft) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "lora_step.json");
  const Json ref = load_json_file(llava_dir() / "lora_step.json");
  LlavaFixture f;
  TrainConfig c;
  c.model = (llava_dir() / "tiny-llava").string();
  c.dataset = {"unused"};
  c.adapters = (llava_dir() / "init").string();
  c.learning_rate = 1e-3;
  c.adam_beta1 = 0.9;
  c.adam_beta2 = 0.999;
  c.adam_epsilon = 1e-8;
  c.weight_decay = 0.0;
  c.max_grad_norm = 0.0;
  c.lr_scheduler_type = "constant";
  Trainer trainer(c, load_causal_lm(llava_dir() / "tiny-llava"));
  // Trainable: the 28 LoRA tensors and the projector copy (4 tensors), 15,616 parameters; the tower is frozen.
  int64_t trainable = 0;
  for (const auto& t : trainer.trainables()) trainable += t.tensor.numel();
  EXPECT_EQ(trainer.trainables().size(), 32u);
  EXPECT_EQ(trainable, 15616);
  for (const auto& p : trainer.model()->named_parameters(true)) {
    if (p.key().rfind("vision_tower.", 0) == 0) {
      EXPECT_FALSE(p.value().requires_grad()) << p.key();
    }
  }
  const Batch batch = lora_step_batch(f);
  const StepResult r = trainer.step({batch}, 0, 1);
  EXPECT_NEAR(r.loss, ref["loss_before"].get<double>(), kLossTol);
  EXPECT_NEAR(r.grad_norm, ref["grad_l2_norm_total_step1"].get<double>(), 1e-4);
  const double err = adapter_rel_error(trainer.trainables(), llava_dir() / "after1");
  std::cout << "[llava lora step] worst relative adapter error " << err << std::endl;
  EXPECT_LT(err, 1e-5);  // the text trainer's tolerance (tests/golden/test_lora.cpp)
  // The loss after the step, from the trained model.
  const auto [sum, count] = trainer.evaluate({batch});
  EXPECT_NEAR(sum / static_cast<double>(count), ref["loss_after_step1"].get<double>(), kLossTol);
  // Saved as PEFT saves it: the projector under base_model.model.multi_modal_projector.*, no modules_to_save infix.
  const fs::path dir = test::temp_dir("llava_adapter_save");
  save_adapter(dir, trainer.model(), trainer.lora_config());
  const Checkpoint saved = Checkpoint::open(dir / "adapter_model.safetensors");
  const Checkpoint peft = Checkpoint::open(llava_dir() / "after1/adapter_model.safetensors");
  EXPECT_EQ(saved.names(), peft.names());
  EXPECT_TRUE(saved.contains("base_model.model.multi_modal_projector.linear_1.weight"));
  const Json cfg = load_json_file(dir / "adapter_config.json");
  EXPECT_EQ(cfg["modules_to_save"], Json({"multi_modal_projector"}));
  EXPECT_TRUE(cfg["target_modules"].is_string());
  // And it loads back into a fresh model with the same logits.
  CausalLM reloaded = load_causal_lm(llava_dir() / "tiny-llava");
  load_adapter(reloaded, dir);
  at::NoGradGuard no_grad;
  trainer.model()->eval();
  f.model = trainer.model();
  const at::Tensor a = f.logits(f.ref["cases"]["a_one_image"]);
  f.model = reloaded;
  EXPECT_LE(max_abs_diff(f.logits(f.ref["cases"]["a_one_image"]), a), 1e-6);
}

TEST(GoldenLlava, FreshLoraTargetsTheLanguageModelAndTrainsTheProjectorInFull) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/config.json");
  TrainConfig c;
  c.model = (llava_dir() / "tiny-llava").string();
  c.dataset = {"unused"};
  Trainer trainer(c, load_causal_lm(llava_dir() / "tiny-llava"));
  EXPECT_EQ(trainer.lora_config().modules_to_save, std::vector<std::string>{"multi_modal_projector"});
  int lora = 0, projector = 0;
  for (const auto& t : trainer.trainables()) {
    if (t.name.find("lora_") != std::string::npos) {
      ++lora;
      EXPECT_NE(t.name.find("language_model.model.layers."), std::string::npos) << t.name;
    } else {
      ++projector;
      EXPECT_EQ(t.name.rfind("base_model.model.multi_modal_projector.", 0), 0u) << t.name;
    }
  }
  EXPECT_EQ(lora, 28);
  EXPECT_EQ(projector, 4);
  // freeze_vit false: the tower trains in full too; freeze_aligner: the projector does not.
  c.freeze_vit = false;
  c.freeze_aligner = true;
  Trainer both(c, load_causal_lm(llava_dir() / "tiny-llava"));
  EXPECT_EQ(both.lora_config().modules_to_save, std::vector<std::string>{"vision_tower"});
  // Full fine-tuning with the default freezes: everything but the vision tower.
  c.train_type = "full";
  c.freeze_vit = true;
  c.freeze_aligner = false;
  Trainer full(c, load_causal_lm(llava_dir() / "tiny-llava"));
  for (const auto& t : full.trainables()) EXPECT_NE(t.name.rfind("vision_tower.", 0), 0u) << t.name;
  c.freeze_llm = true;
  c.freeze_aligner = true;
  test::expect_error<ConfigError>([&] { Trainer none(c, load_causal_lm(llava_dir() / "tiny-llava")); },
                                  {"leave nothing to train"});
}

TEST(GoldenLlava, TokensBeyondTheTokenizerDecodeToNothingInGeneration) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "tiny-llava/tokenizer_config.json");
  // tiny-llava: 512 sentencepiece pieces, <image> = 512 (an added special token), 520 embedding rows.
  const auto tokenizer = load_tokenizer(llava_dir() / "tiny-llava");
  EXPECT_TRUE(tokenizer->knows(511));
  EXPECT_TRUE(tokenizer->knows(512));
  EXPECT_FALSE(tokenizer->knows(517));
  EXPECT_EQ(tokenizer->decode({512, 403}), tokenizer->decode({403}));  // special: no text
  EXPECT_EQ(tokenizer->decode_with_special_tokens({512}), "<image>");
  // Greedy generation after coffee.jpg samples id 517 (an unused row) on its way: it has no text, and no error.
  LlavaFixture f;
  Generator gen(f.model, tokenizer);
  EncodeOptions enc;
  enc.images = make_image_encoding(llava_dir() / "tiny-llava", 512, 16);
  const SampleEncoder encoder(tokenizer, chat_template_for(*tokenizer, "llava"), enc);
  const EncodedPrompt p = encoder.encode_prompt({{"user", "<image>\nOnce upon a time", std::nullopt}},
                                                {assets() / "images/coffee.jpg"});
  GenerationConfig config;
  config.max_new_tokens = 6;
  config.sampling.temperature = 0;
  const auto out = gen.generate({std::vector<int64_t>(p.ids.begin(), p.ids.end())}, config, {},
                                {p.batched_images()});
  std::vector<int> known;
  for (int64_t id : out[0].new_ids) {
    if (id < 512) known.push_back(static_cast<int>(id));
  }
  EXPECT_NE(std::find(out[0].new_ids.begin(), out[0].new_ids.end(), 517), out[0].new_ids.end());
  EXPECT_EQ(out[0].text, tokenizer->decode(known));
}

TEST(GoldenLlava, ImageCountThatDoesNotFitTheImageTokensIsAModelError) {
  SWIFTCPP_REQUIRE_SHARED(llava_dir() / "llava_logits.json");
  LlavaFixture f;
  c10::InferenceMode guard;
  const at::Tensor ids = long_tensor(f.ref["cases"]["a_one_image"]["input_ids_expanded"]);
  ForwardOptions o;
  o.pixel_values = f.tensors.tensor("b_two_images.pixel_values");  // two images for one run
  test::expect_error<ModelError>([&] { f.model->forward(ids, o); }, {"16 image-token positions", "2 images"});
  // Without images (a decode step) image ids are looked up as row 0, as a text id would be: no count, no sync.
  const at::Tensor plain = f.model->forward(ids);
  const at::Tensor zeroed = f.model->forward(ids.masked_fill(ids == 512, 0));
  EXPECT_TRUE(at::equal(plain, zeroed));  // the same lookups and the same operations
}

}  // namespace
}  // namespace swiftcpp
