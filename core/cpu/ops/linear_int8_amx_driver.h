// The AMX int8 kernel's driver (linear_int8_amx.h), written once over its two primitives so that
// the same tiling runs on the tile unit (linear_int8_amx_avx512.cc: TDPBSSD and AVX-512) and on
// a software model of the tiles (linear_int8_amx.cc: the tests run it on any CPU, which checks
// the operand addressing, the tails and the padding without AMX). Internal to those two files.
//
// Ops provides:
//   template <int NT, int MT> static void Group(const Int8ASource* a, int64_t g,
//                                               const int32_t* b, int64_t b_next, int32_t* c);
//     group g's int32 dots of NT (1, 2) weight tiles x MT (1, 2) activation tiles into
//     c [NT * 2 + MT][16][16] (C tile (t, u) at 2t + u); b: the group's B tile of the first
//     activation tile, the second's b_next words further;
//   static void ScaleRow(float* acc, const int32_t* d, float ws, const float* xs);
//     acc[j] = fma(float(d[j]), ws * xs[j], acc[j]) for j < 16.
// Only templates live here: each file instantiates them for its own ISA, so no function
// compiled for AVX-512 can be linked into a caller on another CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/ops/linear.h"

namespace glmserve::internal {

// One A tile's source: 16 weight rows read in place (stride ld bytes) for the groups wholly
// inside K, and a zero-padded copy of the tail group. A tile of fewer than 16 rows reads a
// padded copy of its rows (`padded`), so that no load passes the matrix.
struct Int8ASource {
  const int8_t* p = nullptr;
  int64_t ld = 0;
  alignas(64) int8_t tail[16 * 32];
};
// Fills s for weight rows [row0, row0 + 16) of w (linear_int8_amx.cc).
void MakeInt8ASource(const Matrix& w, int64_t row0, std::vector<int8_t>* padded, Int8ASource* s);

inline constexpr int64_t kInt8AmxTileWords = 8 * 16;   // one B tile: 8 rows of 16 words
inline constexpr int64_t kInt8AmxTileCells = 16 * 16;  // one C tile

template <typename Ops>
void Int8AmxBlock(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / 32;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const int nt = nn > 16 ? 2 : 1;
  thread_local Int8ASource a[2];
  thread_local std::vector<int8_t> padded[2];
  for (int t = 0; t < nt; ++t) MakeInt8ASource(w, n0 + 16 * t, &padded[t], &a[t]);
  using GroupFn = void (*)(const Int8ASource*, int64_t, const int32_t*, int64_t, int32_t*);
  constexpr GroupFn kGroup[2][2] = {{Ops::template Group<1, 1>, Ops::template Group<1, 2>},
                                    {Ops::template Group<2, 1>, Ops::template Group<2, 2>}};
  const int64_t m_tiles = (x.m + 15) / 16;
  const int64_t b_next = x_groups * kInt8AmxTileWords;  // from one activation tile to the next
  alignas(64) int32_t c[4 * kInt8AmxTileCells];
  // [t * 2 + u][weight row r][activation row col]: every output of the pass, for all of K.
  alignas(64) float acc[4 * kInt8AmxTileCells];
  float ws[2][16];
  for (int64_t u0 = 0; u0 < m_tiles; u0 += 2) {
    const int mt = u0 + 1 < m_tiles ? 2 : 1;
    std::fill_n(acc, 4 * kInt8AmxTileCells, 0.0f);
    for (int64_t g = 0; g < groups; ++g) {
      kGroup[nt - 1][mt - 1](a, g, x.tiles.data() + (u0 * x_groups + g) * kInt8AmxTileWords, b_next,
                             c);
      for (int t = 0; t < nt; ++t) {
        for (int r = 0; r < 16; ++r) {
          const int64_t n = n0 + 16 * t + r;
          ws[t][r] = n < n0 + nn ? Bf16ToFloat(w.group_scales[n * groups + g]) : 0.0f;
        }
      }
      for (int t = 0; t < nt; ++t) {
        for (int u = 0; u < mt; ++u) {
          const float* xs = x.tile_scale.data() + ((u0 + u) * x_groups + g) * 16;
          const int32_t* ct = c + (t * 2 + u) * kInt8AmxTileCells;
          float* at = acc + (t * 2 + u) * kInt8AmxTileCells;
          for (int r = 0; r < 16; ++r) Ops::ScaleRow(at + 16 * r, ct + 16 * r, ws[t][r], xs);
        }
      }
    }
    // C tile (t, u) element [r][col]: output n0 + 16 t + r of activation row 16 (u0 + u) + col.
    for (int t = 0; t < nt; ++t) {
      for (int u = 0; u < mt; ++u) {
        const float* at = acc + (t * 2 + u) * kInt8AmxTileCells;
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
