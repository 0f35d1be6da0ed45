// The CPU decode kernels (lib/nn/kernels.h) against plain LibTorch products, in every variant this machine runs,
// at shapes that do not divide the vector width or the 32-column block; the integer layouts they read (GPTQ and GGUF
// converted without rounding); and the models that use them giving the logits of the float paths.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <ATen/ATen.h>

#include <array>
#include <limits>

#include "core/memory.h"
#include "core/parallel.h"
#include "io/gguf.h"
#include "models/decoder/decoder.h"
#include "nn/attention.h"
#include "nn/gemm.h"
#include "nn/kernels.h"
#include "nn/layers.h"
#include "quant/gguf_model.h"
#include "quant/gptq.h"
#include "quant/packed.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

// Every variant up to the machine's best, restored afterwards.
std::vector<kernels::Isa> variants() {
  std::vector<kernels::Isa> out{kernels::Isa::kGeneric};
  if (kernels::detected_isa() >= kernels::Isa::kAvx2) out.push_back(kernels::Isa::kAvx2);
  if (kernels::detected_isa() >= kernels::Isa::kAvx512) out.push_back(kernels::Isa::kAvx512);
  if (kernels::detected_isa() >= kernels::Isa::kAvx512Vnni) out.push_back(kernels::Isa::kAvx512Vnni);
  return out;
}

// x [M, in] as the VNNI variant sees it: per block of 32 (zero-padded), d = max|x| / 127 and xq = round(x * (1 / d))
// half away from zero, both in float32 as llama.cpp computes them -> d * xq as float64 [M, in].
at::Tensor int8_activations(const at::Tensor& x) {
  const int64_t M = x.size(0), in = x.size(1), blocks = (in + 31) / 32;
  const at::Tensor padded = at::constant_pad_nd(x, {0, blocks * 32 - in}).view({M, blocks, 32});
  const at::Tensor d = padded.abs().amax(-1, /*keepdim=*/true) / 127.0f;           // [M, blocks, 1] float32
  const at::Tensor inv = at::where(d > 0, 1.0f / d, at::zeros_like(d));
  const at::Tensor v = padded * inv;
  const at::Tensor xq = v.sign() * (v.abs() + 0.5f).floor();
  return (xq.to(at::kDouble) * d.to(at::kDouble)).view({M, blocks * 32}).narrow(1, 0, in);
}
struct IsaScope {
  ~IsaScope() { kernels::set_isa(kernels::detected_isa()); }
};

// (rows, cols): one element, below one vector, odd sizes across a block edge, whole blocks, a 513-column tail.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1}, {7, 5}, {33, 31}, {64, 64}, {130, 100}, {257, 513}};
// Input rows: one decode step, a few, the kernel's 8-row pass, and 8 + 3 (two passes).
const std::vector<int64_t> kRows = {1, 3, 8, 11};

// Largest |a - b| relative to the largest |b| (at least 1).
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

TEST(Kernels, Float32AndBfloat16RowsMatchLibTorchInEveryVariant) {
  IsaScope restore;
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  for (const kernels::Isa isa : variants()) {
    kernels::set_isa(isa);
    for (const auto& [out, in] : kShapes) {
      const at::Tensor w = at::randn({out, in});
      const at::Tensor bias = at::randn({out});
      for (const int64_t m : kRows) {
        const at::Tensor x = at::randn({m, in});
        // float32: summation order differs from BLAS; 1e-5 of the output scale.
        const at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), bias.to(at::kDouble));
        EXPECT_LT(rel_err(nn::dense_linear(x, w, bias), ref), 1e-5) << kernels::isa_name(isa) << " " << out << "x" << in << " m " << m;
        // bfloat16 weights and inputs: products exact in float32, float32 sums, output rounded to bfloat16 once.
        const at::Tensor wb = w.to(at::kBFloat16), xb = x.to(at::kBFloat16);
        const at::Tensor refb = at::linear(xb.to(at::kDouble), wb.to(at::kDouble));
        const at::Tensor got = nn::dense_linear(xb, wb, at::Tensor());
        EXPECT_EQ(got.scalar_type(), at::kBFloat16);
        EXPECT_LT(rel_err(got, refb), 8e-3) << kernels::isa_name(isa) << " bf16 " << out << "x" << in << " m " << m;
        EXPECT_LT(rel_err(got, refb.to(at::kBFloat16)), 8e-3);
      }
    }
  }
}

