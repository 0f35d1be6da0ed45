// Weight-only quantisation in the GPTQ layout: bit packing, round-to-nearest error bounds, the layout's shapes and
// conventions, the tiled packed product and its gradient, GPTQ, QLoRA's adapters over a packed base, `swiftcpp
// quantize` end to end and loading packed checkpoints back.
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <fstream>
#include <regex>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/decoder/decoder.h"
#include "peft/lora.h"
#include "quant/gptq.h"
#include "quant/packed.h"
#include "tests/test_util.h"
#include "tests/tiny_model.h"

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
  at::manual_seed(0);
  for (int64_t bits : {4, 8}) {
    const at::Tensor v = at::randint(0, int64_t{1} << bits, {64, 24}, at::kInt);
    const at::Tensor p = pack_rows(v, bits);
    EXPECT_EQ(p.size(0), 64 * bits / 32);
    EXPECT_TRUE(at::equal(unpack_rows(p, bits), v)) << bits;
  }
}

TEST(QuantRtn, ErrorsStayWithinHalfAStepAndTheLayoutIsGptqs) {
  at::manual_seed(1);
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

// tr(D H D^T) with D = W - Wq: the output error GPTQ minimises, on inputs whose Gram matrix is H.
double output_error(const at::Tensor& w, const PackedWeight& p, const at::Tensor& H) {
  const at::Tensor d = (w - p.dequantize(at::kFloat)).to(at::kDouble);
  return (at::mm(d, H.to(at::kDouble)) * d).sum().item<double>();
}

TEST(QuantPackedLinear, TilesGiveTheDenseProductAndItsInputGradient) {
  at::manual_seed(2);
  const at::Tensor w = at::randn({1024, 4096}) * 0.05;
  const auto p = std::make_shared<const PackedWeight>(quantize_rtn(w, QuantSpec{4, 128, false}, "layer"));
  ASSERT_EQ(p->tile_rows(), 512);  // 2^21 weights a tile: this layer takes two
  const at::Tensor dense = p->dequantize(at::kFloat);  // [out, in]
  // Exact: dequantisation is elementwise ((q - zero) * scale), the same operations for a tile as for the whole.
  EXPECT_TRUE(at::equal(p->dequantize_rows(512, 512, at::kFloat), dense.narrow(0, 512, 512)));
  const at::Tensor bias = at::randn({1024});
  const at::Tensor x = at::randn({3, 5, 4096}).requires_grad_(true);
  const at::Tensor y = packed_linear(x, p, bias);
  const at::Tensor reference = at::linear(x.detach(), dense, bias);
  ASSERT_EQ(y.sizes(), reference.sizes());
  EXPECT_LT((y - reference).abs().max().item<double>(), 1e-4);
  const at::Tensor dy = at::randn_like(y);
  y.backward(dy);
  EXPECT_LT((x.grad() - at::matmul(dy, dense)).abs().max().item<double>(), 1e-4);
  // Up to 8 rows (decoding) take the kernel that reads the packed words directly, with groups of contiguous
  // inputs or, after act-order, scattered ones (any g_idx naming group_size inputs per group).
  PackedWeight scattered = *p;
  scattered.g_idx = p->g_idx.index_select(0, at::randperm(4096, at::kLong)).contiguous();
  const auto shuffled = std::make_shared<const PackedWeight>(scattered);
  const at::Tensor shuffled_dense = shuffled->dequantize(at::kFloat);
  EXPECT_FALSE(at::equal(shuffled_dense, dense));
  for (int64_t rows : {1, 4}) {
    const at::Tensor few = at::randn({rows, 1, 4096});
    EXPECT_LT((packed_linear(few, p, at::Tensor()) - at::linear(few, dense)).abs().max().item<double>(), 1e-4) << rows;
    EXPECT_LT((packed_linear(few, shuffled, bias) - at::linear(few, shuffled_dense, bias)).abs().max().item<double>(), 1e-4)
        << rows;
  }
}

TEST(QuantGptq, AnIdentityHessianGivesRoundToNearest) {
  // Uncorrelated inputs of equal energy: no error is worth moving, and GPTQ must reduce to RTN exactly.
  at::manual_seed(3);
  const at::Tensor w = at::randn({64, 128});
  for (const QuantSpec& spec : {QuantSpec{4, 32, true}, QuantSpec{4, 64, false}, QuantSpec{8, -1, true}}) {
    GptqOptions o;
    o.spec = spec;
    const PackedWeight g = gptq_quantize(w, at::eye(128) * 3.0, o, "layer");
    const PackedWeight r = quantize_rtn(w, spec, "layer");
    // Exact: the inverse Hessian's off-diagonal is exactly zero, so every error update subtracts zeros.
    EXPECT_TRUE(at::equal(g.qweight, r.qweight)) << spec.bits << " " << spec.group_size;
    EXPECT_TRUE(at::equal(g.qzeros, r.qzeros));
    EXPECT_TRUE(at::equal(g.scales, r.scales));
    EXPECT_TRUE(at::equal(g.g_idx, r.g_idx));
  }
}

TEST(QuantGptq, CorrelatedInputsLoseLessThanRoundToNearest) {
  at::manual_seed(4);
  const int64_t in = 256;
  // Inputs with correlated features of unequal energy, as transformer activations have.
  const at::Tensor mix = at::randn({in, in}) / std::sqrt(static_cast<double>(in)) + at::eye(in);
  at::Tensor X = at::matmul(at::randn({4096, in}), mix) * (at::rand({in}) * 3 + 0.1);  // [tokens, in]
  X.select(1, 7).zero_();  // an input that is always 0
  const at::Tensor H = at::mm(X.t(), X);
  const at::Tensor w = at::randn({96, in});
  for (const QuantSpec& spec : {QuantSpec{4, 32, true}, QuantSpec{4, 128, false}, QuantSpec{8, -1, true}}) {
    const double rtn = output_error(w, quantize_rtn(w, spec, "layer"), H);
    for (bool act_order : {false, true}) {
      GptqOptions o;
      o.spec = spec;
      o.act_order = act_order;
      o.block_size = 64;  // several blocks: the lazy update between blocks is exercised
      const PackedWeight g = gptq_quantize(w, H, o, "layer");
      const double gptq = output_error(w, g, H);
      EXPECT_LT(gptq, 0.75 * rtn) << spec.bits << "/" << spec.group_size << (act_order ? " act-order" : "");
      const at::Tensor wq = g.dequantize(at::kFloat);
      EXPECT_TRUE((wq.select(1, 7) == 0).all().item<bool>()) << "a dead input's column is quantised to 0";
      // Every group holds group_size columns (with act-order they are scattered, named by g_idx).
      const int64_t group = spec.group_size > 0 ? spec.group_size : in;
      const at::Tensor counts = at::bincount(g.g_idx.to(at::kLong));
      EXPECT_TRUE((counts == group).all().item<bool>());
      if (act_order && spec.group_size > 0) {
        EXPECT_FALSE(at::equal(g.g_idx, (at::arange(in, at::kLong) / group).to(at::kInt)));
      }
    }
  }
  test::expect_error<ConfigError>([&] { gptq_quantize(w, H, GptqOptions{QuantSpec{4, 48, true}}, "model.layers.3.mlp.up_proj"); },
                                  {"model.layers.3.mlp.up_proj", "group size 48 does not divide"});
}

TEST(QuantGptq, LayerByLayerOnAModelBeatsRoundToNearestOnHeldOutText) {
  CausalLM model = test::tiny_llama(64, 2, at::kFloat);
  model->eval();
  at::manual_seed(5);
  std::vector<std::vector<int64_t>> calibration;
  for (int i = 0; i < 16; ++i) {
    const at::Tensor ids = at::randint(0, 64, {24}, at::kLong);
    calibration.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 24);
  }
  const at::Tensor held_out = at::randint(0, 64, {4, 24}, at::kLong);
  at::Tensor reference;
  {
    at::NoGradGuard no_grad;
    reference = model->forward(held_out);
  }
  const QuantSpec spec{4, 8, false};
  CausalLM rtn = test::tiny_llama(64, 2, at::kFloat);
  attach_packed_weights(rtn, quantize_model_rtn(rtn, spec));
  GptqOptions o;
  o.spec = spec;
  std::vector<GptqLayerReport> report;
  int64_t calls = 0;
  auto packed = quantize_model_gptq(model, calibration, o, &report, [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, ++calls);
    EXPECT_EQ(total, 2);
  });
  EXPECT_EQ(packed.size(), 14u);  // 7 linear layers in each of 2 blocks
  EXPECT_EQ(report.size(), 14u);
  EXPECT_EQ(report[0].name, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(report.back().name, "model.layers.1.mlp.down_proj");
  attach_packed_weights(model, std::move(packed));
  EXPECT_TRUE(model->has_packed_weights());
  at::NoGradGuard no_grad;
  const double e_rtn = (rtn->forward(held_out) - reference).pow(2).mean().item<double>();
  const double e_gptq = (model->forward(held_out) - reference).pow(2).mean().item<double>();
  EXPECT_LT(e_gptq, 0.9 * e_rtn) << "GPTQ " << e_gptq << " RTN " << e_rtn;
  test::expect_error<ConfigError>([&] { quantize_model_gptq(rtn, {}, o); }, {"at least one calibration sample"});
}

