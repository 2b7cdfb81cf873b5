// What the AVX-512 linear kernels share: the one lane tree that ends every output element's
// sum, and the register tile bounds of the exact kernel (linear_avx512.cc; the bf16 and int8
// kernels, linear_avx512bf16.cc and linear_int8_avx512vnni.cc, have their own). Include only from
// files compiled for AVX-512 (core/CMakeLists.txt); the functions have internal linkage so
// that each ISA's file keeps its own copy.
#pragma once

#include <immintrin.h>

namespace glmserve::internal {
namespace avx512 {

// Register tiles of up to kTileM activation rows x kTileN weight rows.
inline constexpr int kTileM = 4;
inline constexpr int kTileN = 4;

// The 16 lanes of an fp32 accumulator summed by the halving tree of core/cpu/ops/lane_sum.h:
// (j, j+8), (j, j+4), (j, j+2), (j, j+1), the same for every tile shape and kernel.
static inline float ReduceLanes(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

// ReduceLanes of four accumulators at once, [a, b, c, d]: the same additions, each with the same
// operands in the same order (so the same bits, NaN payloads included), four to a vector. The
// exact kernel's 4-wide tiles end every 512-wide K block with it: 16 operations for four sums
// where four ReduceLanes took 32 and four scalar loads and stores more.
static inline __m128 ReduceLanes4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // (j, j+8): lanes 0-7 of each input plus its lanes 8-15; two inputs to a vector.
  const __m512 ab =
      _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd =
      _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // (j, j+4): each input's first 128-bit part plus its second: one 128-bit part per input.
  const __m512 q =
      _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  // (j, j+2), then (j, j+1), within each part; each input's sum ends in its part's element 0.
  const __m512 h = _mm512_add_ps(q, _mm512_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 r = _mm512_add_ps(h, _mm512_shuffle_ps(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), r));
}

}  // namespace avx512
}  // namespace glmserve::internal