TEST(Kernels, SoftmaxRowsMatchTheFormulaInEveryVariantMaskedAndNot) {
  IsaScope restore;
  at::manual_seed(5);
  const float scale = 0.125f;
  // Widths around every lane count (tails of 1..15), a row with one visible key, a row of scores far apart (e^x
  // underflows to 0 for most keys) and a row with no visible key.
  for (const kernels::Isa isa : variants()) {
    kernels::set_isa(isa);
    for (const int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 33, 146}) {
      for (int kind = 0; kind < 4; ++kind) {
        at::Tensor raw = at::randn({n}) * (kind == 3 ? 400.0 : 8.0);
        at::Tensor mask = at::rand({n}) < 0.6;
        if (kind == 1) mask.fill_(true);
        if (kind == 2) {
          mask.fill_(false);
          mask[n - 1] = true;
        }
        const at::Tensor m64 = mask.to(at::kDouble);
        const at::Tensor s64 = raw.to(at::kDouble) * static_cast<double>(scale);
        const at::Tensor masked = s64.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
        const bool any = mask.any().item<bool>();
        at::Tensor s = raw.clone();
        const float lse = kernels::softmax_row(s.data_ptr<float>(), n, scale, mask.data_ptr<bool>());
        const std::string where = std::string(kernels::isa_name(isa)) + " n " + std::to_string(n) + " kind " +
                                  std::to_string(kind);
        if (!any) {
          EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << where;
          EXPECT_EQ(s.abs().max().item<float>(), 0.0f) << where;
          continue;
        }
        const at::Tensor ref_lse = at::logsumexp(masked, {0});
        const at::Tensor ref = at::softmax(masked, 0);
        EXPECT_NEAR(lse, ref_lse.item<double>(), 1e-5 * std::max(1.0, std::abs(ref_lse.item<double>()))) << where;
        EXPECT_LT((s.to(at::kDouble) - ref).abs().max().item<double>(), 2e-7) << where;
        EXPECT_EQ((s * (1 - mask.to(at::kFloat))).abs().max().item<float>(), 0.0f) << where;  // masked keys: 0
        // Without a mask every key counts.
        at::Tensor all = raw.clone();
        kernels::softmax_row(all.data_ptr<float>(), n, scale, nullptr);
        EXPECT_LT((all.to(at::kDouble) - at::softmax(s64, 0)).abs().max().item<double>(), 2e-7) << where;
        // Backward: p recomputed from the log-sum-exp, ds = scale * p * (dp - delta).
        at::Tensor p = raw.clone(), dp = at::randn({n});
        const float delta = 0.3f;
        const at::Tensor dp64 = dp.to(at::kDouble);
        kernels::softmax_backward_row(p.data_ptr<float>(), dp.data_ptr<float>(), n, scale, mask.data_ptr<bool>(), lse,
                                      delta);
        // e^(x - lse) in float32 carries the rounding of x - lse: about |x - lse| ulps, up to ~100 in kind 3.
        const double tol = kind == 3 ? 6e-6 : 2e-7;
        EXPECT_LT((p.to(at::kDouble) - ref).abs().max().item<double>(), tol) << where;
        const at::Tensor ds_ref = ref * (dp64 - delta) * static_cast<double>(scale) * m64;
        EXPECT_LT((dp.to(at::kDouble) - ds_ref).abs().max().item<double>(), 5 * tol) << where;
      }
    }
  }
}