TEST(QuantQlora, AdaptersOverAPackedBaseTrainAsOverItsDequantisedWeights) {
  // QLoRA's forward and every adapter gradient equal plain LoRA's on a float model holding the dequantised weights.
  CausalLM packed = test::tiny_llama(64, 2, at::kFloat), dense = test::tiny_llama(64, 2, at::kFloat);
  auto weights = quantize_model_rtn(packed, QuantSpec{4, 8, false});
  {
    at::NoGradGuard no_grad;
    for (const auto& item : dense->named_modules("", false)) {
      const auto it = weights.find(item.key());
      if (it != weights.end()) item.value()->as<nn::Linear>()->weight.set_data(it->second.dequantize(at::kFloat));
    }
  }
  attach_packed_weights(packed, std::move(weights));
  LoraConfig lora;
  lora.r = 4;
  lora.lora_alpha = 8;
  for (CausalLM* m : {&packed, &dense}) {
    inject_lora(*m, lora, 11);
    (*m)->train();
  }
  // B starts at zero: give it values so that the gradient of A is not trivially zero.
  const auto tp = adapter_tensors(packed, lora), td = adapter_tensors(dense, lora);
  ASSERT_EQ(tp.size(), td.size());
  at::manual_seed(6);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < tp.size(); ++i) {
      const at::Tensor v = at::randn_like(tp[i].tensor) * 0.1;
      tp[i].tensor.copy_(v);
      td[i].tensor.copy_(v);
    }
  }
  const at::Tensor ids = at::randint(0, 64, {2, 12}, at::kLong);
  const at::Tensor lp = packed->forward(ids), ld = dense->forward(ids);
  EXPECT_LT((lp - ld).abs().max().item<double>(), 1e-5);
  lp.pow(2).mean().backward();
  ld.pow(2).mean().backward();
  for (size_t i = 0; i < tp.size(); ++i) {
    ASSERT_TRUE(tp[i].tensor.grad().defined()) << tp[i].name;
    EXPECT_LT((tp[i].tensor.grad() - td[i].tensor.grad()).abs().max().item<double>(), 1e-5) << tp[i].name;
  }
  // The packed base stays frozen and holds no float weight.
  auto* q = packed->model->layers[0]->as<DecoderLayer>()->self_attn->q_proj.get();
  EXPECT_EQ(q->weight.numel(), 0);
  EXPECT_FALSE(q->weight.requires_grad());
  test::expect_error<ConfigError>([&] { merge_lora(packed); }, {"merge it onto the float base"});
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

