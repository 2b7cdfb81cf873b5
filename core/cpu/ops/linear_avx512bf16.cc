// The kBf16 Linear kernel on AVX512_BF16: activations already rounded to bf16 (LinearMany
// does that once per activation), bf16 weights read in place, vdpbf16ps into fp32 lanes.
//
// Register tiles of up to 3 activation rows x 8 weight rows (24 accumulators), each lane
// reduced by the one lane tree after K's last step: so every element's sum has the order
// linear.h defines whatever the tile, the unit or m. (The shape was measured on an Emerald
// Rapids VM: docs/performance.md, "Against llama.cpp".)
//
// The loops around the tiles (a Goto-style blocking): a unit (32 weight rows by a part of the
// activation rows: linear.h, kPartBytes) is cut into chunks of kChunkRows activation rows, and K
// into ranges of kRangeK; per chunk and range, each 8-row weight slice (32 KiB, in L1) meets every
// 3-row tile of the chunk's slice (384 KiB, in L2), the lanes of every tile waiting in a per-thread
// buffer between ranges. Cutting K at multiples of 32 leaves each lane's chain of roundings
// as it is. Over all of K each tile read its 8 weight rows (64 KiB at K = 4,096) from L2 and its
// activation rows from L3 or memory, once per 8 weight rows: that fed vdpbf16ps at 0.51-0.56 of
// its peak at K = 4,096 and 0.26 at K = 12,288 on a Zen 4 VM; the ranges give 0.80 and 0.71-0.76
// (bench/linear_bench, docs/performance.md "Prefill GEMMs in L1, L2 and L3"). A unit of 3 rows or
// fewer (decode) runs over all of K at once: no weight slice would meet a second tile.
#include <immintrin.h>

#include <algorithm>

#include "core/base/aligned_vector.h"
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

// K steps [k0, k1) of an MR x NR tile: x [MR, k_total] (ldx), w [NR, k_total] (row stride
// k_total). The lanes start at zero (first) or from `lanes` [MR][NR][16]; they go back there,
// or, after K's last step (last), are reduced by the lane tree into y [MR, NR] (ldy) + bias[n].
// Cutting K at multiples of 32 leaves every lane's chain of roundings as one pass over K makes it.
template <int MR, int NR>
void Tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k_total, int64_t k0,
          int64_t k1, bool first, bool last, float* lanes, float* y, int64_t ldy,
          const float* bias) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      acc[i][n] = first ? _mm512_setzero_ps() : _mm512_load_ps(lanes + (i * NR + n) * 16);
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) Step<MR, NR>(acc, x, ldx, w, k_total, k, 32);
  if (k < k1) Step<MR, NR>(acc, x, ldx, w, k_total, k, k1 - k);
  if (!last) {
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) _mm512_store_ps(lanes + (i * NR + n) * 16, acc[i][n]);
    return;
  }
  for (int i = 0; i < MR; ++i) {
    for (int n = 0; n < NR; ++n) {
      float v = ReduceLanes(acc[i][n]);
      if (bias != nullptr) v += bias[n];
      y[i * ldy + n] = v;
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, bool,
                        bool, float*, float*, int64_t, const float*);
template <int MR, int... NR>
constexpr TileFn kRow[] = {Tile<MR, NR>...};
// kTiles[mr - 1][nr - 1]: the MR x NR tile.
constexpr const TileFn* kTiles[kRowsM] = {kRow<1, 1, 2, 3, 4, 5, 6, 7, 8>,
                                          kRow<2, 1, 2, 3, 4, 5, 6, 7, 8>,
                                          kRow<3, 1, 2, 3, 4, 5, 6, 7, 8>};
static_assert(kRowsN == 8, "kTiles lists NR = 1..kRowsN");

constexpr int64_t kRangeK = 2048;               // K per range (a multiple of 32)
constexpr int64_t kChunkRows = kBf16ChunkRows;  // activation rows per chunk (linear.h)
static_assert(kRangeK % 32 == 0 && kChunkRows % kRowsM == 0 && kBlockN % kRowsN == 0);
constexpr int64_t kTileLanes = kRowsM * kRowsN * 16;  // floats of one tile's lanes

}  // namespace

void Bf16BlockAvx512(const Bf16Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols, m = job.m;
  const int64_t n0 = nb * kBlockN, n1 = std::min(n_rows, n0 + kBlockN);
  const uint16_t* p = static_cast<const uint16_t*>(w.data);
  const int64_t range = m > kRowsM ? kRangeK : k_total;
  // The lanes of every tile of a chunk: [kChunkRows / kRowsM][kBlockN / kRowsN][kTileLanes].
  constexpr int64_t kTilesN = kBlockN / kRowsN;
  thread_local AlignedVector<float> lane_buffer(kChunkRows / kRowsM * kTilesN * kTileLanes);
  float* lanes = lane_buffer.data();
  for (int64_t c0 = 0; c0 < m; c0 += kChunkRows) {
    const int64_t c1 = std::min(m, c0 + kChunkRows);
    for (int64_t k0 = 0; k0 < k_total; k0 += range) {
      const int64_t k1 = std::min(k_total, k0 + range);
      for (int64_t n = n0; n < n1; n += kRowsN) {
        const int nr = static_cast<int>(std::min<int64_t>(kRowsN, n1 - n));
        const uint16_t* wn = p + n * k_total;
        const float* bias = job.bias != nullptr ? job.bias + n : nullptr;
        for (int64_t i = c0; i < c1; i += kRowsM) {
          const int mr = static_cast<int>(std::min<int64_t>(kRowsM, c1 - i));
          float* tile_lanes =
              lanes + ((i - c0) / kRowsM * kTilesN + (n - n0) / kRowsN) * kTileLanes;
          kTiles[mr - 1][nr - 1](job.xb + i * k_total, k_total, wn, k_total, k0, k1, k0 == 0,
                                 k1 == k_total, tile_lanes, job.y + i * n_rows + n, n_rows, bias);
        }
      }
    }
  }
}

}  // namespace glmserve::internal