TEST(Kernels, QuantisedBlocksMatchTheirDequantisedProductInEveryVariant) {
  IsaScope restore;
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  for (const int bits : {8, 4}) {
    for (const auto& [out, in] : kShapes) {
      const int64_t blocks = (in + 31) / 32;
      const at::Tensor q = at::randint(0, int64_t{1} << bits, {out, in}, at::kInt);
      const at::Tensor scales = at::rand({out, blocks}) * 0.1 + 0.01;
      const at::Tensor zeros = at::randint(0, int64_t{1} << bits, {out, blocks}, at::kInt);
      // The reference weight from the formula, column by column (independent of the kernels' layout).
      const at::Tensor group = at::div(at::arange(in, at::kLong), 32, "floor");
      const at::Tensor w = scales.index_select(1, group).to(at::kDouble) *
                           (q.to(at::kDouble) - zeros.index_select(1, group).to(at::kDouble));  // [out, in]
      const nn::QuantBlocks b = nn::QuantBlocks::from_values(q, scales, zeros, bits);
      EXPECT_EQ(b.q.size(1), blocks * 32 * bits / 8);
      EXPECT_TRUE(at::allclose(b.dequantize().to(at::kDouble), w, 0, 1e-6)) << bits << " " << out << "x" << in;
      const at::Tensor bias = at::randn({out});
      for (const kernels::Isa isa : variants()) {
        kernels::set_isa(isa);
        for (const int64_t m : kRows) {
          const at::Tensor x = at::randn({m, in});
          // The VNNI variant multiplies int8 activations: its reference quantises them the same way (integer block
          // sums are then exact; float32 scales leave 1e-5).
          const at::Tensor xr = isa == kernels::Isa::kAvx512Vnni ? int8_activations(x) : x.to(at::kDouble);
          const at::Tensor ref = at::linear(xr, w, bias.to(at::kDouble));
          EXPECT_LT(rel_err(nn::quant_blocks_linear(x, b, bias), ref), 1e-5)
              << kernels::isa_name(isa) << " int" << bits << " " << out << "x" << in << " m " << m;
        }
      }
      kernels::set_isa(kernels::detected_isa());
      // Many rows take the expanded-weight path; the same product.
      const at::Tensor x = at::randn({2, 20, in});
      EXPECT_LT(rel_err(nn::quant_blocks_linear(x, b, bias), at::linear(x.to(at::kDouble), w, bias.to(at::kDouble))), 1e-5);
    }
  }
}

TEST(Kernels, KernelsStayOutOfAutograd) {
  // With autograd recording, the layer runs LibTorch's linear and its input gets the usual gradient.
  at::manual_seed(2);
  const at::Tensor w = at::randn({9, 40});
  const at::Tensor x = at::randn({1, 40}).requires_grad_(true);
  nn::dense_linear(x, w, at::Tensor()).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), w.sum(0, /*keepdim=*/true), 1e-5, 1e-5));
  const nn::QuantBlocks b = nn::QuantBlocks::from_values(at::randint(0, 16, {9, 40}, at::kInt), at::rand({9, 2}),
                                                         at::full({9, 2}, 8, at::kInt), 4);
  const at::Tensor x2 = at::randn({1, 40}).requires_grad_(true);
  nn::quant_blocks_linear(x2, b, at::Tensor()).sum().backward();
  EXPECT_TRUE(at::allclose(x2.grad(), b.dequantize().sum(0, /*keepdim=*/true), 1e-5, 1e-5));
}

TEST(Kernels, GptqLayersConvertExactlyUnlessABlockSpansTwoGroups) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({24, 96});
  for (const int64_t bits : {4, 8}) {
    for (const int64_t group : {int64_t{32}, int64_t{96}, int64_t{-1}}) {
      const PackedWeight p = quantize_rtn(w, QuantSpec{bits, group, group != 96}, "w");
      const auto b = to_quant_blocks(p);
      ASSERT_NE(b, nullptr) << bits << " " << group;
      EXPECT_TRUE(at::equal(b->dequantize(), p.dequantize(at::kFloat))) << bits << " " << group;
    }
  }
  // Groups of 16 columns: a 32-column block would need two scales.
  const PackedWeight narrow = quantize_rtn(w, QuantSpec{4, 16, true}, "w");
  EXPECT_EQ(to_quant_blocks(narrow), nullptr);
  // Act-order: the column groups interleave.
  PackedWeight shuffled = quantize_rtn(w, QuantSpec{4, 32, true}, "w");
  shuffled.g_idx = (at::arange(96, at::kInt) % 3).contiguous();
  EXPECT_EQ(to_quant_blocks(shuffled), nullptr);
}

