// PagedAttentionBf16's two loops on AVX2 + FMA (x86-64 without AVX512_BF16: AMD Zen 2/3, Intel
// client CPUs, whose int8 mode computes attention in this arithmetic). vdpbf16ps's lane step
// written out in 8-wide registers: a pair's high halves, then its low halves, each product an
// FMA with one rounding, bf16 subnormal operands read as zero and subnormal results flushed, as
// DpBf16Lane (bf16_math.h) has it, so the bits are the portable form's (attention_bf16_test).
// The layouts are the other forms' (Bf16Block): the scores' lanes are 8 positions of the
// transposed keys, the weighted sums' 8 head dims.
//
// The masks cost more than the FMAs, and real operands almost never need them: where every
// product is a multiple of 2^-126 (a bf16 value with biased exponent E is a multiple of
// 2^(E - 134), so a product is one where E_a + E_b >= 142; zeros are exact), every partial sum
// from +0 is one too, so no operand is subnormal and no result is nonzero below FLT_MIN: DAZ and
// FTZ change nothing, and plain FMAs give the same bits. Each call checks that from the
// operands' smallest exponents (the packed block's, Bf16Block::key_exp_min / value_exp_min; its
// rows' own) and, for the weighted sums, that the running outputs are such multiples; otherwise
// it takes the masked loop. Queries and keys of magnitude >= 2^-56 always qualify; exps against
// values near 1/16 do down to about 2^-108 (scores within about 75 of their row's largest).
#include <immintrin.h>

#include <algorithm>

#include "core/cpu/ops/attention_bf16.h"
#include "core/cpu/ops/attention_items.h"

namespace glmserve::internal {
namespace {

// fp32 lanes holding bf16 values, each read as zero (keeping its sign) where its exponent is
// zero: vdpbf16ps's DAZ.
inline __m256 Daz(__m256i bits) {
  const __m256i exponent = _mm256_and_si256(bits, _mm256_set1_epi32(0x7f800000));
  const __m256i keep = _mm256_or_si256(
      _mm256_xor_si256(_mm256_cmpeq_epi32(exponent, _mm256_setzero_si256()), _mm256_set1_epi32(-1)),
      _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm256_castsi256_ps(_mm256_and_si256(bits, keep));
}
// A dword's high bf16 (dim 2i + 1, or the later position) and its low bf16 as fp32 lanes;
// kMasked: with the DAZ, otherwise the operands are known normal or zero.
template <bool kMasked>
inline __m256 High(__m256i pairs) {
  const __m256i h = _mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return kMasked ? Daz(h) : _mm256_castsi256_ps(h);
}
template <bool kMasked>
inline __m256 Low(__m256i pairs) {
  const __m256i l = _mm256_slli_epi32(pairs, 16);
  return kMasked ? Daz(l) : _mm256_castsi256_ps(l);
}

// acc + a * b in one rounding; kMasked: a result below FLT_MIN in magnitude flushed to a zero of
// its sign (otherwise none can be).
template <bool kMasked>
inline __m256 FmaFtz(__m256 a, __m256 b, __m256 acc) {
  const __m256 r = _mm256_fmadd_ps(a, b, acc);
  if constexpr (!kMasked) return r;
  const __m256 magnitude = _mm256_and_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 tiny = _mm256_cmp_ps(magnitude, _mm256_set1_ps(0x1p-126f), _CMP_LT_OQ);
  return _mm256_andnot_ps(_mm256_and_ps(tiny, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))),
                          r);
}

// One row's pair, broadcast: its high and low bf16 as fp32 lanes, and the lane step against
// another operand's (high, then low: DpBf16Lane's order).
template <bool kMasked>
struct Broadcast {
  __m256 h, l;
  explicit Broadcast(uint32_t pair) {
    const __m256i p = _mm256_set1_epi32(static_cast<int>(pair));
    h = High<kMasked>(p);
    l = Low<kMasked>(p);
  }
  __m256 Step(__m256 xh, __m256 xl, __m256 acc) const {
    return FmaFtz<kMasked>(l, xl, FmaFtz<kMasked>(h, xh, acc));
  }
};

// The smallest biased exponent among the nonzero bf16 halves of pairs[0, n): 0 where one is
// subnormal, 255 where all are zero. A half's magnitude (exponent, then mantissa) minus 1,
// compared unsigned, orders the nonzero ones by exponent and puts the zeros last (0 - 1 wraps).
int MinExponent(const uint32_t* pairs, int64_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  __m256i low = _mm256_set1_epi32(-1);
  auto take = [&](__m256i x) {
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(x, 16), magnitude);
    const __m256i lo = _mm256_and_si256(x, magnitude);
    low = _mm256_min_epu32(low,
                           _mm256_min_epu32(_mm256_sub_epi32(hi, one), _mm256_sub_epi32(lo, one)));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) take(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + i)));
  if (i < n) {
    alignas(32) uint32_t tail[8] = {};  // zeros: ignored
    std::copy(pairs + i, pairs + n, tail);
    take(_mm256_load_si256(reinterpret_cast<const __m256i*>(tail)));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), low);
  const uint32_t least = *std::min_element(lanes, lanes + 8);
  return least == 0xffffffffu ? 255 : static_cast<int>((least + 1) >> 7);
}

