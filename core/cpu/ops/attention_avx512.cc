// PagedAttention's fp32 scores and weighted sums on AVX-512 (the dispatch is in attention.cc).
// The same operations in the same order as the portable code there, only in wider registers,
// so the two give the same bits (attention_test checks it): a score is LaneDot<8>
// (core/cpu/ops/lane_sum.h: 8 lanes over k, a mul and an add each, then the lane tree), and an
// output element adds w_p * v_p[d] for p = 0, 1, ... onto +0, a mul and an add each (the build
// forbids contraction into FMAs). As in every *_avx512.cc file, the only shared-header inline
// code compiled with this file's ISA is trivial accessors (KvCache::keys / values, std::min) and
// attention_lanes8.h's functions, which have internal linkage.
//
// Both loops are the AVX2 file's, widened: scores of 8 positions at a time (independent lane
// chains, one tree in a register) and the weighted sum's registers kept out of the lambda's
// capture. One position at a time, a score waited on its own chain of 16 adds, and the sum's
// registers lived on the stack: prefill of 2,048 tokens took 2.05 s where it now takes 1.00 s
// on a Zen 4 VM (bench/attention_bench, docs/performance.md). The multi-row forms (the *Rows
// functions, which PagedAttention calls) then load each packed key and value vector once for
// two or three query rows that read the same positions: 1.00 -> 0.76 s on two threads there.
#include <immintrin.h>

#include <algorithm>

#include "core/cpu/ops/attention_lanes8.h"
#include "core/cpu/ops/attention_simd.h"

