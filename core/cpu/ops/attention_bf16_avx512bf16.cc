// PagedAttentionBf16's packing (AVX-512) and loops (AVX512_BF16's vdpbf16ps); attention_bf16.cc
// has the portable forms that define the bits, and the driver. Neither loop sums across lanes:
// the scores' lanes are 16 positions (keys packed transposed), the weighted sum's 16 head dims.
#include <immintrin.h>

#include <algorithm>

#include "core/cpu/ops/attention_bf16.h"
#include "core/cpu/ops/attention_items.h"
#include "core/cpu/ops/bf16_pack_avx512.h"

namespace glmserve::internal {
namespace {

// The rows of positions [begin, context) of `rows`, from the cache.
template <typename T>
int64_t RowPointers(const AttentionRows& rows, bool values, const T** ptr) {
  rows.ForEach<T>(values, [&](int64_t p, const T* row) { ptr[p - rows.begin] = row; });
  return rows.context - rows.begin;
}

// 32 elements of a cached row as 16 bf16 pairs: an fp32 cache's rounded, a bf16 cache's loaded.
inline __m512i Pairs32(const float* row) { return Bf16Pairs32(row, 32); }
inline __m512i Pairs32(const uint16_t* row) { return _mm512_loadu_si512(row); }
// 16 elements of a cached row as bf16 bits in the low halves of 16 dwords.
inline __m512i Bf16Lanes16(const float* row) { return RoundToBf16Lanes(_mm512_loadu_ps(row)); }
inline __m512i Bf16Lanes16(const uint16_t* row) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
}

// 16 positions x 16 key pairs at a time: each position's 32 dims as 16 pairs (one register a
// position), then one 16 x 16 dword transpose gives each pair's 16 positions.
template <typename T>
void PackKeysFrom(const AttentionRows& rows, uint32_t* keys) {
  const int64_t hd = rows.head_dim;
  const T* ptr[kPositionBlock];
  const int64_t n = RowPointers(rows, false, ptr);
  for (int64_t g = 0; 16 * g < n; ++g) {
    const int64_t count = std::min<int64_t>(16, n - 16 * g);
    for (int64_t j = 16 * (g + 1); j < std::min(n, 16 * (g + 2)); ++j) {
      for (int64_t d = 0; d < hd; d += 64 / sizeof(T)) __builtin_prefetch(ptr[j] + d);
    }
    for (int64_t c = 0; c < hd / 32; ++c) {
      __m512i t[16];
      for (int64_t j = 0; j < 16; ++j) {
        t[j] = j < count ? Pairs32(ptr[16 * g + j] + 32 * c) : _mm512_setzero_si512();
      }
      Transpose16x16(t);
      for (int64_t i = 0; i < 16; ++i) {
        _mm512_storeu_si512(keys + (16 * c + i) * kPositionBlock + 16 * g, t[i]);
      }
    }
  }
}

// Two positions' values into the low and high halves of each dword.
template <typename T>
void PackValuesFrom(const AttentionRows& rows, uint32_t* values) {
  const int64_t hd = rows.head_dim;
  const T* ptr[kPositionBlock];
  const int64_t n = RowPointers(rows, true, ptr);
  for (int64_t j = 0; 2 * j < n; ++j) {
    const T* lo = ptr[2 * j];
    const T* hi = 2 * j + 1 < n ? ptr[2 * j + 1] : nullptr;
    if (2 * j + 5 < n) {
      for (int64_t d = 0; d < hd; d += 64 / sizeof(T)) {
        __builtin_prefetch(ptr[2 * j + 4] + d);
        __builtin_prefetch(ptr[2 * j + 5] + d);
      }
    }
    for (int64_t d = 0; d < hd; d += 16) {
      const __m512i l = Bf16Lanes16(lo + d);
      const __m512i h =
          hi != nullptr ? _mm512_slli_epi32(Bf16Lanes16(hi + d), 16) : _mm512_setzero_si512();
      _mm512_storeu_si512(values + j * hd + d, _mm512_or_si512(l, h));
    }
  }
}

// Scores of R rows against positions [0, 16 G) of the block: lanes along positions, one
// vdpbf16ps per q pair and 16 keys, each key vector loaded once for the R rows. One array per
// row (a [R][G] array made GCC keep the accumulators on the stack in the fp32 loops).
template <int R, int G>
void ScoresRows(const Bf16Block& b, const uint32_t* const* q, float scale, float* const* scores) {
  static_assert(R >= 1 && R <= 4 && G >= 1 && G <= 4);
  __m512 a0[G], a1[G], a2[G], a3[G];
  for (int g = 0; g < G; ++g) a0[g] = a1[g] = a2[g] = a3[g] = _mm512_setzero_ps();
  const uint32_t* q0 = q[0];
  const uint32_t* q1 = q[R > 1 ? 1 : 0];
  const uint32_t* q2 = q[R > 2 ? 2 : 0];
  const uint32_t* q3 = q[R > 3 ? 3 : 0];
  const uint32_t* k = b.keys;
  LinesAhead ahead = b.ahead != nullptr ? *b.ahead : LinesAhead{};  // a local: in registers
  for (int64_t i = 0; i < b.key_pairs; ++i, k += kPositionBlock) {
    ahead.Prefetch();
    ahead.Prefetch();
    const __m512bh b0 = (__m512bh)_mm512_set1_epi32(static_cast<int>(q0[i]));
    const __m512bh b1 = (__m512bh)_mm512_set1_epi32(static_cast<int>(q1[i]));
    const __m512bh b2 = (__m512bh)_mm512_set1_epi32(static_cast<int>(q2[i]));
    const __m512bh b3 = (__m512bh)_mm512_set1_epi32(static_cast<int>(q3[i]));
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m512i x = _mm512_loadu_si512(k + 16 * g);
      // Into a register, once: otherwise GCC folds the load into each row's vdpbf16ps.
      if constexpr (R > 1) __asm__("" : "+v"(x));
      a0[g] = _mm512_dpbf16_ps(a0[g], b0, (__m512bh)x);
      if constexpr (R > 1) a1[g] = _mm512_dpbf16_ps(a1[g], b1, (__m512bh)x);
      if constexpr (R > 2) a2[g] = _mm512_dpbf16_ps(a2[g], b2, (__m512bh)x);
      if constexpr (R > 3) a3[g] = _mm512_dpbf16_ps(a3[g], b3, (__m512bh)x);
    }
  }
  if (b.ahead != nullptr) *b.ahead = ahead;
  const __m512 s = _mm512_set1_ps(scale);
  const int64_t len = b.end - b.p0;
  auto store = [&](const __m512* a, float* out) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      _mm512_mask_storeu_ps(out + b.p0 + 16 * g, FirstLanes16(len - 16 * g),
                            _mm512_mul_ps(a[g], s));
    }
  };
  store(a0, scores[0]);
  if constexpr (R > 1) store(a1, scores[1]);
  if constexpr (R > 2) store(a2, scores[2]);
  if constexpr (R > 3) store(a3, scores[3]);
}

