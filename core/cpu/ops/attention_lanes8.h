// The lane tree of LaneDot<8> (core/cpu/ops/lane_sum.h), for one register and for eight rows at
// once, in 8-wide registers: what the AVX2 and AVX-512 attention loops and softmaxes share
// (attention_avx2.cc, attention_avx512.cc, softmax_avx2.cc, softmax_avx512.cc). Include only from
// files compiled for AVX2 or later; the functions have internal linkage, so each ISA's file keeps
// its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace glmserve::internal {
namespace lanes8 {

// The 8 lanes of one register summed by the tree: (j, j+4), (j, j+2), (j, j+1).
static inline float SumOfLanes(__m256 lane) {
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(lane), _mm256_extractf128_ps(lane, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

// LaneDot8 of 8 rows at once (acc[i]: row i's 8 lanes), the same tree for each: lanes (j, j+4)
// by adding the 128-bit halves, (j, j+2) and (j, j+1) by shuffles across pairs of rows. The adds
// are the same IEEE operations on the same operands as LaneDot8's (only their order in the
// program differs), so each result has its bits. Returns the 8 sums in row order.
static inline __m256 ReduceEight(const __m256 acc[8]) {
  __m256 half[4];  // [rows 2i | 2i + 1]: lanes j + j+4
  for (int i = 0; i < 4; ++i) {
    const __m256 lo = _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x20);
    const __m256 hi = _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x31);
    half[i] = _mm256_add_ps(lo, hi);
  }
  __m256 quarter[2];  // rows (4i, 4i+2 | 4i+1, 4i+3): lanes (j, j+2) for j = 0, 1
  for (int i = 0; i < 2; ++i) {
    const __m256 a = _mm256_shuffle_ps(half[2 * i], half[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 b = _mm256_shuffle_ps(half[2 * i], half[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    quarter[i] = _mm256_add_ps(a, b);
  }
  // Rows (0, 2, 4, 6 | 1, 3, 5, 7): lane 0 + lane 1.
  const __m256 a = _mm256_shuffle_ps(quarter[0], quarter[1], _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 b = _mm256_shuffle_ps(quarter[0], quarter[1], _MM_SHUFFLE(3, 1, 3, 1));
  return _mm256_permutevar8x32_ps(_mm256_add_ps(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Scores of 8 consecutive positions whose rows lie kv_dim apart from k, head_dim a multiple
// of 8, for R query rows q[r] (scores[r] gets row r's 8): eight independent lane chains per
// row, where one position at a time waits on its own chain, and each key vector, loaded once
// into a register, serves the R rows, where one row at a time loaded every key once per row.
// A row's chains and tree are the same whatever R: the same bits.
template <int R>
static inline void ScoresOfEightRows(const float* const* q, const float* k, int64_t kv_dim,
                                     int64_t head_dim, float scale, float* const* scores) {
  __m256 acc[R][8];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < 8; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  for (int64_t d = 0; d < head_dim; d += 8) {
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + d);
    for (int i = 0; i < 8; ++i) {
      __m256 kv = _mm256_loadu_ps(k + i * kv_dim + d);
      // Into a register, once: otherwise GCC folds the load into each row's multiply.
      if constexpr (R > 1) __asm__("" : "+v"(kv));
      for (int r = 0; r < R; ++r) acc[r][i] = _mm256_add_ps(acc[r][i], _mm256_mul_ps(qv[r], kv));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(scores[r], _mm256_mul_ps(ReduceEight(acc[r]), _mm256_set1_ps(scale)));
  }
}

// ScoresOfEightRows for one query row.
static inline void ScoresOfEight(const float* q, const float* k, int64_t kv_dim, int64_t head_dim,
                                 float scale, float* scores) {
  ScoresOfEightRows<1>(&q, k, kv_dim, head_dim, scale, &scores);
}

}  // namespace lanes8
}  // namespace glmserve::internal
