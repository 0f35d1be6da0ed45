// Weight-only quantisation in the GPTQ layout: bit packing, round-to-nearest error bounds, the layout's shapes and
// conventions, `swiftcpp quantize` end to end and loading packed checkpoints back.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "quant/packed.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

TEST(QuantPacking, RowsPackLowBitsFirstAndRoundTrip) {
  // One column holding 0..7: eight 4-bit values in one int32, the first in the lowest nibble.
  const at::Tensor column = at::arange(8, at::kInt).unsqueeze(1);
  const at::Tensor packed = pack_rows(column, 4);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(packed.item<int32_t>(), 0x76543210);
  // The top nibble set: the int32 is negative and still unpacks.
  const at::Tensor high = at::full({8, 3}, 15, at::kInt);
  EXPECT_EQ(pack_rows(high, 4)[0][0].item<int32_t>(), -1);
  EXPECT_TRUE(at::equal(unpack_rows(pack_rows(high, 4), 4), high));
  torch::manual_seed(0);
  for (int64_t bits : {4, 8}) {
    const at::Tensor v = at::randint(0, int64_t{1} << bits, {64, 24}, at::kInt);
    const at::Tensor p = pack_rows(v, bits);
    EXPECT_EQ(p.size(0), 64 * bits / 32);
    EXPECT_TRUE(at::equal(unpack_rows(p, bits), v)) << bits;
  }
}

