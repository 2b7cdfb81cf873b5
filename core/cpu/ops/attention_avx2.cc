// PagedAttention's fp32 scores and weighted sums on AVX2 (x86-64 without AVX-512; the dispatch
// is in attention.cc). The portable code's operations in its order, in 8-wide registers, so
// the three versions give the same bits (attention_test checks it): a score is LaneDot<8>
// (a mul and an add per product into 8 lanes, the lane tree after; here 8 positions at a time,
// their trees made by shuffles across the 8), an output element adds w_p * v_p[d] for
// p = begin, begin + 1, ... onto its running value, +0 at first (the build forbids contraction
// into FMAs).
#include <immintrin.h>

#include "core/cpu/ops/attention_lanes8.h"
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
  return lanes8::SumOfLanes(lane);
}

// Later positions' rows asked for ahead of use: each row is its own cache lines, kv_dim apart,
// and a lone row's loop otherwise waits on each load in turn (no effect on any result; past a
// block's end the address may lie in another block or outside the cache, which a prefetch,
// never faulting, only wastes).
constexpr int64_t kPrefetchAhead = 8;
inline void PrefetchRow(const float* row, int64_t n) {
  for (int64_t d = 0; d < n; d += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
  }
}

// The mask of the first `count` of 8 lanes, for maskload / maskstore.
inline __m256i FirstLanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), index);
}

// The weighted sum's chunk of V registers (the last masked by `last`), which stay in registers
// through each run of positions. (Updated in place through a lambda's capture, GCC kept them
// on the stack: every position's adds waited on a store and a reload.)
template <int V>
void SumChunk(const AttentionRows& rows, const float* probs, int64_t d0, int64_t width,
              __m256i last, float* out) {
  __m256 acc[V];
  for (int j = 0; j < V; ++j) {
    acc[j] =
        j + 1 < V ? _mm256_loadu_ps(out + d0 + 8 * j) : _mm256_maskload_ps(out + d0 + 8 * j, last);
  }
  // Packed rows are contiguous, which the hardware prefetchers follow.
  const bool prefetch = rows.packed == nullptr;
  const int64_t stride = rows.kv_dim, context = rows.context;
  rows.ForEachRun(true, [&](int64_t p0, const float* row, int64_t count) {
    __m256 a[V];
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) a[j] = acc[j];
    for (int64_t i = 0; i < count; ++i, row += stride) {
      const __m256 w = _mm256_set1_ps(probs[p0 + i]);
      const float* v = row + d0;
      if (prefetch && p0 + i + kPrefetchAhead < context) {
        PrefetchRow(v + kPrefetchAhead * stride, width);
      }
#pragma GCC unroll 8
      for (int j = 0; j + 1 < V; ++j) {
        a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(w, _mm256_loadu_ps(v + 8 * j)));
      }
      a[V - 1] =
          _mm256_add_ps(a[V - 1], _mm256_mul_ps(w, _mm256_maskload_ps(v + 8 * (V - 1), last)));
    }
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[j] = a[j];
  });
  for (int j = 0; j < V; ++j) {
    if (j + 1 < V) {
      _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
    } else {
      _mm256_maskstore_ps(out + d0 + 8 * j, last, acc[j]);
    }
  }
}

using SumChunkFn = void (*)(const AttentionRows&, const float*, int64_t, int64_t, __m256i, float*);
constexpr SumChunkFn kSumChunks[8] = {SumChunk<1>, SumChunk<2>, SumChunk<3>, SumChunk<4>,
                                      SumChunk<5>, SumChunk<6>, SumChunk<7>, SumChunk<8>};

}  // namespace

void AttentionScoresAvx2(const AttentionRows& rows, const float* q, float scale, float* scores) {
  const int64_t hd = rows.head_dim, kv_dim = rows.kv_dim;
  const bool prefetch = rows.packed == nullptr;  // as in SumChunk
  rows.ForEachRun(false, [&](int64_t p, const float* k, int64_t count) {
    int64_t i = 0;
    if (hd % 8 == 0) {
      for (; i + 8 <= count; i += 8) {
        if (prefetch && p + i + 8 + kPrefetchAhead <= rows.context) {
          for (int j = 0; j < 8; ++j) PrefetchRow(k + (i + kPrefetchAhead + j) * kv_dim, hd);
        }
        lanes8::ScoresOfEight(q, k + i * kv_dim, kv_dim, hd, scale, scores + p + i);
      }
    }
    for (; i < count; ++i) scores[p + i] = LaneDot8(q, k + i * kv_dim, hd) * scale;
  });
}

void AttentionWeightedSumAvx2(const AttentionRows& rows, const float* probs, float* out) {
  constexpr int64_t kChunk = 64;  // 8 registers
  for (int64_t d0 = 0; d0 < rows.head_dim; d0 += kChunk) {
    const int64_t width = std::min<int64_t>(kChunk, rows.head_dim - d0);
    const int64_t vecs = (width + 7) / 8;
    kSumChunks[vecs - 1](rows, probs, d0, width, FirstLanes(width % 8 == 0 ? 8 : width % 8), out);
  }
}

}  // namespace glmserve::internal