// Whether products of bf16 values of biased exponents >= ea and >= eb are all multiples of
// 2^-126 (the fast loops' condition, above).
inline bool ExactWithoutMasks(int ea, int eb) { return ea > 0 && eb > 0 && ea + eb >= 142; }

// Whether every lane of acc is zero or a multiple of 2^-126 (biased exponent >= 24: its ulp is at
// least 2^-126).
inline bool MultiplesOfMinNormal(__m256 acc) {
  const __m256i bits = _mm256_castps_si256(acc);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff));
  const __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                          _mm256_setzero_si256());
  const __m256i big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(23));
  return _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(zero, big))) == 0xff;
}

// The block's lanes [8 g, 8 g + 8) for R rows (R <= 2) and G groups of 8 positions (G <= 4):
// each key vector split and DAZ'd once for the rows.
template <bool kMasked, int R, int G>
void ScoresRows(const Bf16Block& b, const uint32_t* const* q, float scale, float* const* scores,
                int64_t g0) {
  __m256 a0[G], a1[G];
  for (int g = 0; g < G; ++g) a0[g] = a1[g] = _mm256_setzero_ps();
  const uint32_t* k = b.keys + 8 * g0;
  LinesAhead ahead = b.ahead != nullptr ? *b.ahead : LinesAhead{};  // a local: in registers
  for (int64_t i = 0; i < b.key_pairs; ++i, k += kPositionBlock) {
    ahead.Prefetch();  // one line a step (eight-wide: more steps than AVX-512's)
    const Broadcast<kMasked> q0(q[0][i]), q1(q[R > 1 ? 1 : 0][i]);
    for (int g = 0; g < G; ++g) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 8 * g));
      const __m256 kh = High<kMasked>(x), kl = Low<kMasked>(x);
      a0[g] = q0.Step(kh, kl, a0[g]);
      if constexpr (R > 1) a1[g] = q1.Step(kh, kl, a1[g]);
    }
  }
  if (b.ahead != nullptr) *b.ahead = ahead;
  const __m256 s = _mm256_set1_ps(scale);
  const int64_t len = b.end - b.p0;
  auto store = [&](const __m256* a, float* out) {
    for (int g = 0; g < G; ++g) {
      const int64_t at = 8 * (g0 + g), n = std::min<int64_t>(8, len - at);
      const __m256 v = _mm256_mul_ps(a[g], s);
      if (n == 8) {
        _mm256_storeu_ps(out + b.p0 + at, v);
      } else {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, v);
        std::copy_n(lanes, n, out + b.p0 + at);
      }
    }
  };
  store(a0, scores[0]);
  if constexpr (R > 1) store(a1, scores[1]);
}

using ScoresRowsFn = void (*)(const Bf16Block&, const uint32_t* const*, float, float* const*,
                              int64_t);
// [masked][R - 1][G - 1].
constexpr ScoresRowsFn kScoresRows[2][2][4] = {{{ScoresRows<false, 1, 1>, ScoresRows<false, 1, 2>,
                                                 ScoresRows<false, 1, 3>, ScoresRows<false, 1, 4>},
                                                {ScoresRows<false, 2, 1>, ScoresRows<false, 2, 2>,
                                                 ScoresRows<false, 2, 3>, ScoresRows<false, 2, 4>}},
                                               {{ScoresRows<true, 1, 1>, ScoresRows<true, 1, 2>,
                                                 ScoresRows<true, 1, 3>, ScoresRows<true, 1, 4>},
                                                {ScoresRows<true, 2, 1>, ScoresRows<true, 2, 2>,
                                                 ScoresRows<true, 2, 3>, ScoresRows<true, 2, 4>}}};