TEST(Kernels, GgufBlocksRunPackedWithTheDecodedFilesLogits) {
  const fs::path stories = test::assets() / "models/stories260K";
  SWIFTCPP_REQUIRE_SHARED(stories);
  const fs::path dir = test::temp_dir("kernels_gguf");
  CausalLM source = load_causal_lm(stories);
  for (const GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    const fs::path file = dir / (std::string(ggml_type_name(type)) + ".gguf");
    GgufExportOptions o;
    o.type = type;
    export_gguf(source, stories, file, o);
    CausalLM decoded = load_gguf_model(file);  // every tensor decoded to float32
    LoadOptions kernels_load;
    kernels_load.quantized_kernels = true;
    CausalLM packed = load_gguf_model(file, kernels_load);
    // The q_proj of layer 0: integers kept, rows back in Hugging Face order, the decoded weight exactly.
    auto* q_proj = packed->model->layers[0]->as<DecoderLayer>()->self_attn->q_proj.get();
    ASSERT_NE(q_proj->blocks, nullptr);
    EXPECT_EQ(q_proj->weight.numel(), 0);
    EXPECT_EQ(q_proj->blocks->bits, type == GgmlType::Q8_0 ? 8 : 4);
    const auto* reference = decoded->model->layers[0]->as<DecoderLayer>()->self_attn->q_proj.get();
    EXPECT_TRUE(at::equal(q_proj->blocks->dequantize(), reference->weight));
    EXPECT_LT(q_proj->blocks->nbytes(), reference->weight.nbytes() / 2);
    // Prefill (expanded tiles) and cached decode steps (kernels) give the decoded model's logits: to float32
    // rounding with float activations; with int8 activations (VNNI, as llama.cpp multiplies) to 3e-2 of the
    // logits' scale.
    IsaScope restore;
    at::InferenceMode guard;
    const at::Tensor ids = at::tensor({1, 403, 407, 261, 378, 506, 91, 12}, at::kLong).unsqueeze(0);
    for (const kernels::Isa isa : variants()) {
      kernels::set_isa(isa);
      const double tolerance = isa == kernels::Isa::kAvx512Vnni ? 3e-2 : 1e-5;
      nn::KVCache ca = decoded->make_cache(1, 16), cb = packed->make_cache(1, 16);
      ForwardOptions fa, fb;
      fa.cache = &ca;
      fb.cache = &cb;
      EXPECT_LT(rel_err(packed->forward(ids, fb), decoded->forward(ids, fa)), tolerance) << kernels::isa_name(isa);
      for (int step = 0; step < 4; ++step) {
        const at::Tensor next = at::tensor({static_cast<int64_t>(30 + step)}, at::kLong).view({1, 1});
        EXPECT_LT(rel_err(packed->forward(next, fb), decoded->forward(next, fa)), tolerance)
            << kernels::isa_name(isa) << " step " << step;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Training products (nn/gemm.h) and the attention kernel that skips masked keys, forward and backward, against
// plain LibTorch in float64.

// max |a - b| / max |b|
double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / std::max(1e-30, bd.abs().max().item<double>());
}

// A float64 leaf copy of t that records gradients (the reference side of a comparison).
at::Tensor leaf64(const at::Tensor& t) { return t.detach().to(at::kDouble).clone().requires_grad_(true); }

struct FastGemmScope {
  ~FastGemmScope() { kernels::set_fast_gemm(true); }
};

TEST(TrainKernels, GemmMatchesLibTorchForEveryOperandLayout) {
  FastGemmScope restore;
  at::manual_seed(0);
  for (const auto& [M, K, N] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 5, 3}, {33, 31, 65}, {130, 100, 257}}) {
    const at::Tensor a = at::randn({M, K}), b = at::randn({K, N});
    const at::Tensor at_ = at::randn({K, M}).t(), bt = at::randn({N, K}).t();            // column-major views
    const at::Tensor wide = at::randn({M, K + 9}).narrow(1, 3, K);                        // row stride > K
    const std::vector<std::pair<at::Tensor, at::Tensor>> cases = {{a, b}, {at_, b}, {a, bt}, {at_, bt}, {wide, b}};
    for (const bool fast : {true, false}) {
      kernels::set_fast_gemm(fast);
      for (const auto& [x, y] : cases) {
        const at::Tensor want = at::mm(x.to(at::kDouble), y.to(at::kDouble));
        EXPECT_LT(max_rel(nn::mm(x, y), want), 1e-5) << M << "x" << K << "x" << N << " fast " << fast;
        at::Tensor c = at::randn({M, N});
        const at::Tensor before = c.to(at::kDouble);
        nn::mm_into(x, y, c, 1.0f);
        EXPECT_LT(max_rel(c, want + before), 1e-5) << M << "x" << K << "x" << N << " fast " << fast;
      }
    }
  }
  // float64 and non-CPU-float operands take at::mm.
  const at::Tensor d = at::randn({4, 6}, at::kDouble), e = at::randn({6, 3}, at::kDouble);
  EXPECT_TRUE(at::equal(nn::mm(d, e), at::mm(d, e)));
}

TEST(TrainKernels, LinearForwardAndBackwardMatchLibTorch) {
  FastGemmScope restore;
  at::manual_seed(1);
  for (const auto& [rows, in, out] : std::vector<std::array<int64_t, 3>>{{3, 5, 7}, {37, 64, 33}, {100, 130, 96}}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      for (const bool bias : {false, true}) {
        const at::Tensor x0 = at::randn({2, rows, in}, dtype), w0 = at::randn({out, in}, dtype) * 0.1;
        const at::Tensor b0 = at::randn({out}, dtype), r = at::randn({2, rows, out}, at::kDouble);
        at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
        at::Tensor b = bias ? b0.clone().requires_grad_(true) : at::Tensor();
        const at::Tensor y = nn::linear(x, w, b);
        (y.to(at::kDouble) * r).sum().backward();
        at::Tensor xr = leaf64(x0), wr = leaf64(w0);
        at::Tensor br = bias ? leaf64(b0) : at::Tensor();
        const at::Tensor yr = at::linear(xr, wr, br);
        (yr * r).sum().backward();
        const double tol = dtype == at::kFloat ? 1e-5 : 1e-12;
        const std::string where = std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(out);
        EXPECT_EQ(y.scalar_type(), dtype);
        EXPECT_LT(max_rel(y, yr), tol) << where;
        EXPECT_LT(max_rel(x.grad(), xr.grad()), tol) << where;
        EXPECT_LT(max_rel(w.grad(), wr.grad()), tol) << where;
        if (bias) {
          EXPECT_LT(max_rel(b.grad(), br.grad()), tol) << where;
        }
      }
    }
  }
  // Frozen weight (LoRA's base): only dx is formed; no autograd at all: a plain product.
  const at::Tensor w = at::randn({8, 16});
  at::Tensor x = at::randn({20, 16}).requires_grad_(true);
  nn::linear(x, w).sum().backward();
  EXPECT_LT(max_rel(x.grad(), w.sum(0).expand({20, 16})), 1e-5);
  // A width that does not match is refused, not reshaped into other rows.
  EXPECT_THROW(nn::linear(at::randn({4, 8}), w), c10::Error);
  at::NoGradGuard no_grad;
  EXPECT_FALSE(nn::linear(x, w).requires_grad());
}

