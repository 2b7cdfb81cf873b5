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

}  // namespace avx512
}  // namespace glmserve::internal
