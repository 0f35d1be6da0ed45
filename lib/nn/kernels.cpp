#include "nn/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <immintrin.h>

#ifdef SWIFTCPP_HAVE_DNNL
#include <dnnl.h>
#endif

// gcc 12 reports the deliberately undefined vectors inside its own AVX-512 intrinsics (_mm512_undefined_*) as maybe
// uninitialised wherever they are inlined; nothing of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The code between SWIFTCPP_TARGET_PUSH(isa) and SWIFTCPP_TARGET_POP() is compiled for `isa`: gcc's target
// pragma, or clang's attribute on every function of the region (the fuzz build compiles the library with clang).
#define SWIFTCPP_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#define SWIFTCPP_TARGET_PUSH(isa) SWIFTCPP_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define SWIFTCPP_TARGET_POP() SWIFTCPP_PRAGMA(clang attribute pop)
#else
#define SWIFTCPP_TARGET_PUSH(isa) SWIFTCPP_PRAGMA(GCC push_options) SWIFTCPP_PRAGMA(GCC target(isa))
#define SWIFTCPP_TARGET_POP() SWIFTCPP_PRAGMA(GCC pop_options)
#endif

namespace swiftcpp::kernels {

// Each variant is the same source compiled for its instruction set; nothing here is inlined across variants.
namespace generic {
#define KERNEL_LANES 4
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace generic

SWIFTCPP_TARGET_PUSH("avx2,fma,f16c")
namespace avx2 {
#define KERNEL_LANES 8
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace avx2
SWIFTCPP_TARGET_POP()

SWIFTCPP_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace avx512 {
#define KERNEL_LANES 16
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace avx512
SWIFTCPP_TARGET_POP()

// Integer weights times int8 activations with AVX512_VNNI: one vpdpbusd (unsigned weight bytes times signed
// activation bytes, four products summed into each int32 lane) per 32 weights of a block.
SWIFTCPP_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace vnni {

// Blocks b and b + 1 of row o (the second only when `two`) as 64 bytes in column order, block b in the low half
// (4-bit: the nibbles spread out).
inline __m512i block_pair(const QuantMatrix& w, int64_t o, int64_t b, bool two) {
  if (w.bits == 8) {
    const auto* p = w.q + (o * w.blocks + b) * kBlock;
    return two ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);
  }
  const auto* p = w.q + (o * w.blocks + b) * (kBlock / 2);
  const __m256i packed = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                             : _mm256_maskz_loadu_epi8(0xFFFFu, p);
  const __m256i nib = _mm256_set1_epi8(15);
  const __m256i low = _mm256_and_si256(packed, nib);                          // [b: 0..15 | b+1: 0..15]
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib);   // [b: 16..31 | b+1: 16..31]
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  return _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));          // [b lo, b hi, b+1 lo, b+1 hi]
}

// Per weight row: the blocks go 16 at a time; their scales times each activation row's d are one vector, and two
// blocks share each vpdpbusd (64 bytes) with their scales spread over the lanes by one permute. The zero points'
// term, sum_b s_b z_b d_b xqsum_b, is a vector product per 16 blocks.
template <int MB>
void rows_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xs, float* y, int64_t ldy,
             int64_t o0, int64_t o1) {
  const int64_t nb = w.blocks, ldx = nb * kBlock;
  const __m512i pair_lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t o = o0; o < o1; ++o) {
    __m512 acc[MB], zacc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = zacc[m] = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += 16) {
      const int64_t n = std::min<int64_t>(16, nb - c0);
      const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
      const __m512 s = _mm512_maskz_loadu_ps(mask, w.scales + o * nb + c0);
      const __m512 z = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, w.zeros + o * nb + c0)));
      __m512 sd[MB];
      for (int m = 0; m < MB; ++m) {
        sd[m] = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mask, d + m * nb + c0));
        const __m512 sums = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(mask, xs + m * nb + c0));
        zacc[m] = _mm512_fmadd_ps(_mm512_mul_ps(sd[m], z), sums, zacc[m]);
      }
      for (int64_t p = 0; p < n; p += 2) {
        const bool two = p + 1 < n;
        const __m512i wq = block_pair(w, o, c0 + p, two);
        const __m512i lanes = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(static_cast<int>(p)));
        for (int m = 0; m < MB; ++m) {
          const int8_t* xp = xq + m * ldx + (c0 + p) * kBlock;
          const __m512i xv = two ? _mm512_loadu_si512(xp) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xp);
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv);  // [16] int32: 8 per block
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, sd[m]), acc[m]);
        }
      }
    }
    for (int m = 0; m < MB; ++m) y[m * ldy + o] = _mm512_reduce_add_ps(acc[m]) - _mm512_reduce_add_ps(zacc[m]);
  }
}

