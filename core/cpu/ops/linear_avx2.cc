// The exact Linear kernel on AVX2 + FMA (x86-64 without AVX-512: AMD Zen 1-3, Intel before
// Skylake-SP, most laptops). The arithmetic is the AVX-512 kernel's, element for element, so
// the two give the same bits: 16 fp32 lanes over k (here two 8-wide registers, lanes 0-7 and
// 8-15), one fused multiply-add per product, past-the-end elements read as zero, the same
// lane tree, fixed 512-wide K blocks added to y in order. What differs is only how work is
// tiled into registers (AVX2 has 16 of them, AVX-512 32), and the tiling never changes an
// element's order: batch invariance holds as on AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/avx2_lanes.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

using avx2::ReduceLanes;

// Up to this many activation rows, bf16 weights are widened in registers straight from
// memory; beyond, once per K block into a panel shared by every row tile (as on AVX-512).
constexpr int64_t kDirectMaxRows = 16;

// Register tiles: MR activation rows x NR weight rows, each pair two accumulators (16 lanes).
// The products of one 8-wide half are issued together, so the live registers are the
// accumulators, NR weight halves and one activation half: 1x4 takes 13, 3x2 takes 15.
constexpr int kMaxTileM = 3;
constexpr int kMaxTileN = 4;

// 8 weights as fp32: fp32 as is, bf16 widened exactly (bf16 is the top half of an fp32).
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// acc[i][n][h] += x_i[k + 8h ..] * w_n[k + 8h ..] for one 16-wide step, half by half.
template <int MR, int NR, typename W>
inline void Step(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k,
                 __m256 (&acc)[MR][NR][2]) {
  for (int h = 0; h < 2; ++h) {
    __m256 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = Load8(w + n * ldw + k + 8 * h);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k + 8 * h);
      for (int n = 0; n < NR; ++n) acc[i][n][h] = _mm256_fmadd_ps(xv, wv[n], acc[i][n][h]);
    }
  }
}

// y[i][n] += dot(x_i[0:kk], w_n[0:kk]) for an MR x NR tile; weight rows have stride ldw.
template <int MR, int NR, typename W>
void Tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kk, float* y, int64_t ldy) {
  __m256 acc[MR][NR][2];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) acc[i][n][0] = acc[i][n][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= kk; k += 16) {
    // bf16 weights are read in place only on the direct path (float: the panel, or fp32
    // weights, for which the prefetch was not measured).
    if constexpr (std::is_same_v<W, uint16_t>) PrefetchNextKBlock(w, ldw, NR, k);
    Step<MR, NR>(x, ldx, w, ldw, k, acc);
  }
  if (k < kk) {
    // The tail through zero-padded copies: the masked loads of the AVX-512 kernel.
    const int64_t t = kk - k;
    alignas(32) float xt[MR][16] = {};
    alignas(32) W wt[NR][16] = {};
    for (int i = 0; i < MR; ++i) std::memcpy(xt[i], x + i * ldx + k, t * sizeof(float));
    for (int n = 0; n < NR; ++n) std::memcpy(wt[n], w + n * ldw + k, t * sizeof(W));
    Step<MR, NR>(&xt[0][0], 16, &wt[0][0], 16, 0, acc);
  }
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) y[i * ldy + n] += ReduceLanes(acc[i][n][0], acc[i][n][1]);
}

template <typename W>
using TileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t);
template <typename W, int MR>
constexpr TileFn<W> kTilesForM[kMaxTileN] = {Tile<MR, 1, W>, Tile<MR, 2, W>, Tile<MR, 3, W>,
                                             Tile<MR, 4, W>};
// kTiles<W>[MR - 1][NR - 1].
template <typename W>
constexpr const TileFn<W>* kTiles[kMaxTileM] = {kTilesForM<W, 1>, kTilesForM<W, 2>,
                                                kTilesForM<W, 3>};

// The widest tile that keeps its accumulators in registers: one row takes 4 weight rows
// (a decode streams 4 weight rows at once), two or three take 2.
inline int TileN(int mr) { return mr == 1 ? 4 : 2; }

