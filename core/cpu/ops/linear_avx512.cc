// The AVX-512 Linear kernel. Same arithmetic as LinearGeneric's lane structure (16 lanes over
// k, a fixed lane tree, fixed K blocks), with fused multiply-adds and register tiles of up
// to 4 activation rows x 4 weight rows (6 x 4 over a widened panel).
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/avx512_lanes.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

using avx512::kTileM;
using avx512::kTileN;
using avx512::ReduceLanes;
using avx512::ReduceLanes4;

// Up to this many activation rows, bf16 weights are widened in registers straight from
// memory; beyond, once into a panel that the row tiles then share. Measured on Zen 4: the
// direct path 1.5-2.5x faster at 5-16 rows, equal at 64-256, 10% slower at 512. Measured on
// Emerald Rapids (cpu_bench --modes=exact, 2 threads, glm-4.5-air:layers=2, two rounds each):
// prefill 128 at 116-125 tok/s with the direct path up to 128 rows, 160-180 with it up to 16
// (the widening shares ports with the FMAs, and a panel row is widened once for 128 rows).
constexpr int64_t kDirectMaxRows = 16;
// FP8 decodes in ~9 instructions per 16 weights, repeated for every 4-row activation tile, so
// the direct path pays off only for a few tiles (measured on glm-4.5-air-fp8:layers=2, 2
// threads: decode b1 135 -> 113 ms/step, b8 371 -> 276-353 ms; at 128 rows the panel wins).
constexpr int64_t kDirectMaxRowsFp8 = 16;

// 16 weights as fp32: fp32 as is, bf16 widened exactly in registers (bf16 is the top half of
// an fp32), so one tile serves a widened panel and bf16 weights read in place alike.
inline __m512 LoadWeights(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 LoadWeights(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 LoadWeights(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 LoadWeights(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// y[i][n] += the lane tree's sum of acc[i][n], for an MR x NR tile (y's rows ldy apart).
template <int MR, int NR>
inline void AddLaneSums(const __m512 (&acc)[MR][NR], float* y, int64_t ldy) {
  for (int i = 0; i < MR; ++i) {
    if constexpr (NR % 4 == 0) {
      for (int n = 0; n < NR; n += 4) {
        float* row = y + i * ldy + n;
        _mm_storeu_ps(
            row, _mm_add_ps(_mm_loadu_ps(row),
                            ReduceLanes4(acc[i][n], acc[i][n + 1], acc[i][n + 2], acc[i][n + 3])));
      }
    } else {
      for (int n = 0; n < NR; ++n) y[i * ldy + n] += ReduceLanes(acc[i][n]);
    }
  }
}

// y[i][n] += dot(x_i[0:kk], w_n[0:kk]) for an MR x NR tile; weight rows have stride ldw.
template <int MR, int NR, typename W>
void Tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kk, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= kk; k += 16) {
    __m512 wv[NR];
    // bf16 weights are read in place only on the direct path (float: the panel, in L2).
    if constexpr (std::is_same_v<W, uint16_t>) PrefetchNextKBlock(w, ldw, NR, k);
    for (int n = 0; n < NR; ++n) wv[n] = LoadWeights(w + n * ldw + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_fmadd_ps(xv, wv[n], acc[i][n]);
    }
  }
  if (k < kk) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (kk - k)) - 1);
    __m512 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = LoadWeights(w + n * ldw + k, mask);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + k);
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_fmadd_ps(xv, wv[n], acc[i][n]);
    }
  }
  AddLaneSums<MR, NR>(acc, y, ldy);
}

// Tiles by shape: kTiles<W>[MR - 1][NR - 1].
template <typename W>
using TileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t);
template <typename W, int MR>
constexpr TileFn<W> kTilesForM[kTileN] = {Tile<MR, 1, W>, Tile<MR, 2, W>, Tile<MR, 3, W>,
                                          Tile<MR, 4, W>};
