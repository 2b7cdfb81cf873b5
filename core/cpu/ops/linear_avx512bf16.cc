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
#include <cstdlib>
#include <vector>

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

int64_t Knob(const char* name, int64_t def) {
  const char* e = getenv(name);
  return e ? atoll(e) : def;
}

}  // namespace

void Bf16BlockAvx512(const Bf16Job& job, const Bf16Unit& u) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols;
  const uint16_t* p = static_cast<const uint16_t*>(w.data);
  static const int64_t range_knob = Knob("GLM_RANGEK", 2048), chunk = Knob("GLM_CHUNKM", 96),
                       min_rows = Knob("GLM_MINROWS", 4);
  const int64_t range = u.i1 - u.i0 >= min_rows ? range_knob : k_total;
  const int64_t tiles_n = (u.n1 - u.n0 + kRowsN - 1) / kRowsN;
  constexpr int64_t kLaneTile = kRowsM * kRowsN * 16;
  thread_local std::vector<__m512> lane_buf;
  lane_buf.resize(static_cast<size_t>((chunk + kRowsM - 1) / kRowsM * tiles_n * kLaneTile / 16));
  float* lanes = reinterpret_cast<float*>(lane_buf.data());
  for (int64_t c0 = u.i0; c0 < u.i1; c0 += chunk) {
    const int64_t c1 = std::min(u.i1, c0 + chunk);
    for (int64_t k0 = 0; k0 < k_total; k0 += range) {
      const int64_t k1 = std::min(k_total, k0 + range);
      for (int64_t n = u.n0; n < u.n1; n += kRowsN) {
        const int nr = static_cast<int>(std::min<int64_t>(kRowsN, u.n1 - n));
        for (int64_t i = c0; i < c1; i += kRowsM) {
          const int mr = static_cast<int>(std::min<int64_t>(kRowsM, c1 - i));
          float* l = lanes + (((i - c0) / kRowsM) * tiles_n + (n - u.n0) / kRowsN) * kLaneTile;
          kTiles[mr - 1][nr - 1](job.xb + i * k_total, k_total, p + n * k_total, k_total, k0, k1,
                                 k0 == 0, k1 == k_total, l, job.y + i * n_rows + n, n_rows,
                                 job.bias != nullptr ? job.bias + n : nullptr);
        }
      }
    }
  }
}

}  // namespace glmserve::internal