using ScoresRowsFn = void (*)(const Bf16Block&, const uint32_t* const*, float, float* const*);
// [R - 1][G - 1]: four rows at a time, up to the block's 64 positions (16 accumulators).
constexpr ScoresRowsFn kScoresRows[4][4] = {
    {ScoresRows<1, 1>, ScoresRows<1, 2>, ScoresRows<1, 3>, ScoresRows<1, 4>},
    {ScoresRows<2, 1>, ScoresRows<2, 2>, ScoresRows<2, 3>, ScoresRows<2, 4>},
    {ScoresRows<3, 1>, ScoresRows<3, 2>, ScoresRows<3, 3>, ScoresRows<3, 4>},
    {ScoresRows<4, 1>, ScoresRows<4, 2>, ScoresRows<4, 3>, ScoresRows<4, 4>}};
static_assert(kPositionBlock == 64, "kScoresRows covers 4 x 16 positions");

// The weighted sums of R rows over dims [d0, d0 + 16 V) (the last vector's lanes `last`) and the
// block's `pairs` position pairs: lanes along dims, one vdpbf16ps per probability pair and 16
// dims, each value vector loaded once for the R rows. `odd`: the last pair's second position
// is past the rows' own, its values read as +0.
template <int R, int V>
void SumRows(const Bf16Block& b, int64_t pairs, bool odd, const uint32_t* const* probs, int64_t d0,
             __mmask16 last, float* const* out) {
  static_assert(R >= 1 && R <= 3 && R * V <= 24);
  __m512 a0[V], a1[V], a2[V];
  auto load = [&](__m512* a, const float* o) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      a[v] = v + 1 < V ? _mm512_loadu_ps(o + d0 + 16 * v)
                       : _mm512_maskz_loadu_ps(last, o + d0 + 16 * v);
    }
  };
  auto store = [&](const __m512* a, float* o) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if (v + 1 < V) {
        _mm512_storeu_ps(o + d0 + 16 * v, a[v]);
      } else {
        _mm512_mask_storeu_ps(o + d0 + 16 * v, last, a[v]);
      }
    }
  };
  load(a0, out[0]);
  if constexpr (R > 1) load(a1, out[1]);
  if constexpr (R > 2) load(a2, out[2]);
  const uint32_t* p0 = probs[0];
  const uint32_t* p1 = probs[R > 1 ? 1 : 0];
  const uint32_t* p2 = probs[R > 2 ? 2 : 0];
  LinesAhead ahead = b.ahead != nullptr ? *b.ahead : LinesAhead{};
  const auto step = [&](int64_t j, __m512i keep) {
    ahead.Prefetch();
    ahead.Prefetch();
    const uint32_t* x_row = b.values + j * b.value_width + d0;
    const __m512bh w0 = (__m512bh)_mm512_set1_epi32(static_cast<int>(p0[j]));
    const __m512bh w1 = (__m512bh)_mm512_set1_epi32(static_cast<int>(p1[j]));
    const __m512bh w2 = (__m512bh)_mm512_set1_epi32(static_cast<int>(p2[j]));
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      __m512i x = _mm512_and_si512(_mm512_loadu_si512(x_row + 16 * v), keep);
      if constexpr (R > 1) __asm__("" : "+v"(x));
      a0[v] = _mm512_dpbf16_ps(a0[v], w0, (__m512bh)x);
      if constexpr (R > 1) a1[v] = _mm512_dpbf16_ps(a1[v], w1, (__m512bh)x);
      if constexpr (R > 2) a2[v] = _mm512_dpbf16_ps(a2[v], w2, (__m512bh)x);
    }
  };
  const int64_t full = pairs - (odd ? 1 : 0);
  const __m512i all = _mm512_set1_epi32(-1);
  for (int64_t j = 0; j < full; ++j) step(j, all);
  if (odd) step(full, _mm512_set1_epi32(0xffff));
  if (b.ahead != nullptr) *b.ahead = ahead;
  store(a0, out[0]);
  if constexpr (R > 1) store(a1, out[1]);
  if constexpr (R > 2) store(a2, out[2]);
}