TEST(TrainKernels, ChunkedHeadLossMatchesCrossEntropyInFloat32AndBf16Autocast) {
  at::manual_seed(2);
  const int64_t N = 45, D = 24, V = 97;
  const at::Tensor h0 = at::randn({N, D}), w0 = at::randn({V, D}) * 0.3;
  const at::Tensor targets = at::randint(V, {N}, at::kLong);
  for (const bool bf16 : {false, true}) {
    // Chunks of 10 rows (the last one 5), and everything at once.
    for (const int64_t chunk : {int64_t{10} * V, int64_t{1} << 22}) {
      at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor hr = h0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
      at::Tensor correct, loss, ref, logits;
      {
        at::autocast::set_cpu_enabled(bf16);
        at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
        loss = nn::linear_cross_entropy(h, w, targets, &correct, chunk);
        logits = at::linear(hr, wr);  // autocast: bf16 operands and result, as the fused loss multiplies
        ref = at::nll_loss(at::log_softmax(logits, -1, at::kFloat), targets, {}, at::Reduction::Sum);
        at::autocast::set_cpu_enabled(false);
        at::autocast::clear_cache();
      }
      (loss * 0.5).backward();
      (ref * 0.5).backward();
      const double tol = bf16 ? 1e-2 : 1e-5;
      const std::string where = std::string(bf16 ? "bf16" : "float32") + " chunk " + std::to_string(chunk);
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_LT(std::abs(loss.item<double>() - ref.item<double>()) / ref.item<double>(), bf16 ? 1e-3 : 1e-6) << where;
      EXPECT_LT(max_rel(h.grad(), hr.grad()), tol) << where;
      EXPECT_LT(max_rel(w.grad(), wr.grad()), tol) << where;
      EXPECT_EQ(correct.item<int64_t>(), logits.argmax(-1).eq(targets).sum().item<int64_t>()) << where;
    }
  }
  // No rows: a zero loss that backward accepts (a ChunkFlow chunk without labels).
  at::Tensor none = at::zeros({0, D}).requires_grad_(true);
  const at::Tensor zero = nn::linear_cross_entropy(none, w0, at::zeros({0}, at::kLong));
  EXPECT_EQ(zero.item<double>(), 0.0);
  zero.backward();
  // Frozen head (LoRA): gradients for the hidden rows only; no autograd: the value alone.
  at::Tensor h = h0.clone().requires_grad_(true);
  nn::linear_cross_entropy(h, w0, targets, nullptr, 7 * V).backward();
  EXPECT_TRUE(h.grad().defined());
  at::NoGradGuard no_grad;
  const double plain = nn::linear_cross_entropy(h0, w0, targets).item<double>();
  EXPECT_NEAR(plain, at::cross_entropy_loss(at::linear(h0, w0), targets, {}, at::Reduction::Sum).item<double>(),
              1e-5 * plain);
}