template <typename W>
constexpr const TileFn<W>* kTiles[kTileM] = {kTilesForM<W, 1>, kTilesForM<W, 2>, kTilesForM<W, 3>,
                                             kTilesForM<W, 4>};
// The direct path at one or two activation rows (decode): tiles of 8 weight rows, so that 8 rows
// stream from memory at once (16 KiB ahead with the prefetch above, where 4 rows' loads alone
// left the out-of-order window short of the memory's latency). Measured on a Zen 5 VM,
// cpu_bench --modes=exact --decode_context=0: decode batch 1 54 -> 48 ms/step with the prefetch,
// of which 8-row tiles alone gave 54 -> 50-51 (docs/performance.md, session 37).
constexpr int64_t kWideMaxRows = 2;
constexpr int kWideTileN = 8;
template <typename W, int MR>
constexpr TileFn<W> kWideTilesForM[kWideTileN] = {Tile<MR, 1, W>, Tile<MR, 2, W>, Tile<MR, 3, W>,
                                                  Tile<MR, 4, W>, Tile<MR, 5, W>, Tile<MR, 6, W>,
                                                  Tile<MR, 7, W>, Tile<MR, 8, W>};
template <typename W>
constexpr const TileFn<W>* kWideTiles[kWideMaxRows] = {kWideTilesForM<W, 1>, kWideTilesForM<W, 2>};

// The panel path's tiles are 6 activation rows x 4 weight rows (24 accumulators, 4 weight
// vectors and an activation vector: 29 registers): 10 loads per 24 FMAs where 4 x 4 takes 8 per
// 16, and the panel (in L2) gives 4 of them. On a Zen 4 VM, linear_bench --modes=exact
// --tokens=2048 --dense=12288x4096: 0.52-0.55 of the FMA peak with 4 x 4, 0.56-0.62 with 6 x 4,
// 0.55-0.59 with 7 x 4, 0.32-0.35 with 8 x 3 and 0.25-0.29 with 12 x 2.
constexpr int kPanelTileM = 6;
constexpr const TileFn<float>* kPanelTiles[kPanelTileM] = {
    kTilesForM<float, 1>, kTilesForM<float, 2>, kTilesForM<float, 3>,
    kTilesForM<float, 4>, kTilesForM<float, 5>, kTilesForM<float, 6>};

// Widens nn rows x kk columns of bf16 to fp32 (exact: bf16 is the top half of an fp32).
void WidenBf16(const uint16_t* src, int64_t ld, int64_t nn, int64_t kk, float* dst) {
  for (int64_t r = 0; r < nn; ++r) {
    const uint16_t* s = src + r * ld;
    float* d = dst + r * kk;
    int64_t k = 0;
    for (; k + 16 <= kk; k += 16) {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k));
      __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
      _mm512_storeu_ps(d + k, _mm512_castsi512_ps(wide));
    }
    for (; k < kk; ++k) d[k] = Bf16ToFloat(s[k]);
  }
}

// 16 e4m3 codes as fp32 times `scale`: the value of the code (exact) times the scale, one
// rounding, as WidenPanel's table lookup times the scale. e4m3's bits moved to fp32's
// exponent/mantissa positions read as the value times 2^-120 (subnormal codes become fp32
// denormals with the same ratio), so one exact multiply by 2^120 decodes them; the NaN codes
// (S.1111.111) are patched in.
inline __m512 DecodeFp8(__m128i codes, __m512 scale) {
  const __m512i v = _mm512_cvtepu8_epi32(codes);
  const __m512i low7 = _mm512_set1_epi32(0x7f);
  const __m512i mag = _mm512_and_si512(v, low7);
  __m512 x =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), _mm512_set1_ps(0x1p120f));
  x = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(x), _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24)));
  x = _mm512_mask_mov_ps(x, _mm512_cmpeq_epi32_mask(mag, low7), _mm512_set1_ps(__builtin_nanf("")));
  return _mm512_mul_ps(x, scale);
}

