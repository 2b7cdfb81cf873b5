// The AMX kernels' tile instructions, written once for two machines: Intel's tile unit and a
// software model of it that runs on any CPU. A kernel's tile code is a template over `Tiles`
// (AmxTileUnit or AmxTileModel) and issues each instruction through GLM_TILE:
//
//   GLM_TILE(Tiles, loadd, 4, weights, stride_bytes);   // TILELOADD tmm4, [weights + stride]
//   GLM_TILE(Tiles, dpbf16ps, 0, 4, 6);                 // TDPBF16PS tmm0, tmm4, tmm6
//
// On the tile unit that is the intrinsic (_tile_loadd, ...): the tile numbers must be literals,
// as GCC pastes them into the instruction's text. On the model it is the same instruction on
// this thread's software register file. So the code that addresses the operands, pads the
// tails, keeps C tiles between K ranges and stores the results (the part of an AMX kernel that
// can be wrong) runs in the tests of every CPU, not only on the AMX machines a session rarely
// gets; the kernels' tests compare it there with their portable references, bit for bit.
//
// The model keeps the instructions' rules (Intel SDM, "Intel AMX instructions"): palette 1 of
// LDTILECFG, 8 tiles of up to 16 rows x 64 bytes; TILELOADD reads the configured rows x colsb
// bytes at the stride and zeroes the rest of the tile; TILESTORED writes the configured part;
// TDPBF16PS and TDPBSSD need M = rows(C) = rows(A), N = colsb(C) = colsb(B), K = colsb(A) =
// 4 rows(B) and three different tiles. Where the tile unit would fault (#UD, #GP: a tile
// instruction before LDTILECFG or after TILERELEASE, a tile the configuration leaves empty,
// shapes that do not fit, a bad configuration) the model prints what was wrong and aborts: a
// kernel bug shows on any CPU as the crash it would be on an AMX one.
//
// The arithmetic: TDPBF16PS as linear_amx.h states it (AmxBf16Element, bf16_math.h), TDPBSSD
// as exact int32 sums that wrap. Neither model instruction is fast: it serves tests and the
// kernels' structure, not production.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>  // the intrinsics GLM_TILE names
#endif

namespace glmserve::internal {

// LDTILECFG's 64-byte operand (palette 1): bytes per row and rows of each of the 8 tiles; the
// one layout every AMX kernel and bench fills in with its own tile shapes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tile unit: GLM_TILE becomes the intrinsic. Only inside functions compiled for AMX (the
// kernels' templates carry the target attributes) and only where CPUID and the OS allow it.
struct AmxTileUnit {
  static constexpr bool kHardware = true;
};

// The software tile unit: per-thread state, the instructions' names without "_tile_".
struct AmxTileModel {
  static constexpr bool kHardware = false;
  static void loadconfig(const AmxTileConfig* config);
  static void release();
  static void loadd(int tile, const void* base, int64_t stride_bytes);
  static void stored(int tile, void* base, int64_t stride_bytes);
  static void zero(int tile);
  static void dpbf16ps(int c, int a, int b);
  static void dpbssd(int c, int a, int b);
};

}  // namespace glmserve::internal

#if defined(__x86_64__)
#define GLM_TILE(Tiles, op, ...)      \
  do {                                \
    if constexpr (Tiles::kHardware) { \
      _tile_##op(__VA_ARGS__);        \
    } else {                          \
      Tiles::op(__VA_ARGS__);         \
    }                                 \
  } while (0)
#define GLM_AMX_BF16_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define GLM_AMX_INT8_TARGET __attribute__((target("amx-tile,amx-int8")))
#else  // no tile unit: the model alone
#define GLM_TILE(Tiles, op, ...) Tiles::op(__VA_ARGS__)
#define GLM_AMX_BF16_TARGET
#define GLM_AMX_INT8_TARGET
#endif