TEST(QuantRtn, ErrorsStayWithinHalfAStepAndTheLayoutIsGptqs) {
  torch::manual_seed(1);
  const at::Tensor w = at::randn({64, 128});
  QuantSpec spec;
  spec.bits = 4;
  spec.group_size = 32;
  const PackedWeight p = quantize_rtn(w, spec, "layer");
  EXPECT_EQ(p.qweight.sizes(), (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(p.qzeros.sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(p.scales.sizes(), (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(p.scales.scalar_type(), at::kHalf);
  EXPECT_EQ(p.g_idx.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(p.g_idx, (at::arange(128, at::kLong) / 32).to(at::kInt)));
  // Symmetric 4-bit: zero point 8, stored as 8 - 1 = 7 in every nibble.
  EXPECT_TRUE((p.qzeros == 0x77777777).all().item<bool>());
  // Half a step, plus a little at the clamped ends: the scale is stored as float16, so the extreme weight can sit a
  // few 2^-11 beyond the last level.
  const at::Tensor step = p.scales.to(at::kFloat).index_select(0, p.g_idx.to(at::kLong)).t();  // [out, in]
  EXPECT_TRUE(((p.dequantize(at::kFloat) - w).abs() <= step * 0.51 + 1e-6).all().item<bool>());
  // Asymmetric and 8-bit per output channel.
  spec.sym = false;
  const PackedWeight a = quantize_rtn(w, spec, "layer");
  const at::Tensor astep = a.scales.to(at::kFloat).index_select(0, a.g_idx.to(at::kLong)).t();
  EXPECT_TRUE(((a.dequantize(at::kFloat) - w).abs() <= astep * 0.51 + 1e-6).all().item<bool>());
  spec = QuantSpec{8, -1, true};
  const PackedWeight e = quantize_rtn(w, spec, "layer");
  EXPECT_EQ(e.scales.size(0), 1);
  EXPECT_LT((e.dequantize(at::kFloat) - w).abs().max().item<double>(), w.abs().max().item<double>() / 127 * 0.51);
  test::expect_error<ConfigError>([&] { quantize_rtn(w, QuantSpec{4, 48, true}, "model.layers.0.mlp.up_proj"); },
                                  {"model.layers.0.mlp.up_proj", "group size 48", "128"});
  test::expect_error<ConfigError>([&] { quantize_rtn(w, QuantSpec{3, 32, true}, "x"); }, {"bits must be 4 or 8"});
}

TEST(QuantCli, QuantizedCheckpointsLoadPackedAndStayClose) {
  const fs::path ff192 = test::assets() / "reference/stories260K-ff192";
  SWIFTCPP_REQUIRE_SHARED(ff192);
  const fs::path dir = test::temp_dir("quant_cli");
  const auto r = test::run_cli(fmt::format("quantize --model {} --bits 4 --group-size 32 --output {}", ff192.string(),
                                           (dir / "q4").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("35 linear layers as int4"), std::string::npos) << r.out;
  const Json config = load_json_file(dir / "q4/config.json");
  EXPECT_EQ(config["quantization_config"]["quant_method"], "gptq");
  EXPECT_EQ(config["quantization_config"]["bits"], 4);
  EXPECT_EQ(config["quantization_config"]["group_size"], 32);
  const auto file = SafetensorsFile::open(dir / "q4/model.safetensors");
  EXPECT_EQ(file->tensor("model.layers.0.mlp.down_proj.qweight").sizes(), (std::vector<int64_t>{24, 64}));
  EXPECT_EQ(file->tensor("model.layers.0.mlp.down_proj.scales").sizes(), (std::vector<int64_t>{6, 64}));
  EXPECT_THROW(file->tensor("model.layers.0.mlp.down_proj.weight"), Error);
  // Loaded back: packed layers (no float weight), logits near the float model's, the same greedy tokens mostly.
  CausalLM f = load_causal_lm(ff192);
  CausalLM q = load_causal_lm(dir / "q4");
  auto* down = q->model->layers[0]->as<DecoderLayer>()->mlp->down_proj.get();
  ASSERT_NE(down->packed, nullptr);
  EXPECT_EQ(down->weight.numel(), 0);
  const at::Tensor ids = at::tensor({1, 403, 407, 261, 378, 506, 91, 12}, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  const at::Tensor a = f->forward(ids), b = q->forward(ids);
  EXPECT_LT((a - b).abs().max().item<double>(), 0.25 * a.abs().max().item<double>());
  EXPECT_GT(at::cosine_similarity(a.flatten(), b.flatten(), 0).item<double>(), 0.98);
  // infer runs it.
  const auto gen = test::run_cli(fmt::format("--threads 1 infer --model {} --prompt \"Lily\" --temperature 0 "
                                             "--max-new-tokens 8", (dir / "q4").string()));
  EXPECT_EQ(gen.code, 0) << gen.out;
  // Bad input: an existing output, a group size that does not divide a layer (no output left behind).
  const auto again = test::run_cli(fmt::format("quantize --model {} --output {}", ff192.string(), (dir / "q4").string()));
  EXPECT_EQ(again.code, 2) << again.out;
  const auto bad = test::run_cli(fmt::format("quantize --model {} --group-size 48 --output {}", ff192.string(),
                                             (dir / "bad").string()));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("group size 48 does not divide"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos);
}

TEST(QuantCli, MisshapedPackedTensorsAreModelErrors) {
  const fs::path dir = test::temp_dir("quant_bad");
  const auto r = test::run_cli(fmt::format("quantize --model {} --bits 8 --group-size -1 --output {}",
                                           test::stories_dir().string(), (dir / "q8").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  CausalLM q = load_causal_lm(dir / "q8");  // stories260K: 8-bit per channel fits every layer
  // Rewrite one layer's scales with the wrong group count.
  const auto file = SafetensorsFile::open(dir / "q8/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& info : file->tensors()) {
    at::Tensor t = file->tensor(info.name).clone();
    if (info.name == "model.layers.1.self_attn.q_proj.scales") t = at::cat({t, t});
    tensors.emplace_back(info.name, t);
  }
  save_safetensors(dir / "q8/model.safetensors", tensors, {{"format", "pt"}});
  test::expect_error<ModelError>([&] { load_causal_lm(dir / "q8"); },
                                 {"model.layers.1.self_attn.q_proj", "expected 4 or 8 bits"});
}

}  // namespace
}  // namespace swiftcpp