void gemv_quant_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xs, int64_t M, float* y,
                   int64_t ldy, int64_t o0, int64_t o1) {
  const int64_t ldx = w.blocks * kBlock;
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mb = std::min<int64_t>(4, M - m0);
    const int8_t* x = xq + m0 * ldx;
    const float* dm = d + m0 * w.blocks;
    const int32_t* sm = xs + m0 * w.blocks;
    float* ym = y + m0 * ldy;
    switch (mb) {
      case 1: rows_q8<1>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 2: rows_q8<2>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 3: rows_q8<3>(w, x, dm, sm, ym, ldy, o0, o1); break;
      default: rows_q8<4>(w, x, dm, sm, ym, ldy, o0, o1); break;
    }
  }
}

}  // namespace vnni
SWIFTCPP_TARGET_POP()

// bfloat16 weights times bfloat16 activations with AVX512_BF16: vdpbf16ps multiplies 32 pairs exactly and adds them
// into 16 float32 lanes, with no conversion of the weights.
SWIFTCPP_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
namespace bf16dp {

template <int MB>
void rows(const uint16_t* w, int64_t cols, const uint16_t* xb, float* y, int64_t ldy, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint16_t* row = w + o * cols;
    __m512 acc[2][MB];  // even and odd 32-column steps: two independent chains
    for (int m = 0; m < MB; ++m) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
    for (int64_t j = 0; j < cols; j += 32) {
      const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(row + j));
      __m512* a = acc[(j / 32) & 1];
      for (int m = 0; m < MB; ++m) {
        a[m] = _mm512_dpbf16_ps(a[m], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xb + m * cols + j)));
      }
    }
    for (int m = 0; m < MB; ++m) y[m * ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]));
  }
}

void gemv(const uint16_t* w, int64_t cols, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy, int64_t o0,
          int64_t o1) {
  // The activations as bfloat16, rounded to nearest even (exact for a bfloat16 model's activations).
  std::vector<uint16_t> xb(static_cast<size_t>(M * cols));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t i = 0; i < cols; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + m * ldx + i, sizeof bits);
      xb[static_cast<size_t>(m * cols + i)] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    }
  }
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mb = std::min<int64_t>(4, M - m0);
    const uint16_t* xm = xb.data() + m0 * cols;
    float* ym = y + m0 * ldy;
    switch (mb) {
      case 1: rows<1>(w, cols, xm, ym, ldy, o0, o1); break;
      case 2: rows<2>(w, cols, xm, ym, ldy, o0, o1); break;
      case 3: rows<3>(w, cols, xm, ym, ldy, o0, o1); break;
      default: rows<4>(w, cols, xm, ym, ldy, o0, o1); break;
    }
  }
}

}  // namespace bf16dp
SWIFTCPP_TARGET_POP()

namespace {
bool cpu_bf16_dot() {
  __builtin_cpu_init();
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    return __builtin_cpu_supports("avx512vnni") ? Isa::kAvx512Vnni : Isa::kAvx512;
  }
#if defined(__clang__)
  const bool f16c = true;  // clang's __builtin_cpu_supports does not know "f16c"; every AVX2 CPU has it
#else
  const bool f16c = __builtin_cpu_supports("f16c");
#endif
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
    return Isa::kAvx2;
  }
  return Isa::kGeneric;
}
std::atomic<int> g_active{-1};
}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  const int v = g_active.load(std::memory_order_relaxed);
  return v < 0 ? detected_isa() : static_cast<Isa>(v);
}

void set_isa(Isa isa) {
  g_active.store(static_cast<int>(std::min(isa, detected_isa())), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "avx512-vnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kGeneric: break;
  }
  return "x86-64";
}

#define SWIFTCPP_DISPATCH(call)          \
  switch (active_isa()) {                \
    case Isa::kAvx512Vnni:                 \
    case Isa::kAvx512: avx512::call; break; \
    case Isa::kAvx2: avx2::call; break;     \
    case Isa::kGeneric: generic::call; break; \
  }

void gemv_quant(const QuantMatrix& w, const float* x, int64_t ldx, const float* xsum, int64_t M, float* y,
                int64_t ldy, int64_t o0, int64_t o1) {
  SWIFTCPP_DISPATCH(gemv_quant(w, x, ldx, xsum, M, y, ldy, o0, o1))
}

