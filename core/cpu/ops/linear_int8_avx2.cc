// The int8-weight Linear kernel on AVX2 (x86-64 without AVX512-VNNI; arithmetic: linear.h;
// portable reference: linear_int8.cc, which this kernel matches bit for bit). The 16 lanes of
// the arithmetic are two 8-wide registers: per 64 weights of a row, the low one takes bytes
// 0-31 (the first 32-wide group) and the high one bytes 32-63 (the second). A lane's exact
// int32 dot of 4 products comes from vpmaddubsw on |x| (unsigned) and w with x's sign
// (signed), then vpmaddwd with ones: both sides lie in [-127, 127], so a pair's sum is at most
// 2 * 127 * 127 = 32258 and the 16-bit step cannot saturate. Then, as on AVX512-VNNI, one
// exact conversion and one FMA with the scales' product (one rounding), the same lane tree
// and the bias.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu/ops/avx2_lanes.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

using avx2::ReduceLanes;

// Register tiles of up to 2 activation rows x 2 weight rows: 8 accumulators, and per half a
// step the two rows' weights and scales, one activation's magnitude, sign source and scales.
constexpr int kTileM = 2;
constexpr int kTileN = 2;
// K elements per block when several activation tiles share a weight tile (as on VNNI).
constexpr int64_t kBlockKInt8 = 2048;
// Activation rows per pass over the task's weight tiles. A long prompt's activations (2,048
// rows of a 4,096-wide layer: 8 MB of codes and 8 MB of lane scales) do not fit any cache: read
// whole for every 2-row weight tile, they made the dense prefill GEMMs memory-bound (0.13 of
// the peak on glm-4.5-air:layers=3 at 2,048 tokens). A block of 32 rows' K block (128 KB with
// its scales) stays in L2 while every weight tile of the task meets it.
constexpr int64_t kBlockMInt8 = 32;

struct Rows {
  const int8_t* q;      // [NR, ld] from the tile's first row
  int64_t ld;           // = K
  const float* scales;  // [NR, sld]: the bf16 group scales widened, 0 past the last group
  int64_t sld;          // = kp / 32
};

struct Act {
  const int8_t* q;     // [MR, kp]
  const float* scale;  // [MR, kp / 32]: group scales (a half step's 8 lanes share one)
  int64_t kp;
};

// The exact int32 dots of 4 byte products per lane: x . w over 32 bytes.
inline __m256i Dot4(__m256i x_abs, __m256i x, __m256i w) {
  const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Lanes of an MR x NR tile over k in [k_begin, k_end) (multiples of 64, or K's padded end):
// started from zero (first) or from `lanes`; at the end reduced into y (+ bias) (last) or
// saved to `lanes`.
template <int MR, int NR>
void Tile(const Act& x, const Rows& w, int64_t k_total, int64_t k_begin, int64_t k_end, bool first,
          bool last, float* lanes, float* y, int64_t ldy, const float* bias) {
  __m256 acc[MR][NR][2];
  for (int i = 0; i < MR; ++i)
    for (int n = 0; n < NR; ++n)
      for (int h = 0; h < 2; ++h)
        acc[i][n][h] =
            first ? _mm256_setzero_ps() : _mm256_loadu_ps(lanes + (i * NR + n) * 16 + 8 * h);
  for (int64_t k = k_begin; k < k_end; k += 64) {
    // A row's last step may pass its end: those bytes come from a zero-padded copy (they meet
    // activation zeros, and a load past the matrix is never made).
    alignas(32) int8_t tail[NR][64];
    const int8_t* wp[NR];
    for (int n = 0; n < NR; ++n) {
      wp[n] = w.q + n * w.ld + k;
      if (k + 64 > k_total) {
        std::memset(tail[n], 0, 64);
        std::memcpy(tail[n], wp[n], static_cast<size_t>(k_total - k));
        wp[n] = tail[n];
      }
    }
    for (int h = 0; h < 2; ++h) {
      // Group g's scales for every lane of this half.
      const int64_t g = k / kInt8Group + h;
      __m256i wv[NR];
      __m256 ws[NR];
      for (int n = 0; n < NR; ++n) {
        wv[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[n] + 32 * h));
        ws[n] = _mm256_broadcast_ss(w.scales + n * w.sld + g);
      }
      for (int i = 0; i < MR; ++i) {
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + i * x.kp + k + 32 * h));
        const __m256i xa = _mm256_abs_epi8(xv);
        const __m256 xs = _mm256_broadcast_ss(x.scale + i * (x.kp / kInt8Group) + g);
        for (int n = 0; n < NR; ++n) {
          const __m256i d = Dot4(xa, xv, wv[n]);
          acc[i][n][h] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(xs, ws[n]), acc[i][n][h]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int n = 0; n < NR; ++n) {
      if (last) {
        float v = ReduceLanes(acc[i][n][0], acc[i][n][1]);
        if (bias != nullptr) v += bias[n];
        y[i * ldy + n] = v;
      } else {
        _mm256_storeu_ps(lanes + (i * NR + n) * 16, acc[i][n][0]);
        _mm256_storeu_ps(lanes + (i * NR + n) * 16 + 8, acc[i][n][1]);
      }
    }
  }
}

using TileFn = void (*)(const Act&, const Rows&, int64_t, int64_t, int64_t, bool, bool, float*,
                        float*, int64_t, const float*);
constexpr TileFn kTiles[kTileM][kTileN] = {{Tile<1, 1>, Tile<1, 2>}, {Tile<2, 1>, Tile<2, 2>}};

}  // namespace

