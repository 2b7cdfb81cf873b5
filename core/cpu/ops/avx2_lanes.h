// What the AVX2 linear kernels share (linear_avx2.cc, linear_int8_avx2.cc): the one lane tree
// that ends every output element's sum, for the 16 lanes of the arithmetic held as two 8-wide
// registers. Include only from files compiled for AVX2 (core/CMakeLists.txt); the function has
// internal linkage so that each ISA's file keeps its own copy.
#pragma once

#include <immintrin.h>

namespace glmserve::internal::avx2 {

// Lanes 0-7 (lo) and 8-15 (hi) summed by the halving tree of core/cpu/ops/lane_sum.h:
// (j, j+8), (j, j+4), (j, j+2), (j, j+1), as avx512::ReduceLanes does for one 16-wide register.
static inline float ReduceLanes(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

}  // namespace glmserve::internal::avx2
