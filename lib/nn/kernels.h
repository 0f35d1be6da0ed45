// CPU kernels for inference-time linear layers with few input rows (decode steps of one or a few sequences):
// y = x W^T over float32, bfloat16 and block-quantised integer weights, with AVX-512 (plus AVX512_VNNI for integer
// and AVX512_BF16 for bfloat16 weights), AVX2 and plain x86-64 variants chosen at run time. They take raw pointers and a row range, so callers split rows across threads; they
// allocate nothing and throw nothing. Training never runs them (they have no backward): nn::Linear uses them only
// when autograd does not record.
#pragma once

#include <cstdint>

namespace swiftcpp::kernels {

/// Instruction sets a kernel variant is compiled for, from plain x86-64 (SSE2) up. kAvx512Vnni differs from kAvx512
/// only for integer weights: their products take int8 activations (quantize_activations, gemv_quant_q8).
enum class Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

/// The best variant this CPU runs (AVX2 needs FMA and F16C too; AVX-512 needs F, BW, VL and DQ; VNNI adds
/// AVX512_VNNI).
Isa detected_isa();
/// The variant in use: detected_isa() unless set_isa lowered it.
Isa active_isa();
/// Uses `isa`, or detected_isa() when the CPU lacks it (tests run every variant the machine has this way).
void set_isa(Isa isa);
const char* isa_name(Isa isa);

/// Columns per quantisation block.
constexpr int64_t kBlock = 32;

/// A block-quantised weight matrix W [rows, cols]: columns in blocks of kBlock, the last one padded with zero weights
/// (q == zero) up to blocks * kBlock, and W[o, i] = scale[o, b] * (q[o, i] - zero[o, b]) with b = i / kBlock.
///   bits 8: q is one byte a weight, row o at q + o * blocks * 32, in column order.
///   bits 4: 16 bytes a block (row o at q + o * blocks * 16); byte j of a block holds column j in its low nibble and
///           column j + 16 in its high nibble (GGUF's Q4_0 order).
struct QuantMatrix {
  const uint8_t* q = nullptr;
  const float* scales = nullptr;  // [rows, blocks]
  const uint8_t* zeros = nullptr; // [rows, blocks]
  int64_t rows = 0, cols = 0, blocks = 0;
  int bits = 8;
  int64_t row_bytes() const { return blocks * kBlock * bits / 8; }
};

/// y[m * ldy + o] = sum_i W[o, i] x[m * ldx + i] for m < M and rows o in [o0, o1) of each kernel below.

/// x: [M, blocks * 32] float32 with zeros past `cols`; xsum: [M, blocks], each block's sum of x. Float activations:
/// every variant but kAvx512Vnni.
void gemv_quant(const QuantMatrix& w, const float* x, int64_t ldx, const float* xsum, int64_t M, float* y,
                int64_t ldy, int64_t o0, int64_t o1);

/// Whether the active variant multiplies integer weights with int8 activations (gemv_quant_q8 below) instead.
bool quant_takes_int8_activations();

/// Activations quantised as llama.cpp quantises them for its integer dot products (Q8_0): per block of 32,
/// d = max|x| / 127 and xq = round(x / d) (half away from zero; d = 0 gives zeros). x: [M, blocks * 32] ->
/// xq [M, blocks * 32], d [M, blocks], xqsum [M, blocks] (the sum of each block's xq).
void quantize_activations(const float* x, int64_t M, int64_t blocks, int8_t* xq, float* d, int32_t* xqsum);

/// gemv_quant over quantised activations: y = sum_b scale_w * d_x * (sum_i q_i xq_i - zero * xqsum), exact integer
/// block sums (AVX512_VNNI's vpdpbusd), float32 across blocks. Only where quant_takes_int8_activations().
void gemv_quant_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xqsum, int64_t M, float* y,
                   int64_t ldy, int64_t o0, int64_t o1);
/// W float32 [rows, cols] row-major; x float32.
void gemv_f32(const float* w, int64_t cols, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
              int64_t o0, int64_t o1);
