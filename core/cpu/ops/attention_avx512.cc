// PagedAttention's fp32 scores and weighted sums on AVX-512 (the dispatch is in attention.cc).
// The same operations in the same order as the portable code there, only in wider registers,
// so the two give the same bits (attention_test checks it): a score is LaneDot<8>
// (core/cpu/ops/lane_sum.h: 8 lanes over k, a mul and an add each, then the lane tree), and an
// output element adds w_p * v_p[d] for p = 0, 1, ... onto +0, a mul and an add each (the build
// forbids contraction into FMAs). As in every *_avx512.cc file, the only shared-header inline
// code compiled with this file's ISA is trivial accessors (KvCache::keys / values, std::min).
#include <immintrin.h>

#include "core/cpu/ops/attention_simd.h"

namespace glmserve::internal {
namespace {

// LaneDot<8>(a, b, n): lane j of 8 takes a[i + j] b[i + j] for i = 0, 8, ...; the tail's
// missing lanes are left alone (masked), not given +0; then (j, j+4), (j, j+2), (j, j+1).
inline float LaneDot8(const float* a, const float* b, int64_t n) {
  __m256 lane = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lane = _mm256_add_ps(lane, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) {
    const __mmask8 m = static_cast<__mmask8>((1u << (n - i)) - 1);
    const __m256 p =
        _mm256_mul_ps(_mm256_maskz_loadu_ps(m, a + i), _mm256_maskz_loadu_ps(m, b + i));
    lane = _mm256_mask_add_ps(lane, m, lane, p);
  }
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(lane), _mm256_extractf128_ps(lane, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

// A head's slice of each cached position sits in its own 4 KiB page (rows are kv_dim wide),
// where the hardware prefetchers do not follow: ask for a later position's slice (no effect
// on any result; past a block's end the address may lie in another block or outside the
// cache, which a prefetch, never faulting, only wastes).
constexpr int64_t kPrefetchAhead = 4;
inline void PrefetchRow(const float* row, int64_t n) {
  for (int64_t d = 0; d < n; d += 16)
    _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
}

}  // namespace

void AttentionScoresAvx512(const AttentionRows& rows, const float* q, float scale, float* scores) {
  rows.ForEach(false, [&](int64_t p, const float* k) {
    if (p + kPrefetchAhead < rows.context)
      PrefetchRow(k + kPrefetchAhead * rows.kv_dim, rows.head_dim);
    scores[p] = LaneDot8(q, k, rows.head_dim) * scale;
  });
}

void AttentionWeightedSumAvx512(const AttentionRows& rows, const float* probs, float* out) {
  // Chunks of up to 8 registers of the output row stay in registers through all positions.
  constexpr int64_t kChunk = 128;
  for (int64_t d0 = 0; d0 < rows.head_dim; d0 += kChunk) {
    const int64_t width = std::min<int64_t>(kChunk, rows.head_dim - d0);
    const int64_t vecs = (width + 15) / 16;
    __mmask16 last = static_cast<__mmask16>(width % 16 == 0 ? 0xffff : (1u << (width % 16)) - 1);
    __m512 acc[8];
    for (int64_t j = 0; j < vecs; ++j) {
      acc[j] = j + 1 < vecs ? _mm512_loadu_ps(out + d0 + 16 * j)
                            : _mm512_maskz_loadu_ps(last, out + d0 + 16 * j);
    }
    rows.ForEach(true, [&](int64_t p, const float* row) {
      const float* v = row + d0;
      if (p + kPrefetchAhead < rows.context) PrefetchRow(v + kPrefetchAhead * rows.kv_dim, width);
      const __m512 w = _mm512_set1_ps(probs[p]);
      for (int64_t j = 0; j < vecs; ++j) {
        const __m512 vv =
            j + 1 < vecs ? _mm512_loadu_ps(v + 16 * j) : _mm512_maskz_loadu_ps(last, v + 16 * j);
        acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(w, vv));
      }
    });
    for (int64_t j = 0; j < vecs; ++j) {
      if (j + 1 < vecs) {
        _mm512_storeu_ps(out + d0 + 16 * j, acc[j]);
      } else {
        _mm512_mask_storeu_ps(out + d0 + 16 * j, last, acc[j]);
      }
    }
  }
}

}  // namespace glmserve::internal