// FP8 weight rows read in place (decode): NR rows from `p` (row stride ld), row n's scales at
// scales[n] (one per `block` columns); columns counted from `k_abs` so that a 16-wide load
// finds its block. Callers guarantee block % 16 == 0 or one block per row, so no load
// straddles two blocks.
struct Fp8Rows {
  const uint8_t* p;
  int64_t ld;
  const float* const* scales;
  int64_t block;
  int64_t k_abs;
};

// y[i][n] += dot(x_i[0:kk], w_n[0:kk]) for an MR x NR tile of FP8 rows: the same per-element
// order and the same widened weight values as the panel path (Tile over WidenFp8's panel).
template <int MR, int NR>
void TileFp8(const float* x, int64_t ldx, const Fp8Rows& w, int64_t kk, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kk; k += 16) {
    const int64_t count = std::min<int64_t>(16, kk - k);
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
    const int64_t b = (w.k_abs + k) / w.block;
    __m512 wv[NR];
    for (int n = 0; n < NR; ++n) {
      const __m128i codes =
          count == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.p + n * w.ld + k))
                      : _mm_maskz_loadu_epi8(mask, w.p + n * w.ld + k);
      // Masked-off lanes decode code 0 (+0): they add x * 0 with x read as 0 too.
      wv[n] = DecodeFp8(codes, _mm512_set1_ps(w.scales[n][b]));
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + k);
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_fmadd_ps(xv, wv[n], acc[i][n]);
    }
  }
  AddLaneSums<MR, NR>(acc, y, ldy);
}

using TileFp8Fn = void (*)(const float*, int64_t, const Fp8Rows&, int64_t, float*, int64_t);
template <int MR>
constexpr TileFp8Fn kFp8TilesForM[kTileN] = {TileFp8<MR, 1>, TileFp8<MR, 2>, TileFp8<MR, 3>,
                                             TileFp8<MR, 4>};
constexpr const TileFp8Fn* kFp8Tiles[kTileM] = {kFp8TilesForM<1>, kFp8TilesForM<2>,
                                                kFp8TilesForM<3>, kFp8TilesForM<4>};

// FP8 rows nn x kk from column k0 widened to fp32 and multiplied by their block's scale.
void WidenFp8(const Matrix& w, int64_t n0, int64_t nn, int64_t k0, int64_t kk, float* dst) {
  const float* table = E4m3Table();
  const int64_t bc = w.scale_block_cols;
  for (int64_t r = 0; r < nn; ++r) {
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + (n0 + r) * w.cols;
    const float* scales = w.Fp8RowScales(n0 + r);
    float* d = dst + r * kk - k0;
    for (int64_t k = k0; k < k0 + kk;) {
      const int64_t end = std::min(k0 + kk, (k / bc + 1) * bc);
      const float scale = scales[k / bc];
      const __m512 vs = _mm512_set1_ps(scale);
      for (; k + 16 <= end; k += 16) {
        _mm512_storeu_ps(d + k,
                         DecodeFp8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)), vs));
      }
      for (; k < end; ++k) d[k] = table[src[k]] * scale;
    }
  }
}

}  // namespace