// The weighted sums' steps over the block's position pairs for accumulators a0 (and a1: R = 2)
// of dims [d0, d0 + 8 V).
template <bool kMasked, int R, int V>
void Steps(const Bf16Block& b, int64_t pairs, bool odd, const uint32_t* const* probs, int64_t d0,
           __m256* a0, __m256* a1) {
  LinesAhead ahead = b.ahead != nullptr ? *b.ahead : LinesAhead{};
  const auto step = [&](int64_t j, __m256i keep) {
    ahead.Prefetch();
    const uint32_t* x_row = b.values + j * b.value_width + d0;
    const Broadcast<kMasked> w0(probs[0][j]), w1(probs[R > 1 ? 1 : 0][j]);
    for (int v = 0; v < V; ++v) {
      const __m256i x = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_row + 8 * v)), keep);
      const __m256 xh = High<kMasked>(x), xl = Low<kMasked>(x);
      a0[v] = w0.Step(xh, xl, a0[v]);
      if constexpr (R > 1) a1[v] = w1.Step(xh, xl, a1[v]);
    }
  };
  const int64_t full = pairs - (odd ? 1 : 0);
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t j = 0; j < full; ++j) step(j, all);
  if (odd) step(full, _mm256_set1_epi32(0xffff));
  if (b.ahead != nullptr) *b.ahead = ahead;
}

// Dims [d0, d0 + 8 V) (V <= 4; the block's values are padded to 16 dims, so whole vectors are
// read; dims past head_dim are not stored) of R rows (R <= 2) over the block's `pairs` position
// pairs; `odd`: the last pair's second position reads as +0. `masked`: the DAZ/FTZ loop (also
// taken when an output so far is not a multiple of 2^-126).
template <int R, int V>
void SumRows(const Bf16Block& b, int64_t pairs, bool odd, const uint32_t* const* probs, int64_t d0,
             bool masked, float* const* out) {
  __m256 a0[V], a1[V];
  const int64_t width = std::min<int64_t>(8 * V, b.head_dim - d0);
  auto load = [&](__m256* a, const float* o) {
    alignas(32) float buf[32] = {};
    std::copy_n(o + d0, width, buf);
    for (int v = 0; v < V; ++v) a[v] = _mm256_load_ps(buf + 8 * v);
  };
  auto store = [&](const __m256* a, float* o) {
    alignas(32) float buf[32];
    for (int v = 0; v < V; ++v) _mm256_store_ps(buf + 8 * v, a[v]);
    std::copy_n(buf, width, o + d0);
  };
  load(a0, out[0]);
  if constexpr (R > 1) load(a1, out[1]);
  if (!masked) {  // the outputs so far must be multiples of 2^-126 too
    for (int v = 0; v < V; ++v) {
      masked |= !MultiplesOfMinNormal(a0[v]) || (R > 1 && !MultiplesOfMinNormal(a1[v]));
    }
  }
  if (masked) {
    Steps<true, R, V>(b, pairs, odd, probs, d0, a0, a1);
  } else {
    Steps<false, R, V>(b, pairs, odd, probs, d0, a0, a1);
  }
  store(a0, out[0]);
  if constexpr (R > 1) store(a1, out[1]);
}

using SumRowsFn = void (*)(const Bf16Block&, int64_t, bool, const uint32_t* const*, int64_t, bool,
                           float* const*);
constexpr SumRowsFn kSumRows[2][4] = {{SumRows<1, 1>, SumRows<1, 2>, SumRows<1, 3>, SumRows<1, 4>},
                                      {SumRows<2, 1>, SumRows<2, 2>, SumRows<2, 3>, SumRows<2, 4>}};

// FloatToBf16 on 8 lanes, each result in the low half of its dword: nearest even, NaN quiet.
inline __m256i RoundToBf16Lanes(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// 16 elements of a cached row as 8 bf16 pairs (dword i: element 2i low, 2i + 1 high): an fp32
// cache's rounded, a bf16 cache's loaded.
inline __m256i Pairs16(const float* row) {
  const __m256i a = RoundToBf16Lanes(_mm256_loadu_ps(row));
  const __m256i b = RoundToBf16Lanes(_mm256_loadu_ps(row + 8));
  // packus per 128-bit half: [a0..3 b0..3 | a4..7 b4..7] as 16-bit; the qword permute orders it.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
}
inline __m256i Pairs16(const uint16_t* row) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
}
// 8 elements of a cached row as bf16 bits in the low halves of 8 dwords.
inline __m256i Bf16Lanes8(const float* row) { return RoundToBf16Lanes(_mm256_loadu_ps(row)); }
inline __m256i Bf16Lanes8(const uint16_t* row) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
}

