// PagedAttentionAmx's block step on the AMX tile unit (the driver and the emulation are in
// attention_amx.cc). Compiled for AVX-512 (the softmax's vector loops); the tile products use
// function target attributes. The tile configuration is linear_amx's: eight 16 x 64-byte tiles,
// loaded per thread by AmxThreadBegin.
#include <immintrin.h>

#include "core/cpu/ops/attention_amx_internal.h"
#include "core/cpu/ops/attention_flash.h"

#define GLM_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

namespace glmserve::internal {
namespace {

// C tile (t, u) = tile 2t + u: keys 16t.. of the block against query rows 16u..; A: tiles 4, 5
// (key rows), B: tiles 6, 7 (query row tiles). st is [32 keys][32 rows] fp32.
template <int MT>
GLM_AMX_TARGET void ScoresTiles(const uint16_t* k_rows, int64_t dp, const uint16_t* q_tiles,
                                float* st) {
  const int64_t chunks = dp / 32, lda = dp * 2;
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (MT == 2) {
    _tile_zero(1);
    _tile_zero(3);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, k_rows + 32 * c, lda);
    _tile_loadd(5, k_rows + 16 * dp + 32 * c, lda);
    _tile_loadd(6, q_tiles + c * 512, 64);
    if constexpr (MT == 2) _tile_loadd(7, q_tiles + (chunks + c) * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2) {
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, st, 128);
  _tile_stored(2, st + 16 * 32, 128);
  if constexpr (MT == 2) {
    _tile_stored(1, st + 16, 128);
    _tile_stored(3, st + 16 * 32 + 16, 128);
  }
}

// ot_blk[d][row] for 16-row head-dim tiles dt: A = 16 rows of vt (32 keys each), B = the
// probabilities' tiles 6, 7. Even and odd dt use different C and A tiles so that one's store
// overlaps the next one's product.
template <int MT>
GLM_AMX_TARGET void PvTiles(const uint16_t* vt, int64_t ld, int64_t dp, const uint16_t* pt,
                            float* ot) {
  _tile_loadd(6, pt, 64);
  if constexpr (MT == 2) _tile_loadd(7, pt + 512, 64);
  for (int64_t dt = 0; dt < dp / 16; dt += 2) {
    _tile_zero(0);
    _tile_zero(2);
    if constexpr (MT == 2) {
      _tile_zero(1);
      _tile_zero(3);
    }
    _tile_loadd(4, vt + 16 * dt * ld, ld * 2);
    _tile_loadd(5, vt + 16 * (dt + 1) * ld, ld * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2) {
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* o = ot + 16 * dt * 32;
    _tile_stored(0, o, 128);
    _tile_stored(2, o + 16 * 32, 128);
    if constexpr (MT == 2) {
      _tile_stored(1, o + 16, 128);
      _tile_stored(3, o + 16 * 32 + 16, 128);
    }
  }
}

struct HardwareTiles {
  static void Scores(const uint16_t* k_rows, int64_t dp, const uint16_t* q_tiles, int mt,
                     float* st) {
    mt == 2 ? ScoresTiles<2>(k_rows, dp, q_tiles, st) : ScoresTiles<1>(k_rows, dp, q_tiles, st);
  }
  static void Pv(const uint16_t* vt, int64_t ld, int64_t dp, const uint16_t* pt, int mt,
                 float* ot) {
    mt == 2 ? PvTiles<2>(vt, ld, dp, pt, ot) : PvTiles<1>(vt, ld, dp, pt, ot);
  }
};

}  // namespace

void FlashRowBlockHardware(const FlashBlock& block, const FlashScratch& scratch) {
  FlashRowBlock<HardwareTiles>(block, scratch);
}

void FlashGroupHardware(const FlashGroup& group, const FlashScratch& scratch) {
  FlashGroupRun<HardwareTiles>(group, scratch);
}

}  // namespace glmserve::internal
