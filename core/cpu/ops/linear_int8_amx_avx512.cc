// The group-serial int8 kernel on the AMX tile unit (arithmetic and layout: linear_int8_amx.h;
// the emulation it matches bit for bit: linear_int8_amx.cc). Per 32-wide group, TDPBSSD gives
// the exact int32 dots of up to 32 weight rows x 32 activation rows (2 x 2 C tiles); AVX-512
// then converts each (exact), multiplies the two scales (one rounding) and adds with one FMA
// into fp32 accumulators that stay in L1 for the whole of K. Compiled for AVX-512; the tile
// instructions use function target attributes, and the tile configuration is loaded per
// thread by Int8AmxThreadBegin.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/base/aligned_vector.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"

#define GLM_AMX_INT8_TARGET __attribute__((target("amx-tile,amx-int8")))

namespace glmserve::internal {
namespace {

constexpr int64_t kTileWords = 8 * 16;  // one B tile
constexpr int64_t kTileCells = 16 * 16;  // one C tile

// One A tile's source: 16 weight rows read in place (stride ld bytes) for the groups wholly
// inside K, and a zero-padded copy of the tail group; a tile of fewer than 16 rows: a padded
// copy of the rows, so that no load passes the matrix.
struct ASource {
  const int8_t* p = nullptr;
  int64_t ld = 0;
  alignas(64) int8_t tail[16 * 32];
};

void MakeSource(const Matrix& w, int64_t row0, AlignedVector<int8_t>* padded, ASource* s) {
  const int64_t k_total = w.cols, rows = std::min<int64_t>(16, w.rows - row0);
  const int8_t* src = static_cast<const int8_t*>(w.data) + row0 * k_total;
  s->ld = k_total;
  if (rows == 16) {
    s->p = src;
  } else {
    padded->assign(16 * k_total, 0);
    std::memcpy(padded->data(), src, static_cast<size_t>(rows * k_total));
    s->p = padded->data();
  }
  const int64_t full = k_total / 32 * 32, len = k_total - full;
  std::memset(s->tail, 0, sizeof(s->tail));
  for (int64_t r = 0; r < 16 && len > 0; ++r) {
    std::memcpy(s->tail + r * 32, s->p + r * k_total + full, static_cast<size_t>(len));
  }
}

// Group g's int32 dots for NT (1, 2) weight tiles x MT (1, 2) activation tiles, stored to
// c [NT * 2 + MT][16][16]: C tile (t, u) is tile 2t + u. b: the group's B tile of the first
// activation tile; the second's is b_next words further.
template <int NT, int MT>
GLM_AMX_INT8_TARGET void GroupTiles(const ASource* a, int64_t g, const int32_t* b, int64_t b_next,
                                    int32_t* c) {
  _tile_zero(0);
  if constexpr (MT == 2) _tile_zero(1);
  if constexpr (NT == 2) _tile_zero(2);
  if constexpr (NT == 2 && MT == 2) _tile_zero(3);
  if (g < a[0].ld / 32) {
    _tile_loadd(4, a[0].p + 32 * g, a[0].ld);
    if constexpr (NT == 2) _tile_loadd(5, a[1].p + 32 * g, a[1].ld);
  } else {
    _tile_loadd(4, a[0].tail, 32);
    if constexpr (NT == 2) _tile_loadd(5, a[1].tail, 32);
  }
  _tile_loadd(6, b, 64);
  if constexpr (MT == 2) _tile_loadd(7, b + b_next, 64);
  _tile_dpbssd(0, 4, 6);
  if constexpr (MT == 2) _tile_dpbssd(1, 4, 7);
  if constexpr (NT == 2) _tile_dpbssd(2, 5, 6);
  if constexpr (NT == 2 && MT == 2) _tile_dpbssd(3, 5, 7);
  _tile_stored(0, c, 64);
  if constexpr (MT == 2) _tile_stored(1, c + kTileCells, 64);
  if constexpr (NT == 2) _tile_stored(2, c + 2 * kTileCells, 64);
  if constexpr (NT == 2 && MT == 2) _tile_stored(3, c + 3 * kTileCells, 64);
}

using GroupFn = void (*)(const ASource*, int64_t, const int32_t*, int64_t, int32_t*);
constexpr GroupFn kGroupFns[2][2] = {{GroupTiles<1, 1>, GroupTiles<1, 2>},
                                     {GroupTiles<2, 1>, GroupTiles<2, 2>}};

}  // namespace

void Int8AmxBlockHardware(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / 32;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const int nt = nn > 16 ? 2 : 1;
  thread_local ASource a[2];
  thread_local AlignedVector<int8_t> padded[2];
  for (int t = 0; t < nt; ++t) MakeSource(w, n0 + 16 * t, &padded[t], &a[t]);
  const int64_t m_tiles = (x.m + 15) / 16;
  const int64_t b_next = x_groups * kTileWords;  // from one activation tile to the next
  alignas(64) int32_t c[4 * kTileCells];
  alignas(64) float acc[4 * kTileCells];  // [t * 2 + u][weight row r][activation row col]
  float ws[2][16];
  for (int64_t u0 = 0; u0 < m_tiles; u0 += 2) {
    const int mt = u0 + 1 < m_tiles ? 2 : 1;
    std::fill_n(acc, 4 * kTileCells, 0.0f);
    for (int64_t g = 0; g < groups; ++g) {
      kGroupFns[nt - 1][mt - 1](a, g, x.tiles.data() + (u0 * x_groups + g) * kTileWords, b_next,
                                c);
      for (int t = 0; t < nt; ++t) {
        for (int r = 0; r < 16; ++r) {
          const int64_t n = n0 + 16 * t + r;
          ws[t][r] = n < n0 + nn ? Bf16ToFloat(w.group_scales[n * groups + g]) : 0.0f;
        }
      }
      for (int t = 0; t < nt; ++t) {
        for (int u = 0; u < mt; ++u) {
          const __m512 xs = _mm512_loadu_ps(x.tile_scale.data() + ((u0 + u) * x_groups + g) * 16);
          const int32_t* ct = c + (t * 2 + u) * kTileCells;
          float* at = acc + (t * 2 + u) * kTileCells;
          for (int r = 0; r < 16; ++r) {
            const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(ws[t][r]), xs);
            const __m512 d = _mm512_cvtepi32_ps(_mm512_load_si512(ct + 16 * r));
            _mm512_store_ps(at + 16 * r, _mm512_fmadd_ps(d, scale, _mm512_load_ps(at + 16 * r)));
          }
        }
      }
    }
    // C tile (t, u) element [r][col]: output n0 + 16 t + r of activation row 16 (u0 + u) + col.
    for (int t = 0; t < nt; ++t) {
      for (int u = 0; u < mt; ++u) {
        const float* at = acc + (t * 2 + u) * kTileCells;
        const int64_t rows = std::min<int64_t>(16, nn - 16 * t);
        const int64_t cols = std::min<int64_t>(16, x.m - (u0 + u) * 16);
        for (int64_t col = 0; col < cols; ++col) {
          float* yr = job.y + ((u0 + u) * 16 + col) * n_rows + n0 + 16 * t;
          const float* bias = job.bias != nullptr ? job.bias + n0 + 16 * t : nullptr;
          for (int64_t r = 0; r < rows; ++r) {
            yr[r] = bias != nullptr ? at[r * 16 + col] + bias[r] : at[r * 16 + col];
          }
        }
      }
    }
  }
}

}  // namespace glmserve::internal
