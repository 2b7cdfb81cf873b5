// The kBf16 Linear kernel on AVX512_BF16: activations already rounded to bf16 (LinearMany
// does that once per activation), bf16 weights read in place, vdpbf16ps into fp32 lanes.
//
// Register tiles of up to 3 activation rows x 8 weight rows (24 accumulators). Every tile
// runs through all of K with its lanes in registers, then reduces them by the one lane tree:
// so every element's sum has the order linear.h defines whatever the tile, the task or m.
// The shape is measured, not derived: on the development VM (Emerald Rapids) the 3x8 tiles
// over all of K ran the prefill GEMMs of bench/linear_bench at 1.17-1.27x the previous 4x4
// tiles over 1024-wide K blocks, whose lanes waited in memory between blocks
// (docs/performance.md, "Against llama.cpp").
#include <immintrin.h>

#include <algorithm>

#include "core/cpu/ops/avx512_lanes.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

using avx512::ReduceLanes;

constexpr int kRowsM = 3;  // activation rows per register tile
constexpr int kRowsN = 8;  // weight rows per register tile

inline __mmask32 TailMask(int64_t count) {
  return count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << count) - 1);
}
// 32 bf16 values from p, the first `count` (<= 32) of them; the rest read as +0.
inline __m512bh Load32(const uint16_t* p, int64_t count) {
  if (count >= 32) return (__m512bh)_mm512_loadu_si512(p);
  return (__m512bh)_mm512_maskz_loadu_epi16(TailMask(count), p);
}

// One 32-wide step of K for an MR x NR tile: the activation rows' vectors first, then each
// weight row's vector meets all of them.
template <int MR, int NR>
inline void Step(__m512 (&acc)[MR][NR], const uint16_t* x, int64_t ldx, const uint16_t* w,
                 int64_t ldw, int64_t k, int64_t count) {
  __m512bh xv[MR];
  for (int i = 0; i < MR; ++i) xv[i] = Load32(x + i * ldx + k, count);
  for (int n = 0; n < NR; ++n) {
    const __m512bh wv = Load32(w + n * ldw + k, count);
    for (int i = 0; i < MR; ++i) acc[i][n] = _mm512_dpbf16_ps(acc[i][n], xv[i], wv);
  }
}

// y[i, n] (+ bias[n]) for an MR x NR tile: x [MR, k_total] (ldx), w [NR, k_total] (row
// stride k_total), y [MR, NR] (ldy).
template <int MR, int NR>
void Tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k_total, float* y, int64_t ldy,
          const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= k_total; k += 32) Step<MR, NR>(acc, x, ldx, w, k_total, k, 32);
  if (k < k_total) Step<MR, NR>(acc, x, ldx, w, k_total, k, k_total - k);
  for (int i = 0; i < MR; ++i) {
    for (int n = 0; n < NR; ++n) {
      float v = ReduceLanes(acc[i][n]);
      if (bias != nullptr) v += bias[n];
      y[i * ldy + n] = v;
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t,
                        const float*);
template <int MR, int... NR>
constexpr TileFn kRow[] = {Tile<MR, NR>...};
// kTiles[mr - 1][nr - 1]: the MR x NR tile.
constexpr const TileFn* kTiles[kRowsM] = {kRow<1, 1, 2, 3, 4, 5, 6, 7, 8>,
                                          kRow<2, 1, 2, 3, 4, 5, 6, 7, 8>,
                                          kRow<3, 1, 2, 3, 4, 5, 6, 7, 8>};
static_assert(kRowsN == 8, "kTiles lists NR = 1..kRowsN");

}  // namespace

void Bf16BlockAvx512(const Bf16Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols, m = job.m;
  const int64_t n0 = nb * kBlockN, n1 = std::min(n_rows, n0 + kBlockN);
  const uint16_t* p = static_cast<const uint16_t*>(w.data);
  // Weight tiles outside, activation tiles inside: a weight tile (8 rows, 64 KiB at K = 4096)
  // stays in L2 while every activation tile passes over it.
  for (int64_t n = n0; n < n1; n += kRowsN) {
    const int nr = static_cast<int>(std::min<int64_t>(kRowsN, n1 - n));
    for (int64_t i = 0; i < m; i += kRowsM) {
      const int mr = static_cast<int>(std::min<int64_t>(kRowsM, m - i));
      kTiles[mr - 1][nr - 1](job.xb + i * k_total, k_total, p + n * k_total, k_total,
                             job.y + i * n_rows + n, n_rows,
                             job.bias != nullptr ? job.bias + n : nullptr);
    }
  }
}

}  // namespace glmserve::internal