void LinearBlockAvx512(const LinearJob& job, int64_t nb, AlignedVector<float>* panel_buffer) {
  const Matrix& w = *job.w;
  const float* x = job.x;
  float* y = job.y;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  if (w.dtype == DType::kBF16 && m <= kDirectMaxRows) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
    // Few rows (decode, and experts' thin slices of a prefill): stream each 4-row weight tile
    // (8-row at one or two activation rows) through all K blocks in place, so the hardware
    // prefetcher sees long sequential rows; each K block of the tile (4 KiB) serves every 4-row
    // group of activations from L1. Same per-element order as the panel path below.
    const uint16_t* wb = static_cast<const uint16_t*>(w.data) + n0 * k_total;
    const bool wide = m <= kWideMaxRows;
    const int64_t tile_n = wide ? kWideTileN : kTileN;
    for (int64_t n = 0; n < nn; n += tile_n) {
      const int nr = static_cast<int>(std::min(tile_n, nn - n));
      for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
        const int64_t kk = std::min(kBlockK, k_total - k0);
        for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
          const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
          const TileFn<uint16_t> tile =
              wide ? kWideTiles<uint16_t>[mr - 1][nr - 1] : kTiles<uint16_t>[mr - 1][nr - 1];
          tile(x + i0 * k_total + k0, k_total, wb + n * k_total + k0, k_total, kk,
               y + i0 * n_rows + n0 + n, n_rows);
        }
      }
    }
  } else if (w.format == WeightFormat::kFp8Scaled && m <= kDirectMaxRowsFp8 &&
             (w.scale_block_cols % 16 == 0 || w.scale_block_cols >= k_total)) {
    // FP8 with few rows: widened in registers straight from memory (1 byte per weight read),
    // as the bf16 path above; the same values and order as the panel path below.
    for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
    const uint8_t* wb = static_cast<const uint8_t*>(w.data) + n0 * k_total;
    for (int64_t n = 0; n < nn; n += kTileN) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
      const float* row_scales[kTileN];
      for (int r = 0; r < nr; ++r) row_scales[r] = w.Fp8RowScales(n0 + n + r);
      for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
        const int64_t kk = std::min(kBlockK, k_total - k0);
        const Fp8Rows rows{wb + n * k_total + k0, k_total, row_scales, w.scale_block_cols, k0};
        for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
          const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
          kFp8Tiles[mr - 1][nr - 1](x + i0 * k_total + k0, k_total, rows, kk,
                                    y + i0 * n_rows + n0 + n, n_rows);
        }
      }
    }
  } else {
    // Each K block of the task's weight rows is widened (or copied) once into a contiguous
    // fp32 panel that stays in L2 while every activation tile passes over it.
    panel_buffer->resize(kBlockN * std::min(k_total, kBlockK));
    float* panel = panel_buffer->data();  // on cache lines, as x is (AlignedVector)
    // Each K block's sums are added into `sums` [m][kBlockN], contiguous and in L2, and y takes
    // the totals at the end: y's rows lie n_rows apart, each on its own page, and adding into
    // them once per K block cost a fifth of the tiles' time at prefill (perf, linear_bench
    // --modes=exact). From zero, the same additions in the same order: the same bits.
    thread_local AlignedVector<float> sums_buffer;
    sums_buffer.assign(m * kBlockN, 0.f);
    float* sums = sums_buffer.data();
    for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
      const int64_t kk = std::min(kBlockK, k_total - k0);
      if (w.format == WeightFormat::kFp8Scaled) {
        WidenFp8(w, n0, nn, k0, kk, panel);
      } else if (w.dtype == DType::kBF16) {
        WidenBf16(static_cast<const uint16_t*>(w.data) + n0 * k_total + k0, k_total, nn, kk, panel);
      } else {
        WidenPanel(w, n0, nn, k0, kk, panel);
      }
      for (int64_t i0 = 0; i0 < m; i0 += kPanelTileM) {
        const int mr = static_cast<int>(std::min<int64_t>(kPanelTileM, m - i0));
        for (int64_t n = 0; n < nn; n += kTileN) {
          const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
          kPanelTiles[mr - 1][nr - 1](x + i0 * k_total + k0, k_total, panel + n * kk, kk, kk,
                                      sums + i0 * kBlockN + n, kBlockN);
        }
      }
    }
    for (int64_t i = 0; i < m; ++i) std::copy_n(sums + i * kBlockN, nn, y + i * n_rows + n0);
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < nn; ++n) y[i * n_rows + n0 + n] += job.bias[n0 + n];
  }
}

}  // namespace glmserve::internal