/// W bfloat16 [rows, cols] row-major (raw bits); x float32 (products are exact in float32; sums in float32). With
/// AVX-512 and AVX512_BF16 and cols a multiple of 32, x is rounded to bfloat16 first (exact for a bfloat16 model's
/// activations) and vdpbf16ps multiplies.
void gemv_bf16(const uint16_t* w, int64_t cols, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
               int64_t o0, int64_t o1);

/// out[d] += sum_j p[j] * v[j * ldv + d] for d < n, j < rows (attention's probabilities times its values).
void accumulate_rows(const float* p, const float* v, int64_t ldv, int64_t rows, int64_t n, float* out);

/// The same with bfloat16 values (raw bits).
void accumulate_rows_bf16(const float* p, const uint16_t* v, int64_t ldv, int64_t rows, int64_t n, float* out);

/// Attention's softmax over one row of raw scores s [n] (q . k), in place: s[j] <- scale * s[j] where mask[j]
/// (every j when mask is null), -inf elsewhere, then the softmax over j (e^x from a polynomial, about 1 ulp; the
/// same operations in the same order at any thread count). Returns the row's log-sum-exp; a row with no key visible
/// becomes zeros and returns -inf. mask: n bytes, 0 or 1.
float softmax_row(float* s, int64_t n, float scale, const bool* mask);

/// Its backward for one row, recomputing the probabilities: p[j] = e^(scale * s[j] - lse) where mask[j] (0
/// elsewhere) replaces s[j], and dp[j] <- scale * p[j] * (dp[j] - delta) (dp = dO . v, delta = rowsum(dO * O))
/// becomes the gradient of the raw score.
void softmax_backward_row(float* s, float* dp, int64_t n, float scale, const bool* mask, float lse, float delta);

/// One batch row and KV head of attention whose heads are small (a few dozen dimensions: there the score GEMMs
/// of BlockAttention move far more memory than they compute), every query row in one pass over keys and values
/// that stay in L1. q: the KV head's R = G * T query rows [R, Dh] (its G query heads, T rows each); kt, vt: its
/// keys and values transposed [Dh, S]; mask: [T, S] bytes (row r uses mask row r % T) or null; scale multiplies
/// q . k. Each row reads only the keys between the first and last its mask row lets it see.
struct AttentionRows {
  const float* q = nullptr;
  int64_t rows = 0, T = 0;
  const float* kt = nullptr;
  const float* vt = nullptr;
  int64_t S = 0, Dh = 0;
  float scale = 1;
  const bool* mask = nullptr;
};

/// out [R, Dh] and lse [R] (softmax_row's; zeros and -inf for a row that sees no key). scratch: S floats.
void attention_rows_forward(const AttentionRows& a, float* out, float* lse, float* scratch);

/// The backward from dO [R, Dh], the forward's O [R, Dh] and lse [R]: dq [R, Dh] is written, dkt and dvt [Dh, S]
/// (keys' and values' gradients, transposed) are added to. scratch: 2 * S floats.
void attention_rows_backward(const AttentionRows& a, const float* dout, const float* out, const float* lse, float* dq,
                             float* dkt, float* dvt, float* scratch);

/// Whether this build has the fast float32 GEMM below (oneDNN's sgemm, JIT-compiled for the CPU's widest vectors:
/// AVX-512 where present, where Debian's OpenBLAS 0.3.21 runs its 256-bit Haswell kernels on AMD Zen 4/5) and it
/// is switched on (set_fast_gemm).
bool has_fast_gemm();
/// Switches the fast GEMM off (LibTorch's at::mm, i.e. OpenBLAS, runs instead) or back on, process-wide; for
/// benchmarks and tests that compare the two.
void set_fast_gemm(bool on);

/// C = alpha * op(A) op(B) + beta * C in row-major storage (BLAS's sgemm on row-major matrices): op(A) [M, K],
/// op(B) [K, N], C [M, N] with leading dimensions lda, ldb, ldc; trans 'N' or 'T'. Runs on the calling thread's
/// OpenMP team. Returns false (and touches nothing) where has_fast_gemm() is false or the kernel refuses the
/// arguments; the caller then multiplies another way.
bool sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// Rows [o0, o1) of W as float32 into out [(o1 - o0), cols] (row stride ldo).
void dequantize_rows(const QuantMatrix& w, int64_t o0, int64_t o1, float* out, int64_t ldo);

}  // namespace swiftcpp::kernels
