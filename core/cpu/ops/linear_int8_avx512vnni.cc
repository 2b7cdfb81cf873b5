// The int8-weight Linear kernel on AVX512-VNNI (arithmetic: linear.h; portable reference:
// linear_int8.cc). Per 64 weights of a row: vpdpbusd sums, in each of 16 int32 lanes, 4
// products of an unsigned and a signed byte. The weights are the unsigned side, biased by
// 128 in registers (q ^ 0x80 = q + 128), and the accumulator starts from the activation's
// -128 * (sum of the slot's 4 values): the lane ends at the exact signed dot product. Then
// one conversion (exact: |d| <= 4 * 127 * 127) and one FMA with the scales' product.
// Register tiles of up to 3 activation rows x 4 weight rows; the lanes run through K in the same
// order whatever the tile, the K blocking or m. Not the 4 x 4 of the exact kernel: 16
// accumulators beside 4 weight vectors, their scales and an activation's three operands do not
// fit the 32 registers, and the spills held a 4 x 4 tile to 0.65-0.75x a 3 x 4 one on an AMD
// EPYC (Zen 4) VM (bench/linear_bench --modes=int8, docs/performance.md).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/ops/avx512_lanes.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

constexpr int kTileM = 3;
constexpr int kTileN = 4;
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
  const int8_t* q;         // [NR, ld] from the tile's first row
  int64_t ld;              // = K
  const uint16_t* scales;  // bf16 bits [NR, groups]
  int64_t groups;
};

// A step's scales of one weight row as fp32 lanes: 0-7 the group of k (bf16 s[0]), 8-15 the
// next (s[1], or 0 past the row's last group, `both` false). A bf16 is the high half of its fp32:
// one broadcast of the two bf16 (one dword) and one byte shuffle that moves s[0] (s[1]) into the
// high half of every dword of lanes 0-7 (8-15) and zeroes the low halves. Building the vector
// from two scalars (two broadcasts from general registers and a blend) cost a third of the
// tile's instructions.
inline __m512 StepScales(const uint16_t* s, bool both) {
  uint32_t pair = s[0];
  if (both) std::memcpy(&pair, s, sizeof(pair));
  // vpshufb works within 128-bit blocks: blocks 0-1 (lanes 0-7) take bytes 0-1, blocks 2-3
  // bytes 2-3; an index with the top bit set writes zero.
  const __m512i pick =
      _mm512_set_epi8(3, 2, -1, -1, 3, 2, -1, -1, 3, 2, -1, -1, 3, 2, -1, -1, 3, 2, -1, -1, 3, 2,
                      -1, -1, 3, 2, -1, -1, 3, 2, -1, -1, 1, 0, -1, -1, 1, 0, -1, -1, 1, 0, -1, -1,
                      1, 0, -1, -1, 1, 0, -1, -1, 1, 0, -1, -1, 1, 0, -1, -1, 1, 0, -1, -1);
  return _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_set1_epi32(static_cast<int>(pair)), pick));
}

struct Act {
  const int8_t* q;       // [MR, kp]
  const float* scale;    // [MR, kp / 4]
  const int32_t* minus;  // [MR, kp / 4]
  int64_t kp;
};

// Lanes of an MR x NR tile over k in [k_begin, k_end) (multiples of 64, or K's padded end):
// started from zero (first) or from `lanes`; at the end saved to `lanes` and, after K's last
// block (last), reduced into y (+ bias).
template <int MR, int NR>
void Tile(const Act& x, const Rows& w, int64_t k_total, int64_t k_begin, int64_t k_end, bool first,
          bool last, float* lanes, float* y, int64_t ldy, const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      acc[i][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes + (i * NR + n) * 16);
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  // One 64-wide step; `mask` keeps the bytes before K's end (past-the-end weight bytes load as
  // 0 and become 128, against activation zeros). Pointers advance by the step instead of being
  // recomputed from k (the address arithmetic held the loop to the integer pipes).
  const int8_t* wq = w.q + k_begin;
  const uint16_t* wsp = w.scales + k_begin / kInt8Group;
  const int8_t* xq = x.q + k_begin;
  const int32_t* xm = x.minus + k_begin / 4;
  const float* xsp = x.scale + k_begin / 4;
  const int64_t ld_lane = x.kp / 4;
  for (int64_t k = k_begin; k < k_end; k += 64) {
    const __mmask64 mask = k + 64 <= k_total ? ~__mmask64{0} : (__mmask64{1} << (k_total - k)) - 1;
    const bool both = k + kInt8Group < k_total;
    __m512i wv[NR];
    __m512 ws[NR];
    for (int n = 0; n < NR; ++n) {
      wv[n] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, wq + n * w.ld), bias128);
      ws[n] = StepScales(wsp + n * w.groups, both);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_loadu_si512(xq + i * x.kp);
      const __m512i minus = _mm512_loadu_si512(xm + i * ld_lane);
      const __m512 xs = _mm512_loadu_ps(xsp + i * ld_lane);
      for (int n = 0; n < NR; ++n) {
        const __m512i d = _mm512_dpbusd_epi32(minus, wv[n], xv);
        acc[i][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(xs, ws[n]), acc[i][n]);
      }
    }
    wq += 64, wsp += 2, xq += 64, xm += 16, xsp += 16;
  }
  // The lanes go to `lanes` either way, and the last block reduces them from there: written as
  // one branch per element, the compiler kept a copy of every accumulator on the stack, stored
  // on each step of the loop.
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n) _mm512_storeu_ps(lanes + (i * NR + n) * 16, acc[i][n]);
  if (!last) return;
  for (int i = 0; i < MR; ++i) {
    for (int n = 0; n < NR; ++n) {
      float v = ReduceLanes(_mm512_loadu_ps(lanes + (i * NR + n) * 16));
      if (bias != nullptr) v += bias[n];
      y[i * ldy + n] = v;
    }
  }
}

using TileFn = void (*)(const Act&, const Rows&, int64_t, int64_t, int64_t, bool, bool, float*,
                        float*, int64_t, const float*);
template <int MR>
constexpr TileFn kTilesForM[kTileN] = {Tile<MR, 1>, Tile<MR, 2>, Tile<MR, 3>, Tile<MR, 4>};
constexpr const TileFn* kTiles[kTileM] = {kTilesForM<1>, kTilesForM<2>, kTilesForM<3>};

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
