// PagedAttention's fp32 scores and weighted sums on AVX2 (x86-64 without AVX-512; the dispatch
// is in attention.cc). The portable code's operations in its order, in 8-wide registers, so
// the three versions give the same bits (attention_test checks it): a score is LaneDot<8>
// (a mul and an add per product into 8 lanes, the lane tree after), an output element adds
// w_p * v_p[d] for p = 0, 1, ... onto +0 (the build forbids contraction into FMAs).
#include <immintrin.h>

#include "core/cpu/ops/attention_simd.h"

namespace glmserve::internal {
namespace {

// LaneDot<8>(a, b, n): lane j takes a[i + j] b[i + j] for i = 0, 8, ...; a tail's products go
// to their own lanes one by one (the others are left alone); then (j, j+4), (j, j+2), (j, j+1).
inline float LaneDot8(const float* a, const float* b, int64_t n) {
  __m256 lane = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lane = _mm256_add_ps(lane, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) {
    alignas(32) float l[8];
    _mm256_store_ps(l, lane);
    for (int64_t j = 0; i + j < n; ++j) {
      const float p = a[i + j] * b[i + j];
      l[j] += p;
    }
    lane = _mm256_load_ps(l);
  }
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(lane), _mm256_extractf128_ps(lane, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

// The mask of the first `count` of 8 lanes, for maskload / maskstore.
inline __m256i FirstLanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), index);
}

}  // namespace

void AttentionScoresAvx2(const AttentionRows& rows, const float* q, float scale, float* scores) {
  for (int64_t p = 0; p < rows.context; ++p) {
    scores[p] = LaneDot8(q, rows.Key(p), rows.head_dim) * scale;
  }
}

void AttentionWeightedSumAvx2(const AttentionRows& rows, const float* probs, float* out) {
  // Chunks of up to 8 registers of the output row stay in registers through all positions.
  constexpr int64_t kChunk = 64;
  for (int64_t d0 = 0; d0 < rows.head_dim; d0 += kChunk) {
    const int64_t width = std::min<int64_t>(kChunk, rows.head_dim - d0);
    const int64_t vecs = (width + 7) / 8;
    const __m256i last = FirstLanes(width % 8 == 0 ? 8 : width % 8);
    __m256 acc[8];
    for (int64_t j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t p = 0; p < rows.context; ++p) {
      const __m256 w = _mm256_set1_ps(probs[p]);
      const float* v = rows.Value(p) + d0;
      for (int64_t j = 0; j < vecs; ++j) {
        const __m256 vv =
            j + 1 < vecs ? _mm256_loadu_ps(v + 8 * j) : _mm256_maskload_ps(v + 8 * j, last);
        acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(w, vv));
      }
    }
    for (int64_t j = 0; j < vecs; ++j) {
      if (j + 1 < vecs) {
        _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
      } else {
        _mm256_maskstore_ps(out + d0 + 8 * j, last, acc[j]);
      }
    }
  }
}

}  // namespace glmserve::internal
