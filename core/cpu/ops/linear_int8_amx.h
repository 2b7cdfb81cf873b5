// Int8 weights in CpuMath::kBf16Amx: Intel AMX's TDPBSSD on the int8 codes, one 32-wide group
// at a time (the "group-serial" int8 arithmetic; linear.h has the other, lane-wise one).
//
// Arithmetic, per output element y[i][n], over the groups g = 0 .. ceil(K/32) - 1 in order:
//   d   = sum over the group's 32 k of xq[i][k] * wq[n][k]     (exact int32; past K both are 0)
//   acc = fma(float(d), xs[i][g] * ws[n][g], acc)              (acc starts at +0)
// then y = acc + bias[n]. xq, xs: the activation quantized per group exactly as the lane-wise
// arithmetic quantizes it (QuantizeGroupInt8: scale amax / 127, codes in [-127, 127]); wq, ws:
// the int8 weights and their bf16 group scales widened (exact). |d| <= 32 * 127 * 127 < 2^24, so
// float(d) is exact; the scales' product is one rounding and the FMA one more. The order
// depends only on K: never on m, the tile the element falls in, or the thread, so a row's bits
// do not depend on its batch (linear.h). The sum is over groups in sequence where the lane-wise
// arithmetic keeps 16 lanes and a tree: the two are different (equally well-defined) bits.
//
// Why a separate arithmetic: a tile product sums a whole tile row of K into one int32, so it
// cannot give the lane-wise arithmetic's 4-product slots; a 32-wide K tile gives exactly one
// group's dot, which the vector unit then scales and adds (as llama.cpp's AMX Q8_0 does).
//
// Layout. The weights stay as quantized at load, int8 [N, K] row-major: an A tile is 16 weight
// rows x 32 bytes (one group), loaded with the row stride; a tail group (K not a multiple of
// 32) or a last tile of fewer than 16 rows comes from a zero-padded copy. The activations'
// codes are packed once per call as B tiles (Int8Activation::tiles): tile (u, g) holds rows
// [16 u, 16 u + 16) of group g as 8 rows of 16 int32 words, word (p, i) = the 4 codes
// xq[16 u + i][32 g + 4 p .. + 3]. C = 16 weight rows x 16 activation rows of int32; with 2 x 2
// C tiles a task's pass takes 32 weight rows against 32 activation rows per group.
#pragma once

#include <cstdint>

#include "core/cpu/ops/linear.h"

namespace glmserve::internal {

// CPUID says AMX-TILE and AMX-INT8 and the OS granted the tile state (AmxPermitted's request),
// and the CPU has AVX-512 (the scaling step); false under ForceGenericKernels. Where false, the
// int8 weights of kBf16Amx run Int8AmxBlockEmulated.
bool CpuHasAmxInt8();
// The CPUID part plus the permission, without the override (asked once).
bool AmxInt8Permitted();

// Words of the packed B operand for m rows of kp (a multiple of 64) codes: one 512-byte tile
// per (16-row block, 32-wide group).
int64_t Int8AmxTilesSize(int64_t m, int64_t kp);
// Packs the 16-row block `block` of a's codes into a->tiles and its scales into a->tile_scale
// (sized by the caller: Int8AmxTilesSize words; ceil(m/16) * kp/32 * 16 floats). Rows past m
// are zeros (codes and scales). Elementwise, so any split of blocks gives the same bits.
void PackInt8AmxBlock(Int8Activation* a, int64_t block);

// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job in the group-serial arithmetic.
// The hardware one needs Int8AmxThreadBegin on its thread (and the packed tiles); the emulation
// reads the codes and group scales directly.
void Int8AmxBlockHardware(const Int8Job& job, int64_t nb);
void Int8AmxBlockEmulated(const Int8Job& job, int64_t nb);
// The hardware kernel's driver over a software model of the tiles and scalar scaling (same
// bits, any CPU; needs the packed tiles): what the tests run where AMX is missing, so the
// kernel's addressing, tails and padding are checked everywhere.
void Int8AmxBlockTileModel(const Int8Job& job, int64_t nb);
// Loads this thread's tile configuration for the int8 kernel (it differs from the bf16
// kernel's: A tiles of 32 bytes, B tiles of 8 rows) / releases the tiles. No-ops without AMX.
void Int8AmxThreadBegin();

// One TDPBSSD with the kernel's shapes, for the tests that compare hardware and emulation:
// c [16][16] int32 in and out, a [16][32] int8 (rows of C), b [8][64] (word (p, i): 4 bytes of
// column i). The hardware one returns false (and leaves c alone) without AMX-INT8.
bool AmxInt8TileDpHardware(int32_t* c, const int8_t* a, const int8_t* b);
void AmxInt8TileDpEmulated(int32_t* c, const int8_t* a, const int8_t* b);

}  // namespace glmserve::internal
