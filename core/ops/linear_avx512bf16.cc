// The kBf16 Linear kernel on AVX512_BF16: activations already rounded to bf16 (LinearMany
// does that once per activation), bf16 weights read in place, vdpbf16ps into fp32 lanes.
// Register tiles of up to 4 activation rows x 4 weight rows; every element's lanes run
// through all of K in the same order whatever the tile, the K blocking or m (linear.h), so
// blocking only decides where the lanes wait between blocks (registers or a scratch buffer).
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

// K elements per block: the 4 weight rows' block (4 x 2 KiB) and an activation tile's
// (4 x 2 KiB) stay in L1 while the row tiles pass over it.
constexpr int64_t kBlockKBf16 = 1024;

inline __mmask32 TailMask(int64_t count) {
  return count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << count) - 1);
}
// 32 bf16 values from p, the first `count` (<= 32) of them; the rest read as +0.
inline __m512bh Load32(const uint16_t* p, int64_t count) {
  if (count >= 32) return (__m512bh)_mm512_loadu_si512(p);
  return (__m512bh)_mm512_maskz_loadu_epi16(TailMask(count), p);
}

// Weight rows in bf16, read in place.
struct Bf16Rows {
  const uint16_t* p;
  int64_t ld;
  __m512bh Load(int n, int64_t k, int64_t count) const { return Load32(p + n * ld + k, count); }
};

// One 32-wide step of K for an MR x NR tile, accumulated in the lanes directly.
template <int MR, int NR, typename W>
inline void Step(__m512 (&acc)[MR][NR], const uint16_t* x, int64_t ldx, const W& w, int64_t k,
                 int64_t count) {
  __m512bh wv[NR];
  for (int n = 0; n < NR; ++n) wv[n] = w.Load(n, k, count);
  for (int i = 0; i < MR; ++i) {
    const __m512bh xv = Load32(x + i * ldx + k, count);
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], xv, wv[n]);
  }
}

// Lanes of an MR x NR tile over k in [k_begin, k_end): started from zero (first) or from
// `lanes` (MR * NR vectors); at the end reduced into y (+ bias) (last) or saved to `lanes`.
template <int MR, int NR, typename W>
void Tile(const uint16_t* x, int64_t ldx, const W& w, int64_t k_begin, int64_t k_end, bool first,
          bool last, float* lanes, float* y, int64_t ldy, const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      acc[i][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + (i * NR + n) * 16);
  int64_t k = k_begin;
  for (; k + 32 <= k_end; k += 32) Step<MR, NR>(acc, x, ldx, w, k, 32);
  if (k < k_end) Step<MR, NR>(acc, x, ldx, w, k, k_end - k);
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

template <typename W>
using TileFn = void (*)(const uint16_t*, int64_t, const W&, int64_t, int64_t, bool, bool, float*,
                        float*, int64_t, const float*);
template <typename W, int MR>
constexpr TileFn<W> kTilesForM[kTileN] = {Tile<MR, 1, W>, Tile<MR, 2, W>, Tile<MR, 3, W>,
                                          Tile<MR, 4, W>};
template <typename W>
constexpr const TileFn<W>* kTiles[kTileM] = {kTilesForM<W, 1>, kTilesForM<W, 2>, kTilesForM<W, 3>,
                                             kTilesForM<W, 4>};

// Rows [n0, n0 + nn) of the job; rows(n) gives the weight source of the 4-row tile at n.
template <typename W, typename RowsAt>
void Block(const Bf16Job& job, int64_t n0, int64_t nn, RowsAt rows_at) {
  const int64_t m = job.m, n_rows = job.w->rows, k_total = job.w->cols;
  // One activation tile: its lanes stay in registers through all of K, and each 4-row
  // weight tile streams through once (decode). More rows: K blocks, so that a block of the
  // weight tile serves every activation tile from L1; lanes wait in `lanes` between blocks.
  const int64_t kb = m <= kTileM ? k_total : kBlockKBf16;
  thread_local std::vector<float> lanes;
  lanes.resize(static_cast<size_t>((m + kTileM - 1) / kTileM) * kTileM * kTileN * 16);
  for (int64_t n = 0; n < nn; n += kTileN) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
    const W w = rows_at(n0 + n);
    for (int64_t k0 = 0; k0 < k_total; k0 += kb) {
      const int64_t k1 = std::min(k_total, k0 + kb);
      for (int64_t i0 = 0; i0 < m; i0 += kTileM) {
        const int mr = static_cast<int>(std::min<int64_t>(kTileM, m - i0));
        kTiles<W>[mr - 1][nr - 1](job.xb + i0 * k_total, k_total, w, k0, k1, k0 == 0, k1 == k_total,
                                  lanes.data() + i0 * kTileN * 16, job.y + i0 * n_rows + n0 + n,
                                  n_rows, job.bias != nullptr ? job.bias + n0 + n : nullptr);
      }
    }
  }
}

}  // namespace

void Bf16BlockAvx512(const Bf16Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0), k_total = w.cols;
  const uint16_t* p = static_cast<const uint16_t*>(w.data);
  Block<Bf16Rows>(job, n0, nn, [&](int64_t n) { return Bf16Rows{p + n * k_total, k_total}; });
}

}  // namespace glmserve::internal