TEST(TrainKernels, AttentionSkippingMaskedKeysMatchesTheMathPathForwardAndBackward) {
  at::manual_seed(3);
  // Three rows of 300 queries (three 128-row blocks, the last one short): right padding, packed samples and a
  // plain causal row; GQA with two query heads a K/V head. 4 heads run the batch as one tile, 8 heads a tile per
  // row over its visible keys; float32 without a cap runs the fused softmax rows, the others the tensor path.
  // (Heads this small would take the row kernels: off here, tested on their own below.)
  nn::set_small_head_dim(0);
  const int64_t B = 3, T = 300, Dh = 16;
  ASSERT_FALSE(nn::attention_tiles_per_row(4, T, T));
  ASSERT_TRUE(nn::attention_tiles_per_row(8, T, T));
  at::Tensor valid = at::ones({B, T}, at::kBool);
  valid[0].narrow(0, 250, 50).fill_(false);
  at::Tensor segments = at::zeros({B, T}, at::kLong);
  segments[1].narrow(0, 90, 110).fill_(1);
  segments[1].narrow(0, 200, 100).fill_(2);
  const at::Tensor mask = nn::build_attention_mask(B, 0, T, valid, 0, at::kCPU, segments);
  for (const int64_t H : {4, 8}) {
  const int64_t Hkv = H / 2;
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor q0 = at::randn({B, H, T, Dh}, dtype), k0 = at::randn({B, Hkv, T, Dh}, dtype);
    const at::Tensor v0 = at::randn({B, Hkv, T, Dh}, dtype), g = at::randn({B, H, T, Dh}, dtype);
    for (const double softcap : {0.0, 5.0}) {
      nn::ScoreOptions score;
      score.softcap = softcap;
      at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      at::Tensor v = v0.clone().requires_grad_(true);
      const at::Tensor out = nn::attention_blocks(q, {k}, {v}, mask, int64_t{1} << 23, score);
      (out * g).sum().backward();
      at::Tensor qr = leaf64(q0), kr = leaf64(k0);
      at::Tensor vr = leaf64(v0);
      nn::set_recompute_attention(false);
      const at::Tensor ref = nn::attention(qr, kr, vr, mask, score);
      nn::set_recompute_attention(true);
      (ref * g.to(at::kDouble)).sum().backward();
      const double tol = dtype == at::kFloat ? 1e-5 : 1e-12;
      const std::string where = std::string(at::toString(dtype)) + " softcap " + std::to_string(softcap) +
                                " heads " + std::to_string(H);
      EXPECT_LT(max_rel(out, ref), tol) << where;
      EXPECT_LT(max_rel(q.grad(), qr.grad()), tol) << where;
      EXPECT_LT(max_rel(k.grad(), kr.grad()), tol) << where;
      EXPECT_LT(max_rel(v.grad(), vr.grad()), tol) << where;
    }
  }
  }
  nn::set_small_head_dim(nn::kSmallHeadDim);
}

