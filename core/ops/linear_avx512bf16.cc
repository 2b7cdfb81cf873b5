// The kBf16 Linear kernel on AVX512_BF16: activations already rounded to bf16 (LinearMany
// does that once per activation), bf16 weights read in place, vdpbf16ps into fp32 lanes.
// Register tiles of up to 4 activation rows x 4 weight rows; every element's lanes run
// through all of K in the same order whatever the tile, the K blocking or m (linear.h), so
// blocking only decides where the lanes wait between blocks (registers or a scratch buffer).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/ops/linear.h"

namespace glmserve::internal {
namespace {

constexpr int kTileM = 4;
constexpr int kTileN = 4;
// K elements per block: the 4 weight rows' block (4 x 2 KiB) and an activation tile's
// (4 x 2 KiB) stay in L1 while the row tiles pass over it.
constexpr int64_t kBlockKBf16 = 1024;

// Same lane tree as the exact kernel and the generic emulation: (j, j+8), (j, j+4), (j, j+2),
// (j, j+1).
inline float ReduceLanes(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

inline __m512bh Load32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
inline __m512bh Load32(const uint16_t* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// Lanes of an MR x NR tile over k in [k_begin, k_end): started from zero (first) or from
// `lanes` (MR * NR vectors); at the end reduced into y (+ bias) (last) or saved to `lanes`.
template <int MR, int NR>
void Tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t k_begin,
          int64_t k_end, bool first, bool last, float* lanes, float* y, int64_t ldy,
          const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      acc[i][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + (i * NR + n) * 16);
  int64_t k = k_begin;
  for (; k + 32 <= k_end; k += 32) {
    __m512bh wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = Load32(w + n * ldw + k);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = Load32(x + i * ldx + k);
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], xv, wv[n]);
    }
  }
  if (k < k_end) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (k_end - k)) - 1);
    __m512bh wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = Load32(w + n * ldw + k, mask);
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = Load32(x + i * ldx + k, mask);
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], xv, wv[n]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int n = 0; n < NR; ++n) {
      if (last) {
        float v = ReduceLanes(acc[i][n]);
        if (bias != nullptr) v += bias[n];
        y[i * ldy + n] = v;
      } else {
        _mm512_storeu_ps(lanes + (i * NR + n) * 16, acc[i][n]);
      }
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, bool,
                        bool, float*, float*, int64_t, const float*);
template <int MR>
constexpr TileFn kTilesForM[kTileN] = {Tile<MR, 1>, Tile<MR, 2>, Tile<MR, 3>, Tile<MR, 4>};
constexpr const TileFn* kTiles[kTileM] = {kTilesForM<1>, kTilesForM<2>, kTilesForM<3>,
                                          kTilesForM<4>};

}  // namespace

void Bf16BlockAvx512(const Bf16Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const uint16_t* wb = static_cast<const uint16_t*>(w.data) + n0 * k_total;
  // One activation tile: its lanes stay in registers through all of K, and each 4-row
  // weight tile streams through once (decode). More rows: K blocks, so that a block of the
  // weight tile serves every activation tile from L1; lanes wait in `lanes` between blocks.
  const int64_t kb = m <= kTileM ? k_total : kBlockKBf16;
  thread_local std::vector<float> lanes;
  lanes.resize(static_cast<size_t>((m + kTileM - 1) / kTileM) * kTileM * kTileN * 16);
  for (int64_t n = 0; n < nn; n += kTileN) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
    for (int64_t k0 = 0; k0 < k_total; k0 += kb) {
      const int64_t k1 = std::min(k_total, k0 + kb);
      for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
        const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
        kTiles[mr - 1][nr - 1](job.xb + i0 * k_total, k_total, wb + n * k_total, k_total, k0, k1,
                               k0 == 0, k1 == k_total, lanes.data() + i0 * kTileN * 16,
                               job.y + i0 * n_rows + n0 + n, n_rows,
                               job.bias != nullptr ? job.bias + n0 + n : nullptr);
      }
    }
  }
}

}  // namespace glmserve::internal
