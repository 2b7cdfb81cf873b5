// Int8 weights on Intel AMX: TDPBSSD on the int8 codes, one 32-wide group at a time, in any
// CpuMath where the CPU has AMX-INT8. The arithmetic is the group-serial one linear.h defines
// (one exact int32 dot per group, one FMA per group, groups in order); a 32-wide K tile gives
// exactly one group's dot, which the vector unit then scales and adds (as llama.cpp's AMX Q8_0
// does). Int8BlockGeneric (linear_int8.cc) is the reference it matches bit for bit.
//
// Layout. The weights stay as quantized at load, int8 [N, K] row-major: an A tile is 16 weight
// rows x 32 bytes (one group), loaded with the row stride; a tail group (K not a multiple of
// 32) or a last tile of fewer than 16 rows comes from a zero-padded copy. The activations'
// codes are packed once per call as B tiles (Int8Activation::tiles): tile (u, g) holds rows
// [16 u, 16 u + 16) of group g as 8 rows of 16 int32 words, word (p, i) = the 4 codes
// xq[16 u + i][32 g + 4 p .. + 3]. C = 16 weight rows x 16 activation rows of int32; with 2 x 2
// C tiles a task's pass takes 32 weight rows against 32 activation rows per group.
//
// Int8Layout::kRows16 weights (what QuantizeWeights keeps on AVX512-VNNI CPUs, AMX ones
// included) take the operands' roles the other way round, and neither needs a copy: a block's
// 32-wide group is stored as a B tile (8 rows of 64 bytes, word (p, r) = the 4 codes of weight
// row 16 b + r at 32 g + 4 p), loaded in place; the activation rows are A tiles, 16 rows x 32
// bytes loaded in place from q (Int8Operands::kAmxRows pads q to whole tiles). C = 16
// activation rows x 16 weight rows, so the scaling touches only the activation rows that exist
// (decode-sized batches) and each result row is a run of outputs. The tile configuration is the
// same (A 16 x 32 bytes, B 8 x 64).
#pragma once

#include <cstdint>

#include "core/cpu/ops/linear.h"

namespace glmserve::internal {

// CPUID says AMX-TILE and AMX-INT8 and the OS granted the tile state (AmxPermitted's request),
// and the CPU has AVX-512 (the scaling step); false under ForceGenericKernels. Where false, the
// int8 weights run the VNNI, AVX2 or portable kernel (linear.h), with the same bits.
bool CpuHasAmxInt8();
// The CPUID part plus the permission, without the override (asked once).
bool AmxInt8Permitted();

// Words of the packed B operand for m rows of kp (a multiple of 64) codes: one 512-byte tile
// per (16-row block, 32-wide group).
int64_t Int8AmxTilesSize(int64_t m, int64_t kp);
// Packs the 16-row block `block` of a's codes into a->tiles and its scales into a->tile_scale
// (sized by the caller: Int8AmxTilesSize words; ceil(m/16) * kp/32 * 16 floats), each code
// biased by 128 where a->operands is kVnniTiles (the VNNI kernel shares this layout). Rows past
// m are code 0 and scale 0. Elementwise, so any split of blocks gives the same bits.
void PackInt8AmxBlock(Int8Activation* a, int64_t block);

// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job. Needs Int8AmxThreadBegin on its
// thread and the packed tiles (Int8Operands::kAmxTiles).
void Int8AmxBlockHardware(const Int8Job& job, int64_t nb);
// The hardware kernel's driver and tile code on the software tile unit (amx_tiles.h), with
// scalar scaling (same bits, any CPU; needs the packed tiles): what the tests run where AMX is
// missing, so the kernel's addressing, tails and padding are checked everywhere.
void Int8AmxBlockTileModel(const Int8Job& job, int64_t nb);
// The same for kRows16 weights and Int8Operands::kAmxRows activations (weights as B tiles).
void Int8AmxRows16BlockHardware(const Int8Job& job, int64_t nb);
void Int8AmxRows16BlockTileModel(const Int8Job& job, int64_t nb);
// Tests: LinearMany picks operands as on an AMX-INT8 CPU (Int8OperandsFor) and runs both
// kernels' drivers on the software tile model, so a whole model's int8 path through AMX (the
// dispatch, the operands, the thresholds) is checked where the CPU has no AMX.
void ForceInt8AmxTileModel(bool force);
bool Int8AmxTileModelForced();
// Loads this thread's tile configuration for the int8 kernels (it differs from the bf16
// kernel's: A tiles of 32 bytes, B tiles of 8 rows) / releases the tiles. No-ops without AMX.
void Int8AmxThreadBegin();

// One TDPBSSD with the kernel's shapes, for the tests that compare hardware and emulation:
// c [16][16] int32 in and out, a [16][32] int8 (rows of C), b [8][64] (word (p, i): 4 bytes of
// column i). The hardware one returns false (and leaves c alone) without AMX-INT8.
bool AmxInt8TileDpHardware(int32_t* c, const int8_t* a, const int8_t* b);
void AmxInt8TileDpEmulated(int32_t* c, const int8_t* a, const int8_t* b);

}  // namespace glmserve::internal
