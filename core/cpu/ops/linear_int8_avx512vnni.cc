// The int8-weight Linear kernel on AVX512-VNNI (arithmetic: linear.h; portable reference:
// linear_int8.cc). Per 64 weights of a row: vpdpbusd sums, in each of 16 int32 lanes, 4
// products of an unsigned and a signed byte. The weights are the unsigned side, biased by
// 128 in registers (q ^ 0x80 = q + 128), and the accumulator starts from the activation's
// -128 * (sum of the slot's 4 values): the lane ends at the exact signed dot product. Then
// one conversion (exact: |d| <= 4 * 127 * 127) and one FMA with the scales' product.
// Register tiles of up to 4 activation rows x 4 weight rows (avx512_lanes.h); the lanes run
// through K in the same order whatever the tile, the K blocking or m.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/cpu/ops/avx512_lanes.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

using avx512::kTileM;
using avx512::kTileN;
using avx512::ReduceLanes;

// K elements per block when several activation tiles share a weight tile: the 4 weight rows'
// block (4 x 2 KiB) and an activation tile's (4 x 2 KiB plus its slot data) stay in L1.
constexpr int64_t kBlockKInt8 = 2048;
// Activation rows per pass over the task's weight tiles, as on AVX2 (linear_int8_avx2.cc): a
// long prompt's activations do not fit any cache, and read whole for every 4-row weight tile
// they made the prefill GEMMs memory-bound. A 32-row block's K block (64 KB of codes, 64 KB of
// slot data) stays in L2 while every weight tile of the task meets it.
constexpr int64_t kBlockMInt8 = 32;

struct Rows {
  const int8_t* q;         // [4, ld] from the tile's first row
  int64_t ld;              // = K
  const uint16_t* scales;  // bf16 bits [4, groups]
  int64_t groups;
};

struct Act {
  const int8_t* q;       // [4, kp]
  const float* scale;    // [4, kp / 4]
  const int32_t* minus;  // [4, kp / 4]
  int64_t kp;
};

// Lanes of an MR x NR tile over k in [k_begin, k_end) (multiples of 64, or K's padded end):
// started from zero (first) or from `lanes`; at the end reduced into y (+ bias) (last) or
// saved to `lanes`.
template <int MR, int NR>
void Tile(const Act& x, const Rows& w, int64_t k_total, int64_t k_begin, int64_t k_end, bool first,
          bool last, float* lanes, float* y, int64_t ldy, const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      acc[i][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + (i * NR + n) * 16);
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = k_begin; k < k_end; k += 64) {
    const int64_t count = k_total - k;
    const __mmask64 mask = count >= 64 ? ~__mmask64{0} : (__mmask64{1} << count) - 1;
    const int64_t g = k / kInt8Group;
    __m512i wv[NR];
    __m512 ws[NR];
    for (int n = 0; n < NR; ++n) {
      // Past-the-end bytes load as 0 and become 128, against activation zeros.
      wv[n] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w.q + n * w.ld + k), bias128);
      // Lanes 0-7 take the step's first group's scale, lanes 8-15 the second's (0 past the
      // row's last group); a bf16 is the high half of its fp32.
      const uint16_t* s = w.scales + n * w.groups + g;
      const uint32_t lo = uint32_t{s[0]} << 16, hi = g + 1 < w.groups ? uint32_t{s[1]} << 16 : 0;
      ws[n] = _mm512_castsi512_ps(_mm512_mask_blend_epi32(0xFF00,
                                                          _mm512_set1_epi32(static_cast<int>(lo)),
                                                          _mm512_set1_epi32(static_cast<int>(hi))));
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_loadu_si512(x.q + i * x.kp + k);
      const __m512i minus = _mm512_loadu_si512(x.minus + i * (x.kp / 4) + k / 4);
      const __m512 xs = _mm512_loadu_ps(x.scale + i * (x.kp / 4) + k / 4);
      for (int n = 0; n < NR; ++n) {
        const __m512i d = _mm512_dpbusd_epi32(minus, wv[n], xv);
        acc[i][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(xs, ws[n]), acc[i][n]);
      }
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

using TileFn = void (*)(const Act&, const Rows&, int64_t, int64_t, int64_t, bool, bool, float*,
                        float*, int64_t, const float*);
template <int MR>
constexpr TileFn kTilesForM[kTileN] = {Tile<MR, 1>, Tile<MR, 2>, Tile<MR, 3>, Tile<MR, 4>};
constexpr const TileFn* kTiles[kTileM] = {kTilesForM<1>, kTilesForM<2>, kTilesForM<3>,
                                          kTilesForM<4>};

}  // namespace

void Int8BlockAvx512Vnni(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t m = x.m, n_rows = w.rows, k_total = w.cols, kp = x.kp, groups = w.scale_cols();
  // One activation tile: its lanes stay in registers through all of K, and each 4-row weight
  // tile streams through once (decode). More rows: K blocks, so that a block of the weight
  // tile serves every activation tile from L1; lanes wait in `lanes` between blocks.
  const int64_t kb = m <= kTileM ? kp : kBlockKInt8;
  thread_local std::vector<float> lanes;
  lanes.resize(static_cast<size_t>((m + kTileM - 1) / kTileM) * kTileM * kTileN * 16);
  const int8_t* q = static_cast<const int8_t*>(w.data);
  // Each output's K steps keep their order whatever the blocking, so its bits do not change.
  for (int64_t m0 = 0; m0 < m; m0 += kBlockMInt8) {
    const int64_t m1 = std::min(m, m0 + kBlockMInt8);
    for (int64_t n = 0; n < nn; n += kTileN) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
      const Rows rows{q + (n0 + n) * k_total, k_total, w.group_scales + (n0 + n) * groups, groups};
      for (int64_t k0 = 0; k0 < kp; k0 += kb) {
        const int64_t k1 = std::min(kp, k0 + kb);
        for (int64_t i0 = m0; i0 < m1; i0 += kTileM) {
          const int mr = static_cast<int>(std::min<int64_t>(kTileM, m1 - i0));
          const Act act{x.q.data() + i0 * kp, x.lane_scale.data() + i0 * (kp / 4),
                        x.lane_minus.data() + i0 * (kp / 4), kp};
          kTiles[mr - 1][nr - 1](act, rows, k_total, k0, k1, k0 == 0, k1 == kp,
                                 lanes.data() + i0 * kTileN * 16, job.y + i0 * n_rows + n0 + n,
                                 n_rows, job.bias != nullptr ? job.bias + n0 + n : nullptr);
        }
      }
    }
  }
}

}  // namespace glmserve::internal
