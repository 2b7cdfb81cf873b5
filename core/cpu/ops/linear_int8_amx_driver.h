// The AMX int8 kernel's driver and tile code (linear_int8_amx.h), written once so that the same
// tiling runs on the tile unit (linear_int8_amx_avx512.cc: TDPBSSD and AVX-512) and on the
// software model of the tiles (amx_tiles.h; linear_int8_amx.cc: the tests run it on any CPU,
// which checks the operand addressing, the tails and the padding without AMX). Internal to
// those two files.
//
// Ops provides:
//   using Tiles = ...;  the tile unit or its software model (amx_tiles.h), which runs the
//     groups' tile code below (Int8TileGroup, Int8TileRows16Group);
//   static void ScaleRow(float* acc, const int32_t* d, float ws, const float* xs);
//     acc[j] = fma(float(d[j]), ws * xs[j], acc[j]) for j < 16 (kRows16 passes the activation
//     row's scale as ws and the 16 weight rows' as xs: the product commutes, so the bits are
//     the reference's xs * ws).
// Only templates live here: each file instantiates them for its own ISA and Tiles, so no
// function compiled for AVX-512 can be linked into a caller on another CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/ops/amx_tiles.h"
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

// The tile configuration both drivers run under (Int8AmxThreadBegin; the model's own): tiles
// 0-3 C, 16 rows of 16 int32; 4, 5 A, 16 rows of one 32-byte group; 6, 7 B, 8 rows of 16 words.
// C tile (t, u) is tile 2t + u; NT x MT of them in use.
template <typename Tiles, int NT, int MT>
GLM_AMX_INT8_TARGET inline void Int8ZeroC() {
  GLM_TILE(Tiles, zero, 0);
  if constexpr (MT == 2) GLM_TILE(Tiles, zero, 1);
  if constexpr (NT == 2) GLM_TILE(Tiles, zero, 2);
  if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, zero, 3);
}
template <typename Tiles, int NT, int MT>
GLM_AMX_INT8_TARGET inline void Int8StoreC(int32_t* c) {
  GLM_TILE(Tiles, stored, 0, c, 64);
  if constexpr (MT == 2) GLM_TILE(Tiles, stored, 1, c + kInt8AmxTileCells, 64);
  if constexpr (NT == 2) GLM_TILE(Tiles, stored, 2, c + 2 * kInt8AmxTileCells, 64);
  if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, stored, 3, c + 3 * kInt8AmxTileCells, 64);
}

// Group g's int32 dots of NT (1, 2) weight tiles x MT (1, 2) activation tiles into
// c [NT * 2 + MT][16][16] (C tile (t, u) at 2t + u); b: the group's B tile of the first
// activation tile, the second's b_next words further.
template <typename Tiles, int NT, int MT>
GLM_AMX_INT8_TARGET void Int8TileGroup(const Int8ASource* a, int64_t g, const int32_t* b,
                                       int64_t b_next, int32_t* c) {
  Int8ZeroC<Tiles, NT, MT>();
  if (g < a[0].ld / 32) {
    GLM_TILE(Tiles, loadd, 4, a[0].p + 32 * g, a[0].ld);
    if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 5, a[1].p + 32 * g, a[1].ld);
  } else {
    GLM_TILE(Tiles, loadd, 4, a[0].tail, 32);
    if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 5, a[1].tail, 32);
  }
  GLM_TILE(Tiles, loadd, 6, b, 64);
  if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 7, b + b_next, 64);
  GLM_TILE(Tiles, dpbssd, 0, 4, 6);
  if constexpr (MT == 2) GLM_TILE(Tiles, dpbssd, 1, 4, 7);
  if constexpr (NT == 2) GLM_TILE(Tiles, dpbssd, 2, 5, 6);
  if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, dpbssd, 3, 5, 7);
  Int8StoreC<Tiles, NT, MT>(c);
}

// kRows16 weights: one group's int32 dots of MT (1, 2) activation tiles (A: 16 rows x 32 bytes
// in place from a, row stride lda; the second 16 rows further) x NT (1, 2) weight blocks (B: a
// block's group in place, 512 bytes from b; the second b_next bytes further) into
// c [NT * 2 + MT][16][16], C tile (t, u) at 2t + u, element [activation row][weight row].
template <typename Tiles, int NT, int MT>
GLM_AMX_INT8_TARGET void Int8TileRows16Group(const int8_t* a, int64_t lda, const int8_t* b,
                                             int64_t b_next, int32_t* c) {
  Int8ZeroC<Tiles, NT, MT>();
  GLM_TILE(Tiles, loadd, 4, a, lda);
  if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 5, a + 16 * lda, lda);
  GLM_TILE(Tiles, loadd, 6, b, 64);
  if constexpr (NT == 2) GLM_TILE(Tiles, loadd, 7, b + b_next, 64);
  GLM_TILE(Tiles, dpbssd, 0, 4, 6);  // C (t, u) = (0, 0)
  if constexpr (MT == 2) GLM_TILE(Tiles, dpbssd, 1, 5, 6);
  if constexpr (NT == 2) GLM_TILE(Tiles, dpbssd, 2, 4, 7);
  if constexpr (NT == 2 && MT == 2) GLM_TILE(Tiles, dpbssd, 3, 5, 7);
  Int8StoreC<Tiles, NT, MT>(c);
}

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
  using Tiles = typename Ops::Tiles;
  constexpr GroupFn kGroup[2][2] = {{Int8TileGroup<Tiles, 1, 1>, Int8TileGroup<Tiles, 1, 2>},
                                    {Int8TileGroup<Tiles, 2, 1>, Int8TileGroup<Tiles, 2, 2>}};
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

