// The block step of PagedAttentionAmx (attention_amx.h), written once and compiled twice: in
// attention_amx.cc for any x86-64 (with the portable emulation of the tile products) and in
// attention_amx_avx512.cc for AVX-512 (with the AMX tile products). Everything here has
// internal linkage, so the two compilations never meet at link time (an inline function
// compiled for AVX-512 must not be picked for a caller on a machine without it), and the
// code uses only elementwise operations and sums written in one order: the compiler
// vectorises the loops over query rows without reassociating (the build forbids FMA
// contraction), so both give the same bits.
//
// The layout is transposed (keys and head dims as rows, query rows as columns) so that every
// per-row quantity (the running max, the sum, the rescale factor) is a vector over the block's
// 32 query rows, and the sums over keys are vector adds in key order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu/ops/attention_amx_internal.h"
#include "core/cpu/ops/bf16_math.h"    // Bf16Pair
#include "core/cpu/ops/softmax_row.h"  // ExpNonPositive, the two-pass softmax's exp too

namespace glmserve::internal {
namespace {

inline float FlashMax(float a, float b) { return a > b ? a : b; }

// Tiles provides the two tile products (attention_amx.cc: emulated; attention_amx_tiles.h: on
// the tile unit or its software model):
//   Scores(k_rows, dp, q_tiles, mt, st): st[key][row] for the block's 32 keys (rows of k_rows)
//     and mt * 16 query rows, each element one TDPBF16PS chain over the dp / 32 chunks from +0.
//   Pv(vt, ctx_pad, dp, pt, mt, ot_blk): ot_blk[d][row] = one TDPBF16PS from +0 over the 32 keys.
// The row block's running state before its first key block: m = -inf, l = 0, O = 0.
inline void FlashBegin(int64_t dp, const FlashState& state) {
  for (int r = 0; r < kFlashRows; ++r) {
    state.m[r] = -__builtin_inff();
    state.l[r] = 0.0f;
  }
  for (int64_t i = 0; i < dp * kFlashRows; ++i) state.ot[i] = 0.0f;
}

// One key block (keys key0 .. key0 + 31: k_rows [32][dp], values vt [dp][ld]) of row block b.
template <typename Tiles>
void FlashStep(const FlashBlock& b, int32_t key0, const uint16_t* k_rows, const uint16_t* vt,
               int64_t ld, const FlashScratch& s, const FlashState& state) {
  // Every loop over rows runs all 32 (a fixed trip count, so the compiler vectorises it);
  // padding rows (pos -1) are never active and never stored. With one row tile the second
  // tile's score columns are stale: masked like every inactive row's.
  constexpr int R = kFlashRows;
  const int mt = b.rows > 16 ? 2 : 1;
  const int64_t dp = b.dp;
  // Local copies: the compiler cannot prove the scratch does not alias b's arrays or the
  // state, and would not vectorise the loops that read them while writing the scores
  // (measured: scalar code).
  alignas(64) int32_t pos[R];
  alignas(64) float m[R], l[R], alpha[R], m_new[R], sum[R];
  for (int r = 0; r < R; ++r) {
    pos[r] = b.pos[r];
    m[r] = state.m[r];
    l[r] = state.l[r];
  }
  const float scale = b.scale;
  Tiles::Scores(k_rows, dp, b.q_tiles, mt, s.st);
  // Scale and mask (keys after the row's position: -inf), then the block's max per row.
  for (int r = 0; r < R; ++r) m_new[r] = -__builtin_inff();
  for (int k = 0; k < kFlashKeys; ++k) {
    float* __restrict st = s.st + k * R;
    for (int r = 0; r < R; ++r) {
      const float v = key0 + k <= pos[r] ? st[r] * scale : -__builtin_inff();
      st[r] = v;
      m_new[r] = FlashMax(m_new[r], v);
    }
  }
  for (int r = 0; r < R; ++r) {
    m_new[r] = FlashMax(m[r], m_new[r]);
    alpha[r] = ExpNonPositive(m[r] - m_new[r]);  // 0 on a row's first block (m = -inf)
    sum[r] = 0.0f;
  }
  for (int k = 0; k < kFlashKeys; ++k) {
    float* __restrict st = s.st + k * R;
    for (int r = 0; r < R; ++r) {
      st[r] = ExpNonPositive(st[r] - m_new[r]);
      sum[r] += st[r];  // in key order
    }
  }
  // A row is active in this block when its position reaches the block's first key.
  for (int r = 0; r < R; ++r) {
    const bool active = key0 <= pos[r];
    l[r] = active ? l[r] * alpha[r] + sum[r] : l[r];
    m[r] = active ? m_new[r] : m[r];
  }
  // P as B tiles: pair row p of tile u holds keys 2p, 2p + 1 of rows 16u .. 16u + 15, as one
  // dword per row (Bf16Pair), so the loop vectorises as 32-bit lanes (16-bit stores of
  // the two halves compiled to word permutes, 18% of a 2,048-token prompt's attention).
  for (int u = 0; u < mt; ++u) {
    for (int p = 0; p < 16; ++p) {
      const float* __restrict even = s.st + (2 * p) * R + 16 * u;
      const float* __restrict odd = even + R;
      uint32_t pairs[16];
      for (int i = 0; i < 16; ++i) pairs[i] = Bf16Pair(even[i], odd[i]);
      std::memcpy(s.pt + u * 512 + p * 32, pairs, sizeof pairs);
    }
  }
  Tiles::Pv(vt, ld, dp, s.pt, mt, s.ot_blk);
  // O = O alpha + P V on the active rows; an inactive row (all its keys masked) keeps every bit.
  for (int64_t d = 0; d < dp; ++d) {
    float* __restrict o = state.ot + d * R;
    const float* __restrict c = s.ot_blk + d * R;
    for (int r = 0; r < R; ++r) o[r] = key0 <= pos[r] ? o[r] * alpha[r] + c[r] : o[r];
  }
  for (int r = 0; r < R; ++r) {
    state.m[r] = m[r];
    state.l[r] = l[r];
  }
}

// out = O / l: divided in place as vectors over the rows, then copied out row by row.
inline void FlashEnd(const FlashBlock& b, const FlashState& state) {
  constexpr int R = kFlashRows;
  alignas(64) float l[R];
  for (int r = 0; r < R; ++r) l[r] = state.l[r];
  for (int64_t d = 0; d < b.head_dim; ++d) {
    float* __restrict o = state.ot + d * R;
    for (int r = 0; r < R; ++r) o[r] = o[r] / l[r];
  }
  for (int r = 0; r < b.rows; ++r) {
    float* out = b.out[r];
    for (int64_t d = 0; d < b.head_dim; ++d) out[d] = state.ot[d * R + r];
  }
}

// Key blocks a row block steps through: those up to its last row's position.
inline int64_t FlashKeyBlocks(const FlashBlock& b) {
  int32_t max_pos = -1;
  for (int r = 0; r < kFlashRows; ++r) max_pos = b.pos[r] > max_pos ? b.pos[r] : max_pos;
  return max_pos / kFlashKeys + 1;
}

// A group of row blocks stepping through the key blocks together (FlashGroup).
template <typename Tiles>
void FlashGroupRun(const FlashGroup& g, const FlashScratch& s) {
  int64_t own[kMaxFlashGroup];  // each block's key blocks (FlashKeyBlocks), asked once
  int64_t blocks = 0;
  for (int i = 0; i < g.count; ++i) {
    FlashBegin(g.blocks[i].dp, g.states[i]);
    own[i] = FlashKeyBlocks(g.blocks[i]);
    blocks = std::max(blocks, own[i]);
  }
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int32_t key0 = static_cast<int32_t>(kb * kFlashKeys);
    if (g.pack != nullptr) g.pack(g.pack_context, key0);
    for (int i = 0; i < g.count; ++i) {
      // Past a block's last row, every row is inactive: the step would keep every bit.
      if (kb >= own[i]) continue;
      const FlashBlock& b = g.blocks[i];
      if (g.pack != nullptr) {
        FlashStep<Tiles>(b, key0, g.k_blocks[i], g.vt_blocks[i], kFlashKeys, s, g.states[i]);
      } else {
        FlashStep<Tiles>(b, key0, b.k_rows + key0 * b.dp, b.vt + key0, b.ctx_pad, s, g.states[i]);
      }
    }
  }
  for (int i = 0; i < g.count; ++i) FlashEnd(g.blocks[i], g.states[i]);
}
}  // namespace
}  // namespace glmserve::internal