namespace glmserve::internal {
namespace {

// LaneDot<8>(a, b_r, n) for R rows b_r = b + r ldb at once: lane j of 8 takes a[i + j] b[i + j]
// for i = 0, 8, ...; the tail's missing lanes are left alone (masked), not given +0; then the
// tree. Each row's lanes are its own chain, exactly a lone LaneDot<8>'s: several rows at once
// only overlap their chains. One row's chain of adds held the scores loop to the add latency,
// 16 dependent adds per 128-wide score.
template <int R>
inline void LaneDot8Rows(const float* a, const float* b, int64_t ldb, int64_t n, float scale,
                         float* out) {
  __m256 lane[R];
  for (int r = 0; r < R; ++r) lane[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i);
    for (int r = 0; r < R; ++r) {
      lane[r] = _mm256_add_ps(lane[r], _mm256_mul_ps(av, _mm256_loadu_ps(b + r * ldb + i)));
    }
  }
  if (i < n) {
    const __mmask8 m = static_cast<__mmask8>((1u << (n - i)) - 1);
    const __m256 av = _mm256_maskz_loadu_ps(m, a + i);
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_mul_ps(av, _mm256_maskz_loadu_ps(m, b + r * ldb + i));
      lane[r] = _mm256_mask_add_ps(lane[r], m, lane[r], p);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = lanes8::SumOfLanes(lane[r]) * scale;
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

// The weighted sum's chunk of V registers of 16 (the last masked by `last`), which stay in
// registers through each run of positions. Updated in place through the lambda's capture (and
// indexed by a run-time count), GCC kept them on the stack, and every position's adds waited
// on a store and a reload.
template <int V>
void SumChunk(const AttentionRows& rows, const float* probs, int64_t d0, __mmask16 last,
              float* out) {
  __m512 acc[V];
  for (int j = 0; j < V; ++j) {
    acc[j] = j + 1 < V ? _mm512_loadu_ps(out + d0 + 16 * j)
                       : _mm512_maskz_loadu_ps(last, out + d0 + 16 * j);
  }
  // Packed rows are contiguous, which the hardware prefetchers follow.
  const bool prefetch = rows.packed == nullptr;
  const int64_t stride = rows.kv_dim, context = rows.context, width = 16 * V;
  rows.ForEachRun(true, [&](int64_t p0, const float* row, int64_t count) {
    __m512 a[V];
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) a[j] = acc[j];
    for (int64_t i = 0; i < count; ++i, row += stride) {
      const __m512 w = _mm512_set1_ps(probs[p0 + i]);
      const float* v = row + d0;
      if (prefetch && p0 + i + kPrefetchAhead < context) {
        PrefetchRow(v + kPrefetchAhead * stride, width);
      }
#pragma GCC unroll 8
      for (int j = 0; j + 1 < V; ++j) {
        a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(w, _mm512_loadu_ps(v + 16 * j)));
      }
      a[V - 1] =
          _mm512_add_ps(a[V - 1], _mm512_mul_ps(w, _mm512_maskz_loadu_ps(last, v + 16 * (V - 1))));
    }
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[j] = a[j];
  });
  for (int j = 0; j < V; ++j) {
    if (j + 1 < V) {
      _mm512_storeu_ps(out + d0 + 16 * j, acc[j]);
    } else {
      _mm512_mask_storeu_ps(out + d0 + 16 * j, last, acc[j]);
    }
  }
}

using SumChunkFn = void (*)(const AttentionRows&, const float*, int64_t, __mmask16, float*);
constexpr SumChunkFn kSumChunks[8] = {SumChunk<1>, SumChunk<2>, SumChunk<3>, SumChunk<4>,
                                      SumChunk<5>, SumChunk<6>, SumChunk<7>, SumChunk<8>};

// SumChunk for R rows that read the same packed (contiguous) positions: each value vector is
// loaded once for the R rows' accumulators (R V registers), where one row at a time loaded
// the block once per row and the loop waited on its loads (0.6 of the FMA peak on a Zen 4 core
// against 0.7 for R = 3, bench/attention_bench). Each element's chain is a lone row's: the
// same bits. One array per row, loaded and stored array by array: a [R][V] array, or pointers
// to the rows' arrays, made GCC keep the registers on the stack, a store per add.
template <int R, int V>
void SumChunkRows(const AttentionRows& rows, const float* const* probs, int64_t d0, __mmask16 last,
                  float* const* out, LinesAhead* lines_ahead) {
  static_assert(R >= 1 && R <= 3 && R * V <= 24);
  __m512 a0[V], a1[V], a2[V];
  auto load = [&](__m512* a, const float* o) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      a[j] = j + 1 < V ? _mm512_loadu_ps(o + d0 + 16 * j)
                       : _mm512_maskz_loadu_ps(last, o + d0 + 16 * j);
    }
  };
  auto store = [&](const __m512* a, float* o) {
#pragma GCC unroll 8
    for (int j = 0; j < V; ++j) {
      if (j + 1 < V) {
        _mm512_storeu_ps(o + d0 + 16 * j, a[j]);
      } else {
        _mm512_mask_storeu_ps(o + d0 + 16 * j, last, a[j]);
      }
    }
  };
  load(a0, out[0]);
  if constexpr (R > 1) load(a1, out[1]);
  if constexpr (R > 2) load(a2, out[2]);
  const int64_t stride = rows.kv_dim;
  LinesAhead ahead = *lines_ahead;  // a local: in registers
  rows.ForEachRun(true, [&](int64_t p, const float* v, int64_t count) {
    const float* w0 = probs[0] + p;
    const float* w1 = probs[R > 1 ? 1 : 0] + p;
    const float* w2 = probs[R > 2 ? 2 : 0] + p;
    v += d0;
    for (int64_t i = 0; i < count; ++i, v += stride) {
      ahead.Prefetch();
      ahead.Prefetch();
      const __m512 b0 = _mm512_set1_ps(w0[i]);
      const __m512 b1 = _mm512_set1_ps(w1[i]);
      const __m512 b2 = _mm512_set1_ps(w2[i]);
#pragma GCC unroll 8
      for (int j = 0; j < V; ++j) {
        __m512 x =
            j + 1 < V ? _mm512_loadu_ps(v + 16 * j) : _mm512_maskz_loadu_ps(last, v + 16 * j);
        // Into a register, once: otherwise GCC folds the load into each row's multiply.
        if constexpr (R > 1) __asm__("" : "+v"(x));
        a0[j] = _mm512_add_ps(a0[j], _mm512_mul_ps(b0, x));
        if constexpr (R > 1) a1[j] = _mm512_add_ps(a1[j], _mm512_mul_ps(b1, x));
        if constexpr (R > 2) a2[j] = _mm512_add_ps(a2[j], _mm512_mul_ps(b2, x));
      }
    }
  });
  *lines_ahead = ahead;
  store(a0, out[0]);
  if constexpr (R > 1) store(a1, out[1]);
  if constexpr (R > 2) store(a2, out[2]);
}

using SumChunkRowsFn = void (*)(const AttentionRows&, const float* const*, int64_t, __mmask16,
                                float* const*, LinesAhead*);
// [R - 1][V - 1]: three rows at a time up to V = 8 (24 accumulators).
constexpr SumChunkRowsFn kSumChunkRows[3][8] = {
    {SumChunkRows<1, 1>, SumChunkRows<1, 2>, SumChunkRows<1, 3>, SumChunkRows<1, 4>,
     SumChunkRows<1, 5>, SumChunkRows<1, 6>, SumChunkRows<1, 7>, SumChunkRows<1, 8>},
    {SumChunkRows<2, 1>, SumChunkRows<2, 2>, SumChunkRows<2, 3>, SumChunkRows<2, 4>,
     SumChunkRows<2, 5>, SumChunkRows<2, 6>, SumChunkRows<2, 7>, SumChunkRows<2, 8>},
    {SumChunkRows<3, 1>, SumChunkRows<3, 2>, SumChunkRows<3, 3>, SumChunkRows<3, 4>,
     SumChunkRows<3, 5>, SumChunkRows<3, 6>, SumChunkRows<3, 7>, SumChunkRows<3, 8>}};