TEST(QuantCli, QloraTrainsOnAPackedBaseAndItsAdapterMergesOntoTheFloatBase) {
  const fs::path ff192 = test::assets() / "reference/stories260K-ff192";
  SWIFTCPP_REQUIRE_SHARED(ff192);
  const fs::path dir = test::temp_dir("quant_qlora");
  const std::string data = (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string();
  const auto train = [&](const std::string& name, const std::string& model, const std::string& extra) {
    return test::run_cli(fmt::format(
        "--threads 1 train model={} dataset={}#32 output_dir={} template=default max_length=96 "
        "truncation_strategy=right per_device_train_batch_size=2 max_steps=6 save_steps=6 logging_steps=1 "
        "lora_rank=4 lora_alpha=8 lora_dropout=0 learning_rate=3e-3 warmup_steps=1 seed=7 {}",
        model, data, (dir / name).string(), extra));
  };
  const auto r = train("q4", ff192.string(), "quant_bits=4 quant_group_size=32");
  ASSERT_EQ(r.code, 0) << r.out;
  fs::path run;
  for (const auto& e : fs::directory_iterator(dir / "q4")) run = e.path();
  std::vector<double> losses;
  std::ifstream log(run / "logging.jsonl");
  for (std::string line; std::getline(log, line);) {
    const Json j = Json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
  // The adapter is a plain PEFT adapter: it applies to, and merges onto, the float base.
  const fs::path adapter = run / "checkpoint-6";
  ASSERT_TRUE(fs::exists(adapter / "adapter_model.safetensors"));
  const auto merged = test::run_cli(fmt::format("export --model {} --adapters {} --merge-lora --output {}",
                                                ff192.string(), adapter.string(), (dir / "merged").string()));
  ASSERT_EQ(merged.code, 0) << merged.out;
  const auto gen = test::run_cli(fmt::format("--threads 1 infer --model {} --adapters {} --prompt Lily "
                                             "--max-new-tokens 4 --temperature 0", ff192.string(), adapter.string()));
  EXPECT_EQ(gen.code, 0) << gen.out;
  // Refused: full fine-tuning of packed weights; a base whose widths do not fit the groups (stories260K's 172).
  const auto full = train("full", ff192.string(), "quant_bits=4 train_type=full");
  EXPECT_EQ(full.code, 2) << full.out;
  EXPECT_NE(full.out.find("'quant_bits' (QLoRA) needs train_type lora"), std::string::npos) << full.out;
  const auto misfit = train("misfit", test::stories_dir().string(), "quant_bits=4 quant_group_size=32");
  EXPECT_EQ(misfit.code, 2) << misfit.out;
  EXPECT_NE(misfit.out.find("does not divide its 172 input columns"), std::string::npos) << misfit.out;
}

TEST(QuantCli, GptqCalibratesOnADatasetAndLosesLessPerplexityThanRtn) {
  const fs::path ff192 = test::assets() / "reference/stories260K-ff192";
  SWIFTCPP_REQUIRE_SHARED(ff192);
  const fs::path text = test::assets() / "data/eval/perplexity_text.txt";
  const fs::path dir = test::temp_dir("quant_gptq");
  const std::string calib = (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string();
  const auto g = test::run_cli(fmt::format("--threads 1 quantize --model {} --method gptq --bits 4 --group-size 32 "
                                           "--calib-dataset {} --calib-samples 64 --act-order --output {}",
                                           ff192.string(), calib, (dir / "gptq").string()));
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_NE(g.out.find("GPTQ on 64 samples"), std::string::npos) << g.out;
  const Json config = load_json_file(dir / "gptq/config.json");
  EXPECT_EQ(config["quantization_config"]["desc_act"], true);
  EXPECT_EQ(config["quantization_config"]["damp_percent"], 0.01);
  const auto r = test::run_cli(fmt::format("--threads 1 quantize --model {} --bits 4 --group-size 32 --output {}",
                                           ff192.string(), (dir / "rtn").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto perplexity = [&](const fs::path& model) {
    const fs::path requests = dir / ("requests_" + model.filename().string() + ".jsonl");
    const auto e = test::run_cli(fmt::format("--threads 1 eval --model {} --tasks perplexity --data-dir {} --output-dir {} "
                                             "--dump-requests {}", model.string(), text.parent_path().string(),
                                             (dir / ("eval_" + model.filename().string())).string(), requests.string()));
    EXPECT_EQ(e.code, 0) << e.out;
    EXPECT_NE(e.out.find("[peak memory: "), std::string::npos) << e.out;
    // The windows are dumped (bench/llama_cpp_perplexity.mjs scores the same ones in llama.cpp): disjoint
    // targets of up to 512 tokens, each window's input at most the model's 512 positions.
    std::ifstream in(requests);
    int64_t predicted = 0, windows = 0;
    for (std::string line; std::getline(in, line); ++windows) {
      const Json w = Json::parse(line);
      EXPECT_EQ(w["task"], "perplexity");
      const size_t n = w["continuations"][0].size();
      predicted += static_cast<int64_t>(n);
      EXPECT_LE(w["context"].size() + n - 1, 512u);
    }
    EXPECT_GT(windows, 1);
    EXPECT_GT(predicted, 511 * (windows - 1));
    std::smatch m;
    EXPECT_TRUE(std::regex_search(e.out, m, std::regex("token_perplexity[^0-9]*([0-9.]+)"))) << e.out;
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double pf = perplexity(ff192), pr = perplexity(dir / "rtn"), pg = perplexity(dir / "gptq");
  EXPECT_GT(pr, pf);
  EXPECT_LT(pg - pf, pr - pf) << "float " << pf << " RTN " << pr << " GPTQ " << pg;
  // Bad input: too few calibration samples, no calibration data; nothing is left behind.
  const auto few = test::run_cli(fmt::format("quantize --model {} --method gptq --calib-dataset {}#10 --calib-samples 64 "
                                             "--group-size 32 --output {}", ff192.string(), calib, (dir / "few").string()));
  EXPECT_EQ(few.code, 2) << few.out;
  EXPECT_NE(few.out.find("gives 10 usable samples; --calib-samples asks for 64"), std::string::npos) << few.out;
  const auto none = test::run_cli(fmt::format("quantize --model {} --method gptq --output {}", ff192.string(),
                                              (dir / "none").string()));
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("--method gptq needs --calib-dataset"), std::string::npos) << none.out;
  EXPECT_FALSE(fs::exists(dir / "few"));
  EXPECT_FALSE(fs::exists(dir / "none"));
}

}  // namespace
}  // namespace swiftcpp