using SumRowsFn = void (*)(const Bf16Block&, int64_t, bool, const uint32_t* const*, int64_t,
                           __mmask16, float* const*);
// [R - 1][V - 1]: three rows at a time up to V = 8 (24 accumulators).
constexpr SumRowsFn kSumRows[3][8] = {{SumRows<1, 1>, SumRows<1, 2>, SumRows<1, 3>, SumRows<1, 4>,
                                       SumRows<1, 5>, SumRows<1, 6>, SumRows<1, 7>, SumRows<1, 8>},
                                      {SumRows<2, 1>, SumRows<2, 2>, SumRows<2, 3>, SumRows<2, 4>,
                                       SumRows<2, 5>, SumRows<2, 6>, SumRows<2, 7>, SumRows<2, 8>},
                                      {SumRows<3, 1>, SumRows<3, 2>, SumRows<3, 3>, SumRows<3, 4>,
                                       SumRows<3, 5>, SumRows<3, 6>, SumRows<3, 7>, SumRows<3, 8>}};

// The weighted sums of R rows (a decode item's: one token's query heads of a KV head) over dims
// [d0, d0 + 32) straight from a bf16 cache's value rows (Bf16Block::value_rows), without the
// values' packing: each pair's two rows interleaved by vpunpcklwd / vpunpckhwd into the dwords
// vdpbf16ps takes, once for all R rows. Those interleave within 128-bit lanes, so accumulator 0
// of a row holds dims d0 + {0..3, 8..11, 16..19, 24..27} and accumulator 1 dims d0 + {4..7,
// 12..15, 20..23, 28..31}: the outputs are permuted into that order on load and back on store.
// Each lane's operations are the packed form's for its dim: the same bits. All rows in one pass
// and 32 dims a call, so that each cache line is read once: a position's rows lie a KV row apart
// (2 KiB on GLM-4.5-Air), in few L1 sets, and a block's lines do not stay in L1 between passes.
template <int R>
void SumRowsDirect(const Bf16Block& b, int64_t pairs, bool odd, const uint32_t* const* probs,
                   int64_t d0, float* const* out) {
  static_assert(R >= 1 && R <= kRunRows);
  __m512 a[R][2];
  {
    const __m512i even_dims =
        _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i odd_dims = _mm512_add_epi32(even_dims, _mm512_set1_epi32(4));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 lo = _mm512_loadu_ps(out[r] + d0), hi = _mm512_loadu_ps(out[r] + d0 + 16);
      a[r][0] = _mm512_permutex2var_ps(lo, even_dims, hi);
      a[r][1] = _mm512_permutex2var_ps(lo, odd_dims, hi);
    }
  }
  LinesAhead ahead = b.ahead != nullptr ? *b.ahead : LinesAhead{};
  // Pair j; `last_odd`: its second position is past the rows' own, read as +0 (never loaded).
  const auto step = [&](int64_t j, bool last_odd) {
    ahead.Prefetch();
    ahead.Prefetch();
    const __m512i lo = _mm512_loadu_si512(b.value_rows[2 * j] + d0);
    const __m512i hi =
        last_odd ? _mm512_setzero_si512() : _mm512_loadu_si512(b.value_rows[2 * j + 1] + d0);
    const __m512bh x0 = (__m512bh)_mm512_unpacklo_epi16(lo, hi);
    const __m512bh x1 = (__m512bh)_mm512_unpackhi_epi16(lo, hi);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(probs[r][j]));
      a[r][0] = _mm512_dpbf16_ps(a[r][0], w, x0);
      a[r][1] = _mm512_dpbf16_ps(a[r][1], w, x1);
    }
  };
  const int64_t full = pairs - (odd ? 1 : 0);
  for (int64_t j = 0; j < full; ++j) step(j, false);
  if (odd) step(full, true);
  if (b.ahead != nullptr) *b.ahead = ahead;
  const __m512i low_dims =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i high_dims = _mm512_add_epi32(low_dims, _mm512_set1_epi32(8));
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out[r] + d0, _mm512_permutex2var_ps(a[r][0], low_dims, a[r][1]));
    _mm512_storeu_ps(out[r] + d0 + 16, _mm512_permutex2var_ps(a[r][0], high_dims, a[r][1]));
  }
}

