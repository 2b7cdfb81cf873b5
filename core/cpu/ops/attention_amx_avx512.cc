// PagedAttentionAmx's block step on the AMX tile unit (the driver, the emulation and the tile
// model's run are in attention_amx.cc; the tile products in attention_amx_tiles.h). Compiled for
// AVX-512 (the softmax's vector loops); the tile products use function target attributes. The
// tile configuration is linear_amx's, loaded per thread by AmxThreadBegin.
#include <immintrin.h>

#include "core/cpu/ops/attention_amx_internal.h"
#include "core/cpu/ops/attention_amx_tiles.h"
#include "core/cpu/ops/attention_flash.h"

namespace glmserve::internal {

void FlashGroupHardware(const FlashGroup& group, const FlashScratch& scratch) {
  FlashGroupRun<AmxFlashTiles<AmxTileUnit>>(group, scratch);
}

}  // namespace glmserve::internal