void Int8BlockAvx2(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, w.rows - n0);
  const int64_t m = x.m, n_rows = w.rows, k_total = w.cols, kp = x.kp, groups = w.scale_cols();
  // One activation tile: its lanes stay in registers through all of K. More rows: K blocks,
  // so that a block of the weight tile serves every activation tile from L1; lanes wait in
  // `lanes` between blocks (stored and reloaded exactly).
  const int64_t kb = m <= kTileM ? kp : kBlockKInt8;
  thread_local std::vector<float> lanes;
  lanes.resize(static_cast<size_t>((m + kTileM - 1) / kTileM) * kTileM * kTileN * 16);
  // A weight tile's scales widened once per pass of an activation block (its tiles all read
  // them, and a bf16 takes a scalar shift and a broadcast), with zeros for the padded last
  // step's missing group.
  const int64_t sld = kp / kInt8Group;
  thread_local std::vector<float> wscale;
  wscale.assign(static_cast<size_t>(kTileN * sld), 0.0f);
  const int8_t* q = static_cast<const int8_t*>(w.data);
  // Each output's K steps keep their order whatever the blocking, so its bits do not change.
  for (int64_t m0 = 0; m0 < m; m0 += kBlockMInt8) {
    const int64_t m1 = std::min(m, m0 + kBlockMInt8);
    for (int64_t n = 0; n < nn; n += kTileN) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileN, nn - n));
      for (int r = 0; r < nr; ++r) {
        const uint16_t* bf16 = w.group_scales + (n0 + n + r) * groups;
        for (int64_t g = 0; g < groups; ++g) wscale[r * sld + g] = Bf16ToFloat(bf16[g]);
      }
      const Rows rows{q + (n0 + n) * k_total, k_total, wscale.data(), sld};
      for (int64_t k0 = 0; k0 < kp; k0 += kb) {
        const int64_t k1 = std::min(kp, k0 + kb);
        for (int64_t i0 = m0; i0 < m1; i0 += kTileM) {
          const int mr = static_cast<int>(std::min<int64_t>(kTileM, m1 - i0));
          const Act act{x.q.data() + i0 * kp, x.group_scale.data() + i0 * (kp / kInt8Group), kp};
          kTiles[mr - 1][nr - 1](act, rows, k_total, k0, k1, k0 == 0, k1 == kp,
                                 lanes.data() + i0 * kTileN * 16, job.y + i0 * n_rows + n0 + n,
                                 n_rows, job.bias != nullptr ? job.bias + n0 + n : nullptr);
        }
      }
    }
  }
}

// QuantizeGroupInt8's operations, eight elements at a time: the same amax (max is exact, so its
// order does not matter), the same scalar scale, and per element the same IEEE division, the
// same round to nearest even (vroundps in the default mode, as nearbyint) and the same clamp.
// A non-finite element makes the scale NaN and the codes zero; so does a zero group. A last
// group of fewer than 32 takes the scalar code.
void QuantizeRowInt8Avx2(const float* x, int64_t k, int8_t* q, float* group_scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 max_finite = _mm256_set1_ps(FLT_MAX);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  int64_t g = 0;
  for (; (g + 1) * kInt8Group <= k; ++g) {
    const float* v = x + g * kInt8Group;
    __m256 e[4];
    __m256 amax = _mm256_setzero_ps();
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int j = 0; j < 4; ++j) {
      e[j] = _mm256_loadu_ps(v + 8 * j);
      const __m256 a = _mm256_and_ps(e[j], abs_mask);
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, max_finite, _CMP_LE_OQ));  // NaN: false
      amax = _mm256_max_ps(amax, a);
    }
    int8_t* out = q + g * kInt8Group;
    if (_mm256_movemask_ps(finite) != 0xFF) {
      group_scale[g] = std::numeric_limits<float>::quiet_NaN();
      std::memset(out, 0, kInt8Group);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float scale = _mm_cvtss_f32(m4) / 127.0f;
    group_scale[g] = scale;
    if (!(scale > 0)) {
      std::memset(out, 0, kInt8Group);
      continue;
    }
    const __m256 s = _mm256_set1_ps(scale);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r =
          _mm256_round_ps(_mm256_div_ps(e[j], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      i32[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));  // exact integers
    }
    // The packs work within 128-bit halves: their bytes come out in runs of four as
    // 0.lo 1.lo 2.lo 3.lo 0.hi 1.hi 2.hi 3.hi (i32[j]'s lanes 0-3, then 4-7); the permutation
    // puts the runs back in order.
    const __m256i w01 = _mm256_packs_epi32(i32[0], i32[1]),
                  w23 = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), b);
  }
  if (g * kInt8Group < k) {
    group_scale[g] = QuantizeGroupInt8(x + g * kInt8Group, k - g * kInt8Group, q + g * kInt8Group);
  }
}

}  // namespace glmserve::internal
