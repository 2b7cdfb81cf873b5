// PagedAttentionAmx's internals shared by its two compilations (attention_amx.cc, portable;
// attention_amx_avx512.cc, AVX-512 and AMX): the block a step works on, its scratch, and the two
// entry points. Plain data only; the code is attention_flash.h's.
#pragma once

#include <cstdint>

namespace glmserve::internal {

constexpr int kFlashRows = 32;  // query rows per block: two 16-row tiles
constexpr int kFlashKeys = 32;  // keys per block: two 16-key tiles, one 32-wide chunk for PV

// One block of query rows of one (sequence, KV head). Row r's K/V are the sequence's keys
// [0, pos[r]]; padding rows have pos -1 and are never active.
struct FlashBlock {
  const uint16_t* q_tiles = nullptr;  // [2][chunks][512]: the rows packed as B tiles
  const uint16_t* k_rows = nullptr;   // [ctx_pad][dp]: keys, bf16, zero-padded
  const uint16_t* vt = nullptr;       // [dp][ctx_pad]: values transposed, bf16, zero-padded
  int64_t ctx_pad = 0, dp = 0, head_dim = 0;
  int rows = 0;                  // 1..32 real rows
  const int32_t* pos = nullptr;  // [32]
  float scale = 1.0f;
  float* const* out = nullptr;  // [rows]: each row's head_dim outputs
  // When set, k_rows and vt are not read: before each key block the step calls
  // pack(pack_context, key0, k_block [32][dp], vt_block [dp][32]) to pack that block alone
  // (decode: the sequence's K/V are read once, straight from the cache, never staged whole).
  void (*pack)(const void* pack_context, int64_t key0, uint16_t* k_block,
               uint16_t* vt_block) = nullptr;
  const void* pack_context = nullptr;
};

// Per-thread scratch of FlashRowBlock, sized for dp (64-byte aligned: tiles are loaded from it).
struct FlashScratch {
  float* st;           // [32 keys][32 rows]: scores, then probabilities
  uint16_t* pt;        // [2][512]: the probabilities as B tiles (VNNI pairs of keys)
  float* ot_blk;       // [dp][32]: one key block's P V, transposed
  float* ot;           // [dp][32]: the running output, transposed
  uint16_t* k_block;   // [32][dp]: one key block, when FlashBlock::pack is set
  uint16_t* vt_block;  // [dp][32]: its values, transposed
};

// The block step with the tile products on the AMX unit (call between AmxThreadBegin and
// AmxThreadEnd) and with their portable emulation: the same bits.
void FlashRowBlockHardware(const FlashBlock& block, const FlashScratch& scratch);
void FlashRowBlockEmulated(const FlashBlock& block, const FlashScratch& scratch);

}  // namespace glmserve::internal