// kRows16 weights (linear_int8_amx.h): the task's output rows lie in up to 3 blocks (2 unless
// a RowSlice starts inside one), taken two at a time; the activation rows 32 at a time. Per
// group the C tiles hold [activation row][block lane]; only the activation rows that exist are
// scaled, and a lane outside the task's rows (the phase, the padding) is never stored.
template <typename Ops>
void Int8AmxRows16Block(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n_rows = w.rows, groups = w.scale_cols(), x_groups = x.kp / kInt8Group;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const int64_t block_begin = w.int8_block(n0), block_end = w.int8_block(n0 + nn - 1) + 1;
  const int8_t* codes = static_cast<const int8_t*>(w.data);
  const int64_t b_next = groups * kInt8BlockGroupBytes;  // from one block to the next
  using GroupFn = void (*)(const int8_t*, int64_t, const int8_t*, int64_t, int32_t*);
  using Tiles = typename Ops::Tiles;
  constexpr GroupFn kGroup[2][2] = {
      {Int8TileRows16Group<Tiles, 1, 1>, Int8TileRows16Group<Tiles, 1, 2>},
      {Int8TileRows16Group<Tiles, 2, 1>, Int8TileRows16Group<Tiles, 2, 2>}};
  const int64_t m_tiles = (x.m + 15) / 16;
  alignas(64) int32_t c[4 * kInt8AmxTileCells];
  // [t * 2 + u][activation row i][lane]: every output of the pass, for all of K.
  alignas(64) float acc[4 * kInt8AmxTileCells];
  alignas(64) float ws[2][16];
  for (int64_t b0 = block_begin; b0 < block_end; b0 += 2) {
    const int nt = b0 + 1 < block_end ? 2 : 1;
    for (int64_t u0 = 0; u0 < m_tiles; u0 += 2) {
      const int mt = u0 + 1 < m_tiles ? 2 : 1;
      int64_t rows[2];  // activation rows that exist in each A tile
      for (int u = 0; u < 2; ++u) rows[u] = std::clamp<int64_t>(x.m - 16 * (u0 + u), 0, 16);
      std::fill_n(acc, 4 * kInt8AmxTileCells, 0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        kGroup[nt - 1][mt - 1](x.q.data() + 16 * u0 * x.kp + kInt8Group * g, x.kp,
                               codes + (b0 * groups + g) * kInt8BlockGroupBytes, b_next, c);
        for (int t = 0; t < nt; ++t) {
          const uint16_t* s = w.group_scales + ((b0 + t) * groups + g) * kInt8BlockRows;
          for (int r = 0; r < 16; ++r) ws[t][r] = Bf16ToFloat(s[r]);
        }
        for (int t = 0; t < nt; ++t) {
          for (int u = 0; u < mt; ++u) {
            const int32_t* ct = c + (t * 2 + u) * kInt8AmxTileCells;
            float* at = acc + (t * 2 + u) * kInt8AmxTileCells;
            const float* xs = x.group_scale.data() + 16 * (u0 + u) * x_groups + g;
            for (int64_t i = 0; i < rows[u]; ++i) {
              Ops::ScaleRow(at + 16 * i, ct + 16 * i, xs[i * x_groups], ws[t]);
            }
          }
        }
      }
      // C tile (t, u) element [i][lane]: activation row 16 (u0 + u) + i, output row
      // lane_row0 + lane.
      for (int t = 0; t < nt; ++t) {
        const int64_t lane_row0 = w.int8_block_row0(b0 + t);
        const int64_t begin = std::max(n0, lane_row0);
        const int64_t end = std::min(n0 + nn, lane_row0 + kInt8BlockRows);
        for (int u = 0; u < mt; ++u) {
          const float* at = acc + (t * 2 + u) * kInt8AmxTileCells;
          for (int64_t i = 0; i < rows[u]; ++i) {
            float* yr = job.y + (16 * (u0 + u) + i) * n_rows;
            for (int64_t n = begin; n < end; ++n) {
              const float v = at[16 * i + (n - lane_row0)];
              yr[n] = job.bias != nullptr ? v + job.bias[n] : v;
            }
          }
        }
      }
    }
  }
}

}  // namespace glmserve::internal
