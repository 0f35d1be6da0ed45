// Golden tests: Qwen2-VL (transformers 4.46) and Qwen2.5-VL (4.49) on their tiny reference checkpoints
// (../shared/assets/reference/qwen2_vl, qwen2_5_vl): the vision tower and merger, M-RoPE position ids, logits of one
// image, two images of different sizes, a padded batch with different image counts per row, the loss case, and
// greedy generation with the KV cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/collate.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::assets;

// float32 against transformers' float32 reference (netlib BLAS; the README measures OpenBLAS at 3.3e-6 on
// |logits| <= 3.7); losses are means over 30 targets.
constexpr double kLogitTol = 1e-4;
constexpr double kVisionTol = 1e-5;
constexpr double kLossTol = 1e-5;

struct Version {
  const char* name;     // reference folder
  const char* model;    // checkpoint folder inside it
  const char* type;     // model_type
  int64_t parameters;   // model_summary
};

const Version kVersions[] = {
    {"qwen2_vl", "tiny-qwen2-vl", "qwen2_vl", 311680},
    {"qwen2_5_vl", "tiny-qwen2.5-vl", "qwen2_5_vl", 310560},
};

fs::path ref_dir(const Version& v) { return assets() / "reference" / v.name; }

at::Tensor long_tensor(const Json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) for (const auto& x : row) flat.push_back(x.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

at::Tensor long_tensor3(const Json& a) {
  std::vector<at::Tensor> planes;
  for (const auto& plane : a) planes.push_back(long_tensor(plane));
  return at::stack(planes);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct QwenFixture {
  const Version& v;
  Json ref;
  Checkpoint tensors;
  CausalLM model;
  explicit QwenFixture(const Version& version)
      : v(version),
        ref(load_json_file(ref_dir(version) / "logits.json")),
        tensors(Checkpoint::open(ref_dir(version) / "logits.safetensors")),
        model(load_causal_lm(ref_dir(version) / version.model, {test::test_device(), at::kFloat})) {}

  ForwardOptions options(const Json& c) {
    ForwardOptions o;
    o.pixel_values = tensors.tensor(c["pixel_values_key"].get<std::string>()).to(test::test_device());
    o.image_grid_thw = long_tensor(c["image_grid_thw"]);
    o.key_valid = long_tensor(c["attention_mask"]).to(at::kBool).to(test::test_device());
    return o;
  }
};

class GoldenQwen2VL : public ::testing::TestWithParam<Version> {};

TEST_P(GoldenQwen2VL, ConfigAndParameterNames) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / v.model / "config.json");
  const DecoderConfig c = load_decoder_config(ref_dir(v) / v.model);
  EXPECT_EQ(c.model_type, v.type);
  ASSERT_TRUE(c.multimodal);
  EXPECT_EQ(c.multimodal->image_token_index, 1012);
  EXPECT_EQ(c.multimodal->vision_start_token_id, 1009);
  EXPECT_EQ(c.multimodal->image_seq_length, 0);  // the processor says, per image
  EXPECT_EQ(c.rope_scaling.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  CausalLM model(c);
  int64_t n = 0;
  for (const auto& p : model->named_parameters(true)) n += p.value().numel();
  EXPECT_EQ(n, v.parameters);
  // DecoderConfig::parameter_count counts the language model's weights with its biases aside: 2 layers of q/k/v
  // biases (64 + 32 + 32) are the difference.
  EXPECT_EQ(c.parameter_count(), v.parameters - 2 * (64 + 32 + 32));
  EXPECT_EQ(model->language_model_prefix(), "");
  EXPECT_TRUE(model->in_language_model("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(model->in_language_model("lm_head"));
  EXPECT_FALSE(model->in_language_model("visual.blocks.0.mlp.fc1"));
  EXPECT_FALSE(model->in_language_model("visual.merger.mlp.0"));
}

TEST_P(GoldenQwen2VL, PositionIdsAndRopeDeltasEqualTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  const Json ref = load_json_file(ref_dir(v) / "logits.json");
  for (const auto& [name, c] : ref["cases"].items()) {
    const at::Tensor mask = long_tensor(c["attention_mask"]).to(at::kBool);
    const auto [positions, deltas] =
        mrope_positions(long_tensor(c["input_ids"]), long_tensor(c["image_grid_thw"]), mask, {}, 1012, 2);
    EXPECT_TRUE(positions.equal(long_tensor3(c["position_ids"]))) << name;
    EXPECT_EQ(deltas, c["rope_deltas"].get<std::vector<int64_t>>()) << name;
  }
  // Counts that do not fit are refused, naming what is wrong.
  const Json& a = ref["cases"]["a_one_image"];
  EXPECT_THROW(mrope_positions(long_tensor(a["input_ids"]), at::tensor({1, 6, 6}, at::kLong).view({1, 3}), {}, {},
                               1012, 2), ModelError);
  EXPECT_THROW(mrope_positions(long_tensor(a["input_ids"]), {}, {}, {}, 1012, 2), ModelError);
}

TEST_P(GoldenQwen2VL, VisionTowerAndMergerMatchTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  for (const char* name : {"a_one_image", "b_two_images", "d_loss_batch"}) {
    const Json& c = f.ref["cases"][name];
    const ForwardOptions o = f.options(c);
    const at::Tensor out = f.model->vision()->encode(o.pixel_values, o.image_grid_thw).cpu();
    const double diff = max_abs_diff(out, f.tensors.tensor(std::string(name) + ".vision_output"));
    std::cout << "[" << v.name << " " << name << "] max |vision output - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kVisionTol) << name;
    const at::Tensor merged = f.model->embed(long_tensor(c["input_ids"]).to(test::test_device()), o.pixel_values, {},
                                             o.image_grid_thw).cpu();
    EXPECT_LE(max_abs_diff(merged, f.tensors.tensor(std::string(name) + ".inputs_embeds")), kVisionTol) << name;
  }
}

TEST_P(GoldenQwen2VL, LogitsMatchTransformersWithPositionsComputedByTheModel) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  c10::InferenceMode guard;
  for (const auto& [name, c] : f.ref["cases"].items()) {
    // No position_ids passed: the decoder computes the M-RoPE positions from the ids and grids itself.
    const at::Tensor logits = f.model->forward(long_tensor(c["input_ids"]).to(test::test_device()), f.options(c)).cpu();
    const at::Tensor expected = f.tensors.tensor(c["logits_key"].get<std::string>());
    ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
    const at::Tensor valid = long_tensor(c["attention_mask"]).to(at::kBool);
    const double diff = max_abs_diff(logits.index({valid}), expected.index({valid}));
    std::cout << "[" << v.name << " " << name << "] max |logit - HF| = " << diff << std::endl;
    EXPECT_LE(diff, kLogitTol) << name;
    // The argmax at every valid position equals transformers'.
    const at::Tensor argmax = logits.argmax(-1);
    EXPECT_TRUE(argmax.index({valid}).equal(long_tensor(c["argmax"]).index({valid}))) << name;
    if (c.contains("loss")) {
      const at::Tensor labels = long_tensor(c["labels"]);
      const at::Tensor shifted = labels.narrow(1, 1, labels.size(1) - 1);
      const at::Tensor l = logits.narrow(1, 0, logits.size(1) - 1);
      const double loss = (cross_entropy_sum(l, shifted) / (shifted != kIgnoreIndex).sum()).item<double>();
      std::cout << "[" << v.name << " " << name << "] loss " << loss << " (HF " << c["loss"].get<double>() << ")"
                << std::endl;
      EXPECT_NEAR(loss, c["loss"].get<double>(), kLossTol);
    }
  }
}

TEST_P(GoldenQwen2VL, GreedyGenerationWithTheCacheEqualsTransformers) {
  const Version& v = GetParam();
  SWIFTCPP_REQUIRE_SHARED(ref_dir(v) / "logits.json");
  QwenFixture f(v);
  const Json& c = f.ref["cases"]["a_one_image"];
  const std::vector<int64_t> prompt = c["input_ids"][0].get<std::vector<int64_t>>();
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.sampling.temperature = 0;  // greedy
  Generator gen(f.model, load_tokenizer(ref_dir(v) / v.model));
  const ForwardOptions o = f.options(c);
  const auto out = gen.generate({prompt}, config, {}, {ImageInputs{o.pixel_values, o.image_grid_thw}});
  const std::vector<int64_t> expected = f.ref["greedy_generate_a_one_image"]["generate_new_ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(out[0].new_ids, expected);
}

INSTANTIATE_TEST_SUITE_P(Versions, GoldenQwen2VL, ::testing::ValuesIn(kVersions),
                         [](const ::testing::TestParamInfo<Version>& info) {
                           return std::string(info.param.type);
                         });

}  // namespace
}  // namespace swiftcpp
