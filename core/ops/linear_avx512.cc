// The AVX-512 Linear kernel. Same arithmetic as LinearGeneric's lane structure (16 lanes over
// k, a fixed lane tree, fixed K blocks), with fused multiply-adds and register tiles of up
// to 4 activation rows x 4 weight rows.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/ops/avx512_lanes.h"
#include "core/ops/linear.h"

namespace glmserve::internal {
namespace {

using avx512::kTileM;
using avx512::kTileN;
using avx512::ReduceLanes;

// Up to this many activation rows, bf16 weights are widened in registers straight from
// memory; beyond, once into a panel that the row tiles then share (measured on Zen 4: the
// direct path is 1.5-2.5x faster at 5-16 rows, equal at 64-256, 10% slower at 512).
constexpr int64_t kDirectMaxRows = 128;

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

// y[i][n] += dot(x_i[0:kk], w_n[0:kk]) for an MR x NR tile; weight rows have stride ldw.
template <int MR, int NR, typename W>
void Tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kk, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= kk; k += 16) {
    __m512 wv[NR];
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
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) y[i * ldy + n] += ReduceLanes(acc[i][n]);
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

}  // namespace

void LinearBlockAvx512(const LinearJob& job, int64_t nb, std::vector<float>* panel_buffer) {
  const Matrix& w = *job.w;
  const float* x = job.x;
  float* y = job.y;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
  if (w.dtype == DType::kBF16 && m <= kDirectMaxRows) {
    // Few rows (decode, and experts' thin slices of a prefill): stream each 4-row weight tile
    // through all K blocks in place, so the hardware prefetcher sees long sequential rows;
    // each K block of the tile (4 KiB) serves every 4-row group of activations from L1.
    // Same per-element order as the panel path below.
    const uint16_t* wb = static_cast<const uint16_t*>(w.data) + n0 * k_total;
    for (int64_t n = 0; n < nn; n += kTileN) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
      for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
        const int64_t kk = std::min(kBlockK, k_total - k0);
        for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
          const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
          kTiles<uint16_t>[mr - 1][nr - 1](x + i0 * k_total + k0, k_total, wb + n * k_total + k0,
                                           k_total, kk, y + i0 * n_rows + n0 + n, n_rows);
        }
      }
    }
  } else {
    // Each K block of the task's weight rows is widened (or copied) once into a contiguous
    // fp32 panel that stays in L2 while every activation tile passes over it.
    panel_buffer->resize(kBlockN * std::min(k_total, kBlockK));
    float* panel = panel_buffer->data();
    for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
      const int64_t kk = std::min(kBlockK, k_total - k0);
      if (w.dtype == DType::kBF16) {
        WidenBf16(static_cast<const uint16_t*>(w.data) + n0 * k_total + k0, k_total, nn, kk, panel);
      } else {
        WidenPanel(w, n0, nn, k0, kk, panel);
      }
      for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
        const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
        for (int64_t n = 0; n < nn; n += kTileN) {
          const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
          kTiles<float>[mr - 1][nr - 1](x + i0 * k_total + k0, k_total, panel + n * kk, kk, kk,
                                        y + i0 * n_rows + n0 + n, n_rows);
        }
      }
    }
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < nn; ++n) y[i * n_rows + n0 + n] += job.bias[n0 + n];
  }
}

}  // namespace glmserve::internal