// Small heads (Dh <= nn::kSmallHeadDim) train with the row kernels: forward and every gradient equal the float64
// math path, with padding, packed samples and causal rows, GQA, keys given as two blocks (a ChunkFlow chunk after
// its stored past), at one thread and at several (each KV head's rows run on one thread in order).
TEST(TrainKernels, SmallHeadAttentionMatchesTheMathPathForwardAndBackward) {
  at::manual_seed(5);
  const int64_t B = 3, T = 70, H = 6, Hkv = 2, Dh = 8, past = 20;
  ASSERT_LE(Dh, nn::kSmallHeadDim);
  at::Tensor valid = at::ones({B, past + T}, at::kBool);
  valid[0].narrow(0, past + 55, 15).fill_(false);
  at::Tensor segments = at::zeros({B, past + T}, at::kLong);
  segments[1].narrow(0, 40, 30).fill_(1);
  segments[1].narrow(0, 70, 20).fill_(2);
  const at::Tensor mask = nn::build_attention_mask(B, past, T, valid, 0, at::kCPU, segments);  // [B, 1, T, S]
  const at::Tensor q0 = at::randn({B, H, T, Dh}), k0 = at::randn({B, Hkv, past + T, Dh});
  const at::Tensor v0 = at::randn({B, Hkv, past + T, Dh}), g = at::randn({B, H, T, Dh});
  at::Tensor qr = leaf64(q0), kr = leaf64(k0), vr = leaf64(v0);
  nn::set_recompute_attention(false);
  const at::Tensor ref = nn::attention(qr, kr, vr, mask);
  nn::set_recompute_attention(true);
  (ref * g.to(at::kDouble)).sum().backward();
  const int saved_threads = parallel::threads();
  for (const int threads : {1, 3}) {
    parallel::set_threads(threads);
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    at::Tensor v = v0.clone().requires_grad_(true);
    const at::Tensor out = nn::attention_blocks(q, {k.narrow(2, 0, past), k.narrow(2, past, T)},
                                                {v.narrow(2, 0, past), v.narrow(2, past, T)}, mask);
    (out * g).sum().backward();
    const std::string where = "threads " + std::to_string(threads);
    EXPECT_LT(max_rel(out, ref), 1e-5) << where;
    EXPECT_LT(max_rel(q.grad(), qr.grad()), 1e-5) << where;
    EXPECT_LT(max_rel(k.grad(), kr.grad()), 1e-5) << where;
    EXPECT_LT(max_rel(v.grad(), vr.grad()), 1e-5) << where;
  }
  parallel::set_threads(saved_threads);
}