using SumRowsDirectFn = void (*)(const Bf16Block&, int64_t, bool, const uint32_t* const*, int64_t,
                                 float* const*);
constexpr SumRowsDirectFn kSumRowsDirect[kRunRows] = {
    SumRowsDirect<1>, SumRowsDirect<2>,  SumRowsDirect<3>,  SumRowsDirect<4>,
    SumRowsDirect<5>, SumRowsDirect<6>,  SumRowsDirect<7>,  SumRowsDirect<8>,
    SumRowsDirect<9>, SumRowsDirect<10>, SumRowsDirect<11>, SumRowsDirect<12>};
static_assert(kRunRows == 12, "kSumRowsDirect covers every run");

}  // namespace

void RoundPairsAvx512(const float* x, int64_t n, uint32_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t pairs = (std::min<int64_t>(32, n - i) + 1) / 2;
    _mm512_mask_storeu_epi32(out + i / 2, FirstLanes16(pairs), Bf16Pairs32(x + i, n - i));
  }
}

void PackKeysBf16Avx512(const AttentionRows& rows, uint32_t* keys) {
  if (rows.head_dim % 32 != 0) return PackKeysBf16Generic(rows, keys);
  rows.cache->host_bf16() ? PackKeysFrom<uint16_t>(rows, keys) : PackKeysFrom<float>(rows, keys);
}

void PackValuesBf16Avx512(const AttentionRows& rows, uint32_t* values) {
  if (rows.head_dim % 16 != 0) return PackValuesBf16Generic(rows, values);
  rows.cache->host_bf16() ? PackValuesFrom<uint16_t>(rows, values)
                          : PackValuesFrom<float>(rows, values);
}

void AttentionScoresBf16Avx512Bf16(const Bf16Block& b, int64_t n, const uint32_t* const* q,
                                   float scale, float* const* scores) {
  const int64_t groups = (b.end - b.p0 + 15) / 16;
  for (int64_t r = 0; r < n; r += 4) {
    const int64_t rows = std::min<int64_t>(4, n - r);
    kScoresRows[rows - 1][groups - 1](b, q + r, scale, scores + r);
  }
}

void AttentionWeightedSumBf16Avx512Bf16(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                        float* const* out) {
  const int64_t pairs = (b.end - b.p0 + 1) / 2;
  const bool odd = (b.end - b.p0) % 2 != 0;
  if (b.value_rows != nullptr) {
    for (int64_t d0 = 0; d0 < b.head_dim; d0 += 32) {
      kSumRowsDirect[n - 1](b, pairs, odd, probs, d0, out);
    }
    return;
  }
  for (int64_t d0 = 0; d0 < b.head_dim; d0 += 128) {
    const int64_t vectors = std::min<int64_t>(8, (b.head_dim - d0 + 15) / 16);
    const __mmask16 last = FirstLanes16(b.head_dim - d0 - 16 * (vectors - 1));
    for (int64_t r = 0; r < n; r += 3) {
      const int64_t rows = std::min<int64_t>(3, n - r);
      kSumRows[rows - 1][vectors - 1](b, pairs, odd, probs + r, d0, last, out + r);
    }
  }
}

}  // namespace glmserve::internal
