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
};

// Per-thread scratch of FlashRowBlock, sized for dp (64-byte aligned: tiles are loaded from it).
struct FlashScratch {
  float* st;      // [32 keys][32 rows]: scores, then probabilities
  uint16_t* pt;   // [2][512]: the probabilities as B tiles (VNNI pairs of keys)
  float* ot_blk;  // [dp][32]: one key block's P V, transposed
  float* ot;      // [dp][32]: the running output, transposed
};

// A row block's running state between key blocks: per row the max m and the sum l, and the
// unnormalised output O ([dp][32], transposed).
struct FlashState {
  float* m;   // [32]
  float* l;   // [32]
  float* ot;  // [dp][32]
};

// Row blocks of one sequence (its KV heads) that step through its key blocks together: before
// each key block, pack(pack_context, key0) writes that block for every one of them into
// k_blocks[i] ([32][dp]) and vt_blocks[i] ([dp][32]), so that each cached position's row
// (all KV heads side by side) is read once, front to back (decode; FlashBlock::k_rows and vt
// are not read). Each block's arithmetic is FlashRowBlock's: the grouping changes no bit.
constexpr int kMaxFlashGroup = 16;  // row blocks of one FlashGroup at most
struct FlashGroup {
  int count = 0;                         // 1 .. kMaxFlashGroup
  const FlashBlock* blocks = nullptr;    // [count]
  const FlashState* states = nullptr;    // [count]
  uint16_t* const* k_blocks = nullptr;   // [count]
  uint16_t* const* vt_blocks = nullptr;  // [count]
  // Packs key block key0 into k_blocks / vt_blocks for every member; nullptr: the members'
  // own packed K/V (FlashBlock::k_rows, vt) are read in place.
  void (*pack)(const void* pack_context, int64_t key0) = nullptr;
  const void* pack_context = nullptr;
};

// The block step with the tile products on the AMX unit (call between AmxThreadBegin and
// AmxThreadEnd), with their portable emulation, and with the AMX unit's tile code on the
// software tile unit (its tiles configured with AmxBf16TileConfig): the same bits.
void FlashGroupHardware(const FlashGroup& group, const FlashScratch& scratch);
void FlashGroupEmulated(const FlashGroup& group, const FlashScratch& scratch);
void FlashGroupTileModel(const FlashGroup& group, const FlashScratch& scratch);

}  // namespace glmserve::internal