bool quant_takes_int8_activations() { return active_isa() == Isa::kAvx512Vnni; }

void quantize_activations(const float* x, int64_t M, int64_t blocks, int8_t* xq, float* d, int32_t* xqsum) {
  for (int64_t i = 0; i < M * blocks; ++i) {
    const float* xb = x + i * kBlock;
    float top = 0;
    for (int j = 0; j < kBlock; ++j) top = std::max(top, std::fabs(xb[j]));
    const float scale = top / 127.0f, inv = scale > 0 ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int v = static_cast<int>(std::lround(xb[j] * inv));
      xq[i * kBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[i] = scale;
    xqsum[i] = sum;
  }
}

void gemv_quant_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xqsum, int64_t M, float* y,
                   int64_t ldy, int64_t o0, int64_t o1) {
  vnni::gemv_quant_q8(w, xq, d, xqsum, M, y, ldy, o0, o1);
}

void gemv_f32(const float* w, int64_t cols, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
              int64_t o0, int64_t o1) {
  SWIFTCPP_DISPATCH(gemv_f32(w, cols, x, ldx, M, y, ldy, o0, o1))
}

void gemv_bf16(const uint16_t* w, int64_t cols, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
               int64_t o0, int64_t o1) {
  if (active_isa() >= Isa::kAvx512 && cols % 32 == 0 && cpu_bf16_dot()) {
    bf16dp::gemv(w, cols, x, ldx, M, y, ldy, o0, o1);
    return;
  }
  SWIFTCPP_DISPATCH(gemv_bf16(w, cols, x, ldx, M, y, ldy, o0, o1))
}

void accumulate_rows(const float* p, const float* v, int64_t ldv, int64_t rows, int64_t n, float* out) {
  SWIFTCPP_DISPATCH(accumulate_rows(p, v, ldv, rows, n, out))
}

void accumulate_rows_bf16(const float* p, const uint16_t* v, int64_t ldv, int64_t rows, int64_t n, float* out) {
  SWIFTCPP_DISPATCH(accumulate_rows_bf16(p, v, ldv, rows, n, out))
}

float softmax_row(float* s, int64_t n, float scale, const bool* mask) {
  switch (active_isa()) {
    case Isa::kAvx512Vnni:
    case Isa::kAvx512: return avx512::softmax_row(s, n, scale, mask);
    case Isa::kAvx2: return avx2::softmax_row(s, n, scale, mask);
    case Isa::kGeneric: break;
  }
  return generic::softmax_row(s, n, scale, mask);
}

void softmax_backward_row(float* s, float* dp, int64_t n, float scale, const bool* mask, float lse, float delta) {
  SWIFTCPP_DISPATCH(softmax_backward_row(s, dp, n, scale, mask, lse, delta))
}

void attention_rows_forward(const AttentionRows& a, float* out, float* lse, float* scratch) {
  SWIFTCPP_DISPATCH(attention_rows_forward(a, out, lse, scratch))
}

void attention_rows_backward(const AttentionRows& a, const float* dout, const float* out, const float* lse, float* dq,
                             float* dkt, float* dvt, float* scratch) {
  SWIFTCPP_DISPATCH(attention_rows_backward(a, dout, out, lse, dq, dkt, dvt, scratch))
}

void dequantize_rows(const QuantMatrix& w, int64_t o0, int64_t o1, float* out, int64_t ldo) {
  SWIFTCPP_DISPATCH(dequantize_rows(w, o0, o1, out, ldo))
}

#undef SWIFTCPP_DISPATCH

namespace {
#ifdef SWIFTCPP_HAVE_DNNL
std::atomic<bool> g_fast_gemm{true};
#else
std::atomic<bool> g_fast_gemm{false};
#endif
}  // namespace

bool has_fast_gemm() { return g_fast_gemm.load(std::memory_order_relaxed); }

void set_fast_gemm(bool on) {
#ifdef SWIFTCPP_HAVE_DNNL
  g_fast_gemm = on;
#else
  (void)on;
#endif
}

bool sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
#ifdef SWIFTCPP_HAVE_DNNL
  if (!has_fast_gemm()) return false;
  return dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success;
#else
  (void)transa, (void)transb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
  (void)beta, (void)C, (void)ldc;
  return false;
#endif
}

}  // namespace swiftcpp::kernels