// y[0:m][0:nn] += x[0:m][0:kk] . w[0:nn][0:kk]^T over register tiles; rows of x in threes.
template <typename W>
void TileBlock(const float* x, int64_t ldx, int64_t m, const W* w, int64_t ldw, int64_t nn,
               int64_t kk, float* y, int64_t ldy) {
  for (int64_t i0 = 0; i0 < m; i0 += kMaxTileM) {
    const int mr = static_cast<int>(std::min<int64_t>(kMaxTileM, m - i0));
    const int tn = TileN(mr);
    for (int64_t n = 0; n < nn; n += tn) {
      const int nr = static_cast<int>(std::min<int64_t>(tn, nn - n));
      kTiles<W>[mr - 1][nr - 1](x + i0 * ldx, ldx, w + n * ldw, ldw, kk, y + i0 * ldy + n, ldy);
    }
  }
}

// Widens nn rows x kk columns of bf16 to fp32.
void WidenBf16(const uint16_t* src, int64_t ld, int64_t nn, int64_t kk, float* dst) {
  for (int64_t r = 0; r < nn; ++r) {
    const uint16_t* s = src + r * ld;
    float* d = dst + r * kk;
    int64_t k = 0;
    for (; k + 8 <= kk; k += 8) _mm256_storeu_ps(d + k, Load8(s + k));
    for (; k < kk; ++k) d[k] = Bf16ToFloat(s[k]);
  }
}

}  // namespace

void LinearBlockAvx2(const LinearJob& job, int64_t nb, AlignedVector<float>* panel_buffer) {
  const Matrix& w = *job.w;
  const float* x = job.x;
  float* y = job.y;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const bool bf16 = w.format == WeightFormat::kDense && w.dtype == DType::kBF16;
  const bool f32 = w.format == WeightFormat::kDense && w.dtype == DType::kF32;
  if ((bf16 || f32) && m <= kDirectMaxRows) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
    // Weights read in place (bf16 widened in registers): each weight tile streams through all
    // of K, so the prefetcher sees long sequential rows, and each K block of it serves every
    // row tile from L1. (Beyond kDirectMaxRows the panel below keeps the activations' passes
    // to one per K block of the task, fp32 weights included.)
    const int tn = TileN(static_cast<int>(std::min<int64_t>(kMaxTileM, m)));
    for (int64_t n = 0; n < nn; n += tn) {
      const int64_t nr = std::min<int64_t>(tn, nn - n);
      for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
        const int64_t kk = std::min(kBlockK, k_total - k0);
        const int64_t at = (n0 + n) * k_total + k0;
        if (bf16) {
          TileBlock(x + k0, k_total, m, static_cast<const uint16_t*>(w.data) + at, k_total, nr, kk,
                    y + n0 + n, n_rows);
        } else {
          TileBlock(x + k0, k_total, m, static_cast<const float*>(w.data) + at, k_total, nr, kk,
                    y + n0 + n, n_rows);
        }
      }
    }
  } else {
    // Each K block of the task's weight rows widened once into an fp32 panel (FP8 with its
    // block scales, one rounding, as WidenPanel defines) that stays in L2 for every row tile.
    panel_buffer->resize(kBlockN * std::min(k_total, kBlockK));
    float* panel = panel_buffer->data();
    // The K blocks' sums go into `sums` [m][kBlockN] (contiguous), y takes the totals: as in
    // LinearBlockAvx512, whose comment says why. The same additions in the same order.
    thread_local AlignedVector<float> sums_buffer;
    sums_buffer.assign(m * kBlockN, 0.f);
    float* sums = sums_buffer.data();
    for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
      const int64_t kk = std::min(kBlockK, k_total - k0);
      if (bf16) {
        WidenBf16(static_cast<const uint16_t*>(w.data) + n0 * k_total + k0, k_total, nn, kk, panel);
      } else {
        WidenPanel(w, n0, nn, k0, kk, panel);
      }
      TileBlock(x + k0, k_total, m, static_cast<const float*>(panel), kk, nn, kk, sums, kBlockN);
    }
    for (int64_t i = 0; i < m; ++i) std::copy_n(sums + i * kBlockN, nn, y + i * n_rows + n0);
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < nn; ++n) y[i * n_rows + n0 + n] += job.bias[n0 + n];
  }
}

}  // namespace glmserve::internal
