#include "nn/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

namespace swiftcpp::kernels {

// Each variant is the same source compiled for its instruction set; nothing here is inlined across variants.
namespace generic {
#define KERNEL_LANES 4
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace generic

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#define KERNEL_LANES 8
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace avx512 {
#define KERNEL_LANES 16
#include "nn/kernels_impl.inc"
#undef KERNEL_LANES
}  // namespace avx512
#pragma GCC pop_options

// Integer weights times int8 activations with AVX512_VNNI: one vpdpbusd (unsigned weight bytes times signed
// activation bytes, four products summed into each int32 lane) per 32 weights of a block.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace vnni {

// The 32 weights of block b of row o as bytes in column order (4-bit: the nibbles spread out).
inline __m256i block_bytes(const QuantMatrix& w, int64_t o, int64_t b) {
  if (w.bits == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q + (o * w.blocks + b) * kBlock));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + (o * w.blocks + b) * (kBlock / 2)));
  const __m128i low = _mm_and_si128(packed, _mm_set1_epi8(15));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(15));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);  // columns 0..15, then 16..31
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

template <int MB>
void rows_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xs, float* y, int64_t ldy,
             int64_t o0, int64_t o1) {
  const int64_t nb = w.blocks, ldx = nb * kBlock;
  for (int64_t o = o0; o < o1; ++o) {
    // Even and odd blocks accumulate apart: two independent chains of multiply-adds.
    __m256 acc[2][MB];
    float zterm[MB];
    for (int m = 0; m < MB; ++m) {
      acc[0][m] = acc[1][m] = _mm256_setzero_ps();
      zterm[m] = 0;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i wq = block_bytes(w, o, b);
      const float s = w.scales[o * nb + b], z = static_cast<float>(w.zeros[o * nb + b]);
      __m256* a = acc[b & 1];
      for (int m = 0; m < MB; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * ldx + b * kBlock));
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xv);  // [8] int32
        const float sd = s * d[m * nb + b];
        a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sd), a[m]);
        zterm[m] += sd * z * static_cast<float>(xs[m * nb + b]);
      }
    }
    for (int m = 0; m < MB; ++m) y[m * ldy + o] = hsum8(_mm256_add_ps(acc[0][m], acc[1][m])) - zterm[m];
  }
}

void gemv_quant_q8(const QuantMatrix& w, const int8_t* xq, const float* d, const int32_t* xs, int64_t M, float* y,
                   int64_t ldy, int64_t o0, int64_t o1) {
  const int64_t ldx = w.blocks * kBlock;
  for (int64_t m0 = 0; m0 < M; m0 += 8) {
    const int64_t mb = std::min<int64_t>(8, M - m0);
    const int8_t* x = xq + m0 * ldx;
    const float* dm = d + m0 * w.blocks;
    const int32_t* sm = xs + m0 * w.blocks;
    float* ym = y + m0 * ldy;
    switch (mb) {
      case 1: rows_q8<1>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 2: rows_q8<2>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 3: rows_q8<3>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 4: rows_q8<4>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 5: rows_q8<5>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 6: rows_q8<6>(w, x, dm, sm, ym, ldy, o0, o1); break;
      case 7: rows_q8<7>(w, x, dm, sm, ym, ldy, o0, o1); break;
      default: rows_q8<8>(w, x, dm, sm, ym, ldy, o0, o1); break;
    }
  }
}

}  // namespace vnni
#pragma GCC pop_options

namespace {
Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    return __builtin_cpu_supports("avx512vnni") ? Isa::kAvx512Vnni : Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
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
  SWIFTCPP_DISPATCH(gemv_bf16(w, cols, x, ldx, M, y, ldy, o0, o1))
}

void accumulate_rows(const float* p, const float* v, int64_t ldv, int64_t rows, int64_t n, float* out) {
  SWIFTCPP_DISPATCH(accumulate_rows(p, v, ldv, rows, n, out))
}

void dequantize_rows(const QuantMatrix& w, int64_t o0, int64_t o1, float* out, int64_t ldo) {
  SWIFTCPP_DISPATCH(dequantize_rows(w, o0, o1, out, ldo))
}

#undef SWIFTCPP_DISPATCH

}  // namespace swiftcpp::kernels