// f(d0, vecs, last) for each 128-wide chunk of a head_dim-wide row: 8 registers of 16 at most
// (the weighted sums keep a chunk's accumulators in registers), the last masked by `last`.
template <typename F>
void ForEachChunk(int64_t head_dim, F&& f) {
  constexpr int64_t kChunk = 128;
  for (int64_t d0 = 0; d0 < head_dim; d0 += kChunk) {
    const int64_t width = std::min<int64_t>(kChunk, head_dim - d0);
    const int64_t vecs = (width + 15) / 16, tail = width - 16 * (vecs - 1);
    f(d0, vecs, static_cast<__mmask16>(tail == 16 ? 0xffff : (1u << tail) - 1));
  }
}

}  // namespace

void AttentionScoresAvx512(const AttentionRows& rows, const float* q, float scale, float* scores) {
  const int64_t hd = rows.head_dim, ld = rows.kv_dim;
  const bool prefetch = rows.packed == nullptr;  // as in SumChunk
  rows.ForEachRun(false, [&](int64_t p, const float* k, int64_t count) {
    int64_t i = 0;
    // Eight positions at a time, their lane trees in one register (lanes8::ReduceEight); a
    // ragged head dim four at a time with masked tails.
    if (hd % 8 == 0) {
      for (; i + 8 <= count; i += 8) {
        if (prefetch && p + i + 8 + kPrefetchAhead <= rows.context) {
          for (int j = 0; j < 8; ++j) PrefetchRow(k + (i + kPrefetchAhead + j) * ld, hd);
        }
        lanes8::ScoresOfEight(q, k + i * ld, ld, hd, scale, scores + p + i);
      }
    }
    for (; i + 4 <= count; i += 4) {
      if (prefetch && p + i + 4 + kPrefetchAhead <= rows.context) {
        for (int j = 0; j < 4; ++j) PrefetchRow(k + (i + kPrefetchAhead + j) * ld, hd);
      }
      LaneDot8Rows<4>(q, k + i * ld, ld, hd, scale, scores + p + i);
    }
    for (; i < count; ++i) {
      if (prefetch && p + i + kPrefetchAhead < rows.context)
        PrefetchRow(k + (i + kPrefetchAhead) * ld, hd);
      LaneDot8Rows<1>(q, k + i * ld, ld, hd, scale, scores + p + i);
    }
  });
}

void AttentionWeightedSumAvx512(const AttentionRows& rows, const float* probs, float* out) {
  ForEachChunk(rows.head_dim, [&](int64_t d0, int64_t vecs, __mmask16 last) {
    kSumChunks[vecs - 1](rows, probs, d0, last, out);
  });
}

void AttentionScoresRowsAvx512(const AttentionRows& rows, int64_t n, const float* const* q,
                               float scale, float* const* scores) {
  constexpr int kLinesPerCall = 12;
  const int64_t hd = rows.head_dim, ld = rows.kv_dim;
  if (hd % 8 != 0) {
    for (int64_t r = 0; r < n; ++r) AttentionScoresAvx512(rows, q[r], scale, scores[r]);
    return;
  }
  // Eight positions at a time (their keys, 4 KiB at a 128-wide head, stay in L1 for all n
  // rows), two rows at a time: 16 lane chains, where three rows' 24 left GCC too few registers
  // and it kept a query vector on the stack. The keys are packed, or read in place (ld apart).
  LinesAhead ahead = rows.ahead != nullptr ? *rows.ahead : LinesAhead{};
  rows.ForEachRun(false, [&](int64_t p, const float* k, int64_t count) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
      float* s[2];
      int64_t r = 0;
      for (; r + 2 <= n; r += 2) {
        // A 128-wide block's next fp32 rows are 512 lines; 48 calls of two rows take it at
        // GLM's 12 rows a run.
        for (int l = 0; l < kLinesPerCall; ++l) ahead.Prefetch();
        s[0] = scores[r] + p + i;
        s[1] = scores[r + 1] + p + i;
        lanes8::ScoresOfEightRows<2>(q + r, k + i * ld, ld, hd, scale, s);
      }
      if (r < n) {
        s[0] = scores[r] + p + i;
        lanes8::ScoresOfEightRows<1>(q + r, k + i * ld, ld, hd, scale, s);
      }
    }
    for (; i < count; ++i) {
      for (int64_t r = 0; r < n; ++r) {
        LaneDot8Rows<1>(q[r], k + i * ld, ld, hd, scale, scores[r] + p + i);
      }
    }
  });
  if (rows.ahead != nullptr) *rows.ahead = ahead;
}

void AttentionWeightedSumRowsAvx512(const AttentionRows& rows, int64_t n, const float* const* probs,
                                    float* const* out) {
  LinesAhead none;
  LinesAhead* ahead = rows.ahead != nullptr ? rows.ahead : &none;
  ForEachChunk(rows.head_dim, [&](int64_t d0, int64_t vecs, __mmask16 last) {
    for (int64_t r = 0; r < n;) {
      const int64_t take = std::min<int64_t>(3, n - r);
      kSumChunkRows[take - 1][vecs - 1](rows, probs + r, d0, last, out + r, ahead);
      r += take;
    }
  });
}

}  // namespace glmserve::internal