// Past nn::max_whole_scores() scores, attention() runs its queries in row blocks (a vision tower over a large image,
// a long prefill): the results equal the whole-scores path's for float32 and bfloat16, masked or not, with GQA,
// small heads (row kernels) and large ones (score GEMMs), and memory stays linear in the sequence: at 4096 x 4096
// the whole path holds 128 MiB of scores and as much of probabilities, the blocks one block's 32 MiB.
TEST(Attention, PastTheWholeScoresLimitRowBlocksGiveTheSameResultsInLinearMemory) {
  at::manual_seed(8);
  c10::InferenceMode guard;
  const int64_t B = 2, T = 300, H = 4, Hkv = 2;
  at::Tensor valid = at::ones({B, T}, at::kBool);
  valid[1].narrow(0, 240, 60).fill_(false);
  const at::Tensor causal = nn::build_attention_mask(B, 0, T, valid, 0, at::kCPU);
  for (const int64_t Dh : {16, 64}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor q = at::randn({B, H, T, Dh}).to(dtype), k = at::randn({B, Hkv, T, Dh}).to(dtype);
      const at::Tensor v = at::randn({B, Hkv, T, Dh}).to(dtype);
      for (const bool masked : {false, true}) {
        const at::Tensor mask = masked ? causal : at::Tensor();
        nn::set_max_whole_scores(int64_t{1} << 40);
        const at::Tensor whole = nn::attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), mask);
        nn::set_max_whole_scores(1000);
        const at::Tensor blocked = nn::attention(q, k, v, mask);
        nn::set_max_whole_scores(nn::kMaxWholeScores);
        const std::string where = fmt::format("Dh {} {} masked {}", Dh, at::toString(dtype), masked);
        ASSERT_EQ(blocked.scalar_type(), dtype) << where;
        ASSERT_EQ(blocked.sizes(), whole.sizes()) << where;
        // Against the float64 whole-scores result of the same inputs. bfloat16 computes in float32 and rounds the
        // output once (2^-9 of a value at most).
        EXPECT_LT(max_rel(blocked, whole), dtype == at::kFloat ? 1e-5 : 4e-3) << where;
      }
    }
  }
  install_memory_tracking();
  const at::Device cpu(at::kCPU);
  const int64_t L = 4096;
  for (const int64_t Dh : {16, 40}) {  // the row kernels, then the score GEMMs
    const at::Tensor q = at::randn({1, 2, L, Dh}), k = at::randn({1, 2, L, Dh}), v = at::randn({1, 2, L, Dh});
    reset_peak_memory(cpu);
    const int64_t before = current_memory_bytes(cpu);
    const at::Tensor out = nn::attention(q, k, v, at::Tensor());
    const int64_t peak = peak_memory_bytes(cpu) - before;
    EXPECT_EQ(out.sizes(), q.sizes());
    EXPECT_LT(peak, int64_t{56} << 20) << "Dh " << Dh << ": " << (peak >> 20) << " MiB";
  }
}

// A query row that sees no key gives zeros and no gradient on both training paths (the row kernels and the score
// GEMMs), and the rows beside it are unchanged; the two paths agree everywhere.
TEST(TrainKernels, SmallHeadAttentionRowWithoutKeysIsZeroOnBothPaths) {
  at::manual_seed(6);
  const int64_t B = 2, T = 12, H = 2, Dh = 4;
  at::Tensor mask = at::ones({T, T}, at::kBool).tril().view({1, 1, T, T}).expand({B, 1, T, T}).contiguous();
  mask[1][0][5].fill_(false);
  const at::Tensor q0 = at::randn({B, H, T, Dh}), k0 = at::randn({B, H, T, Dh}), v0 = at::randn({B, H, T, Dh});
  const at::Tensor g = at::randn({B, H, T, Dh});
  std::vector<at::Tensor> results;
  for (const bool small : {true, false}) {
    nn::set_small_head_dim(small ? nn::kSmallHeadDim : 0);
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    at::Tensor v = v0.clone().requires_grad_(true);
    const at::Tensor out = nn::attention_blocks(q, {k}, {v}, mask);
    (out * g).sum().backward();
    EXPECT_EQ(out[1].select(1, 5).abs().max().item<float>(), 0.0f) << "small heads " << small;
    EXPECT_EQ(q.grad()[1].select(1, 5).abs().max().item<float>(), 0.0f) << "small heads " << small;
    EXPECT_TRUE(at::isfinite(k.grad()).all().item<bool>());
    results.insert(results.end(), {out.detach(), q.grad(), k.grad(), v.grad()});
  }
  nn::set_small_head_dim(nn::kSmallHeadDim);
  for (size_t i = 0; i < 4; ++i) EXPECT_LT(max_rel(results[i], results[i + 4]), 1e-5) << "tensor " << i;
}

}  // namespace
}  // namespace swiftcpp
