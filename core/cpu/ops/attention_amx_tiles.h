// The tile products of PagedAttentionAmx's block step (attention_flash.h's Tiles), written once
// over the tile unit or its software model (amx_tiles.h): attention_amx_avx512.cc runs them on
// AMX, attention_amx.cc on the model where the tests ask for it (ForceAmxTileModel), so their
// operand strides and tile pairs are checked on any CPU. The configuration is linear_amx's:
// eight 16 x 64-byte tiles. Internal linkage, as attention_flash.h, for the same reason.
#pragma once

#include <cstdint>

#include "core/cpu/ops/amx_tiles.h"

namespace glmserve::internal {
namespace {

// C tile (t, u) = tile 2t + u: keys 16t.. of the block against query rows 16u..; A: tiles 4, 5
// (key rows), B: tiles 6, 7 (query row tiles). st is [32 keys][32 rows] fp32.
template <typename Tiles, int MT>
GLM_AMX_BF16_TARGET void AmxScoresTiles(const uint16_t* k_rows, int64_t dp, const uint16_t* q_tiles,
                                        float* st) {
  const int64_t chunks = dp / 32, lda = dp * 2;
  GLM_TILE(Tiles, zero, 0);
  GLM_TILE(Tiles, zero, 2);
  if constexpr (MT == 2) {
    GLM_TILE(Tiles, zero, 1);
    GLM_TILE(Tiles, zero, 3);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    GLM_TILE(Tiles, loadd, 4, k_rows + 32 * c, lda);
    GLM_TILE(Tiles, loadd, 5, k_rows + 16 * dp + 32 * c, lda);
    GLM_TILE(Tiles, loadd, 6, q_tiles + c * 512, 64);
    if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 7, q_tiles + (chunks + c) * 512, 64);
    GLM_TILE(Tiles, dpbf16ps, 0, 4, 6);
    GLM_TILE(Tiles, dpbf16ps, 2, 5, 6);
    if constexpr (MT == 2) {
      GLM_TILE(Tiles, dpbf16ps, 1, 4, 7);
      GLM_TILE(Tiles, dpbf16ps, 3, 5, 7);
    }
  }
  GLM_TILE(Tiles, stored, 0, st, 128);
  GLM_TILE(Tiles, stored, 2, st + 16 * 32, 128);
  if constexpr (MT == 2) {
    GLM_TILE(Tiles, stored, 1, st + 16, 128);
    GLM_TILE(Tiles, stored, 3, st + 16 * 32 + 16, 128);
  }
}

// ot_blk[d][row] for 16-row head-dim tiles dt: A = 16 rows of vt (32 keys each), B = the
// probabilities' tiles 6, 7. Even and odd dt use different C and A tiles so that one's store
// overlaps the next one's product.
template <typename Tiles, int MT>
GLM_AMX_BF16_TARGET void AmxPvTiles(const uint16_t* vt, int64_t ld, int64_t dp, const uint16_t* pt,
                                    float* ot) {
  GLM_TILE(Tiles, loadd, 6, pt, 64);
  if constexpr (MT == 2) GLM_TILE(Tiles, loadd, 7, pt + 512, 64);
  for (int64_t dt = 0; dt < dp / 16; dt += 2) {
    GLM_TILE(Tiles, zero, 0);
    GLM_TILE(Tiles, zero, 2);
    if constexpr (MT == 2) {
      GLM_TILE(Tiles, zero, 1);
      GLM_TILE(Tiles, zero, 3);
    }
    GLM_TILE(Tiles, loadd, 4, vt + 16 * dt * ld, ld * 2);
    GLM_TILE(Tiles, loadd, 5, vt + 16 * (dt + 1) * ld, ld * 2);
    GLM_TILE(Tiles, dpbf16ps, 0, 4, 6);
    GLM_TILE(Tiles, dpbf16ps, 2, 5, 6);
    if constexpr (MT == 2) {
      GLM_TILE(Tiles, dpbf16ps, 1, 4, 7);
      GLM_TILE(Tiles, dpbf16ps, 3, 5, 7);
    }
    float* o = ot + 16 * dt * 32;
    GLM_TILE(Tiles, stored, 0, o, 128);
    GLM_TILE(Tiles, stored, 2, o + 16 * 32, 128);
    if constexpr (MT == 2) {
      GLM_TILE(Tiles, stored, 1, o + 16, 128);
      GLM_TILE(Tiles, stored, 3, o + 16 * 32 + 16, 128);
    }
  }
}

// attention_flash.h's Tiles on the tile unit or its model.
template <typename Tiles>
struct AmxFlashTiles {
  static void Scores(const uint16_t* k_rows, int64_t dp, const uint16_t* q_tiles, int mt,
                     float* st) {
    mt == 2 ? AmxScoresTiles<Tiles, 2>(k_rows, dp, q_tiles, st)
            : AmxScoresTiles<Tiles, 1>(k_rows, dp, q_tiles, st);
  }
  static void Pv(const uint16_t* vt, int64_t ld, int64_t dp, const uint16_t* pt, int mt,
                 float* ot) {
    mt == 2 ? AmxPvTiles<Tiles, 2>(vt, ld, dp, pt, ot) : AmxPvTiles<Tiles, 1>(vt, ld, dp, pt, ot);
  }
};

}  // namespace
}  // namespace glmserve::internal