// Rows r[0..7] of 8 dwords each, transposed in place.
inline void Transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 2; ++g) {  // u[4g + c], 128-bit half h: rows 4g.. at column 4h + c
    u[4 * g + 0] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

template <typename T>
int64_t RowPointers(const AttentionRows& rows, bool values, const T** ptr) {
  rows.ForEach<T>(values, [&](int64_t p, const T* row) { ptr[p - rows.begin] = row; });
  return rows.context - rows.begin;
}

// 8 positions x 8 key pairs at a time: each position's 16 dims as 8 pairs, then a dword
// transpose gives each pair's 8 positions.
template <typename T>
void PackKeysFrom(const AttentionRows& rows, uint32_t* keys) {
  const int64_t hd = rows.head_dim;
  const T* ptr[kPositionBlock];
  const int64_t n = RowPointers(rows, false, ptr);
  for (int64_t g = 0; 8 * g < n; ++g) {
    const int64_t count = std::min<int64_t>(8, n - 8 * g);
    for (int64_t c = 0; c < hd / 16; ++c) {
      __m256i t[8];
      for (int64_t j = 0; j < 8; ++j) {
        t[j] = j < count ? Pairs16(ptr[8 * g + j] + 16 * c) : _mm256_setzero_si256();
      }
      Transpose8x8(t);
      for (int64_t i = 0; i < 8; ++i) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + (8 * c + i) * kPositionBlock + 8 * g),
                            t[i]);
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
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256i l = Bf16Lanes8(lo + d);
      const __m256i h =
          hi != nullptr ? _mm256_slli_epi32(Bf16Lanes8(hi + d), 16) : _mm256_setzero_si256();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + j * hd + d), _mm256_or_si256(l, h));
    }
  }
}

}  // namespace

void PackKeysBf16Avx2(const AttentionRows& rows, uint32_t* keys) {
  if (rows.head_dim % 16 != 0) return PackKeysBf16Generic(rows, keys);
  rows.cache->host_bf16() ? PackKeysFrom<uint16_t>(rows, keys) : PackKeysFrom<float>(rows, keys);
}

void PackValuesBf16Avx2(const AttentionRows& rows, uint32_t* values) {
  if (rows.head_dim % 16 != 0) return PackValuesBf16Generic(rows, values);
  rows.cache->host_bf16() ? PackValuesFrom<uint16_t>(rows, values)
                          : PackValuesFrom<float>(rows, values);
}

int MinExponentOfPairs(const uint32_t* pairs, int64_t n) { return MinExponent(pairs, n); }

void AttentionScoresBf16Avx2(const Bf16Block& b, int64_t n, const uint32_t* const* q, float scale,
                             float* const* scores) {
  const int64_t groups = (b.end - b.p0 + 7) / 8;  // of 8 positions, at most 8
  for (int64_t r = 0; r < n; r += 2) {
    const int64_t rows = std::min<int64_t>(2, n - r);
    bool masked = false;
    for (int64_t j = r; j < r + rows; ++j) {
      masked |= !ExactWithoutMasks(MinExponent(q[j], b.key_pairs), b.key_exp_min);
    }
    for (int64_t g0 = 0; g0 < groups; g0 += 4) {
      kScoresRows[masked][rows - 1][std::min<int64_t>(4, groups - g0) - 1](b, q + r, scale,
                                                                           scores + r, g0);
    }
  }
}

void AttentionWeightedSumBf16Avx2(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                  float* const* out) {
  const int64_t pairs = (b.end - b.p0 + 1) / 2;
  const bool odd = (b.end - b.p0) % 2 != 0;
  for (int64_t r = 0; r < n; r += 2) {
    const int64_t rows = std::min<int64_t>(2, n - r);
    bool masked = false;
    for (int64_t j = r; j < r + rows; ++j) {
      masked |= !ExactWithoutMasks(MinExponent(probs[j], pairs), b.value_exp_min);
    }
    for (int64_t d0 = 0; d0 < b.head_dim; d0 += 32) {
      const int64_t vectors = std::min<int64_t>(4, (b.head_dim - d0 + 7) / 8);
      kSumRows[rows - 1][vectors - 1](b, pairs, odd, probs + r, d0, masked, out + r);
    }
  }
}

}  // namespace glmserve::internal
