// PagedAttentionAmx (attention_amx.h): packing K/V and the query rows, the work split, the
// portable emulation of the block step and its tile products on the software tile unit (the
// AMX one is in attention_amx_avx512.cc).
#include "core/cpu/ops/attention_amx.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/attention_amx_internal.h"
#include "core/cpu/ops/attention_amx_tiles.h"
#include "core/cpu/ops/attention_flash.h"
#include "core/cpu/ops/bf16_pack_avx512.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace glmserve {
namespace internal {
namespace {

// The tile products of FlashRowBlock through AmxTileDpEmulated (linear_amx.h), which gives
// TDPBF16PS's bits: A operands are copied to contiguous 16 x 32 tiles first.
struct EmulatedTiles {
  static void Scores(const uint16_t* k_rows, int64_t dp, const uint16_t* q_tiles, int mt,
                     float* st) {
    const int64_t chunks = dp / 32;
    uint16_t a[kAmxTileElems];
    float c[256];
    for (int t = 0; t < 2; ++t) {
      for (int u = 0; u < mt; ++u) {
        std::fill_n(c, 256, 0.0f);
        for (int64_t ch = 0; ch < chunks; ++ch) {
          for (int r = 0; r < 16; ++r) {
            std::copy_n(k_rows + (16 * t + r) * dp + 32 * ch, 32, a + r * 32);
          }
          AmxTileDpEmulated(c, a, q_tiles + (u * chunks + ch) * kAmxTileElems);
        }
        for (int r = 0; r < 16; ++r) std::copy_n(c + r * 16, 16, st + (16 * t + r) * 32 + 16 * u);
      }
    }
  }
  static void Pv(const uint16_t* vt, int64_t ld, int64_t dp, const uint16_t* pt, int mt,
                 float* ot) {
    uint16_t a[kAmxTileElems];
    float c[256];
    for (int64_t dt = 0; dt < dp / 16; ++dt) {
      for (int r = 0; r < 16; ++r) std::copy_n(vt + (16 * dt + r) * ld, 32, a + r * 32);
      for (int u = 0; u < mt; ++u) {
        std::fill_n(c, 256, 0.0f);
        AmxTileDpEmulated(c, a, pt + u * kAmxTileElems);
        for (int r = 0; r < 16; ++r) std::copy_n(c + r * 16, 16, ot + (16 * dt + r) * 32 + 16 * u);
      }
    }
  }
};

// One (sequence, KV head): its query rows are (token, head of the group), token-major.
struct Unit {
  int64_t seq = 0, kv_head = 0;
  int64_t first_row = 0;  // the sequence's first batch row (token)
  int64_t tokens = 0, start = 0, ctx = 0, ctx_pad = 0;
  int64_t k_offset = 0, v_offset = 0;  // into the packing arena, in elements
  int64_t row_blocks(int64_t group) const { return (tokens * group + kFlashRows - 1) / kFlashRows; }
};

constexpr int64_t kPrefetchKeys = 4;                // positions ahead that PackKeys prefetches
constexpr int64_t kPackKeys = 256;                  // keys per packing work item
constexpr int64_t kArenaBytes = int64_t{32} << 20;  // packed K/V per round of units
constexpr int64_t kStagedRowBlocks = 4;             // row blocks per staged work item

// FloatToBf16 (core/base/dtype.h) without its branch, so that the loops below vectorise.
inline uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded);
}

// Keys [k0, k1) of a unit (both multiples of 32) as bf16: key p's row at k_rows + (p - base) *
// dp, its values at vt[d * ld + p - base] (transposed); padding (keys >= ctx, dims >= head_dim)
// is +0. Values go through a [32][dp] staging tile so that the transpose reads it, not the cache.
#if defined(__x86_64__)
// staged [32 keys][dp] -> dst[d * ld + key] for one key block: the scalar transpose's bits.
// A pair of dims (d, d + 1) of one key is one dword: 16 x 16 dword transposes give, per pair,
// its 16 keys' dwords, and one two-source permute per output row keeps the low (d) or the
// high (d + 1) halves of the 32 keys.
GLM_AVX512_TARGET void TransposeValuesAvx512(const uint16_t* staged, int64_t dp, uint16_t* dst,
                                             int64_t ld) {
  alignas(64) static constexpr uint16_t kEven[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                     22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                                     44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  const __m512i even = _mm512_load_si512(kEven);
  const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
  for (int64_t d0 = 0; d0 < dp; d0 += 32) {
    __m512i lo[16], hi[16];  // keys 0..15 and 16..31; dwords: the pairs of d0 .. d0 + 31
    for (int i = 0; i < 16; ++i) {
      lo[i] = _mm512_loadu_si512(staged + i * dp + d0);
      hi[i] = _mm512_loadu_si512(staged + (16 + i) * dp + d0);
    }
    Transpose16x16(lo);
    Transpose16x16(hi);
    for (int j = 0; j < 16; ++j) {
      const int64_t d = d0 + 2 * j;
      _mm512_storeu_si512(dst + d * ld, _mm512_permutex2var_epi16(lo[j], even, hi[j]));
      _mm512_storeu_si512(dst + (d + 1) * ld, _mm512_permutex2var_epi16(lo[j], odd, hi[j]));
    }
  }
}
#endif

// The start of a host fp32 or bf16 cache's key (kind 0) or value rows of `block`, as bytes.
inline const char* RowBytes(const KvCache& cache, int64_t layer, int32_t block, int kind) {
  if (cache.host_bf16()) return reinterpret_cast<const char*>(cache.bf16_rows(layer, block, kind));
  return reinterpret_cast<const char*>(kind == 0 ? cache.keys(layer, block)
                                                 : cache.values(layer, block));
}

// Where PackKeys writes: for each of `heads` units (KV heads of one sequence, in kv_head
// order), key p's row at k_rows[h] + (p - base) * dp and its values at vt[h][d * ld + p - base]
// (transposed).
struct PackTarget {
  const Unit* units;
  int heads;
  int64_t base, ld;
  uint16_t* const* k_rows;
  uint16_t* const* vt;
};

// Keys [k0, k1) (multiples of 32) of the target's units as bf16; padding (keys >= ctx, dims >=
// head_dim) is +0. A cached position is one row of kv_dim floats with the KV heads side by side
// (4 KiB for GLM-4.5); the heads of a target are read together, so a decode group reads each
// row front to back once, where one head alone reads 512 bytes of each 4 KiB row (a page
// stride the hardware prefetchers do not follow). Values go through [32][dp] staging tiles so
// that the transposes read those, not the cache.
template <int kTarget>
inline __attribute__((always_inline)) void PackKeysBody(const PackTarget& t, int64_t k0, int64_t k1,
                                                        const KvCache& cache, int64_t layer,
                                                        const BlockTable& blocks, int64_t dp) {
  const int64_t bs = cache.shape().block_size, hd = cache.shape().head_dim;
  const int64_t kv_dim = cache.kv_dim(), ctx = t.units[0].ctx;
  const bool bf16_cache = cache.host_bf16();
  const int64_t elem = bf16_cache ? 2 : 4;  // bytes per cached element
  // Only [0, head_dim) of a staged row is ever written: the padding stays +0 while the
  // layout (dp, head_dim) does; a new layout starts from zeros.
  thread_local std::vector<uint16_t> staged;
  thread_local int64_t staged_dp = -1, staged_hd = -1;
  const int64_t tile = kFlashKeys * dp;
  if (staged_dp != dp || staged_hd != hd) {
    staged.assign(t.heads * tile, 0);
    staged_dp = dp;
    staged_hd = hd;
  } else if (static_cast<int64_t>(staged.size()) < t.heads * tile) {
    staged.resize(t.heads * tile, 0);
  }
  for (int64_t b0 = k0; b0 < k1; b0 += kFlashKeys) {
    for (int64_t i = 0; i < kFlashKeys; ++i) {
      const int64_t p = b0 + i;
      if (p >= ctx) {
        for (int h = 0; h < t.heads; ++h) {
          std::fill_n(t.k_rows[h] + (p - t.base) * dp, dp, uint16_t{0});
          std::fill_n(staged.data() + h * tile + i * dp, dp, uint16_t{0});
        }
        continue;
      }
      // Each position's row starts a new page: ask for a later position's slices.
      const int64_t ahead = p + kPrefetchKeys;
      if (ahead < ctx) {
        const int64_t ahead_row = (ahead % bs) * kv_dim;
        const char* ka = RowBytes(cache, layer, blocks[ahead / bs], 0) + ahead_row * elem;
        const char* va = RowBytes(cache, layer, blocks[ahead / bs], 1) + ahead_row * elem;
        for (int h = 0; h < t.heads; ++h) {
          const int64_t off = t.units[h].kv_head * hd * elem;
          for (int64_t d = 0; d < hd * elem; d += 64) {
            __builtin_prefetch(ka + off + d);
            __builtin_prefetch(va + off + d);
          }
        }
      }
      const int64_t row = (p % bs) * kv_dim;
      for (int h = 0; h < t.heads; ++h) {
        const int64_t off = row + t.units[h].kv_head * hd;
        uint16_t* kr = t.k_rows[h] + (p - t.base) * dp;
        uint16_t* vr = staged.data() + h * tile + i * dp;
        if (bf16_cache) {  // the stored bits are FloatToBf16's already
          std::copy_n(cache.bf16_rows(layer, blocks[p / bs], 0) + off, hd, kr);
          std::copy_n(cache.bf16_rows(layer, blocks[p / bs], 1) + off, hd, vr);
        } else {
          const float* key = cache.keys(layer, blocks[p / bs]) + off;
          const float* value = cache.values(layer, blocks[p / bs]) + off;
          for (int64_t d = 0; d < hd; ++d) kr[d] = ToBf16(key[d]);
          for (int64_t d = 0; d < hd; ++d) vr[d] = ToBf16(value[d]);
        }
        std::fill(kr + hd, kr + dp, uint16_t{0});  // the staging tile's padding stays +0
      }
    }
    for (int h = 0; h < t.heads; ++h) {
      const uint16_t* src = staged.data() + h * tile;
      uint16_t* dst = t.vt[h] + (b0 - t.base);
#if defined(__x86_64__)
      if constexpr (kTarget == 1) {
        TransposeValuesAvx512(src, dp, dst, t.ld);
        continue;
      }
#endif
      for (int64_t d = 0; d < dp; ++d) {
        for (int64_t i = 0; i < kFlashKeys; ++i) dst[d * t.ld + i] = src[i * dp + d];
      }
    }
  }
}

#if defined(__x86_64__)
GLM_AVX512_TARGET void PackKeysAvx512(const PackTarget& t, int64_t k0, int64_t k1,
                                      const KvCache& cache, int64_t layer, const BlockTable& blocks,
                                      int64_t dp) {
  PackKeysBody<1>(t, k0, k1, cache, layer, blocks, dp);
}
#endif
void PackKeysGeneric(const PackTarget& t, int64_t k0, int64_t k1, const KvCache& cache,
                     int64_t layer, const BlockTable& blocks, int64_t dp) {
  PackKeysBody<0>(t, k0, k1, cache, layer, blocks, dp);
}
void PackKeys(const PackTarget& t, int64_t k0, int64_t k1, const KvCache& cache, int64_t layer,
              const BlockTable& blocks, int64_t dp) {
#if defined(__x86_64__)
  // Asked each call: the tests' ForceGenericKernels runs the portable packing beside this one.
  if (CpuHasAvx512()) return PackKeysAvx512(t, k0, k1, cache, layer, blocks, dp);
#endif
  PackKeysGeneric(t, k0, k1, cache, layer, blocks, dp);
}

// FlashGroup::pack for a decode group: one key block of every head of the group.
struct GroupPacker {
  PackTarget target;
  const KvCache* cache;
  int64_t layer, dp;
  const BlockTable* blocks;
  static void Pack(const void* context, int64_t key0) {
    const GroupPacker& p = *static_cast<const GroupPacker*>(context);
    PackTarget t = p.target;
    t.base = key0;
    PackKeys(t, key0, key0 + kFlashKeys, *p.cache, p.layer, *p.blocks, p.dp);
  }
};

// Per-thread buffers of the block step; a decode group's per-head ones ([heads] of each).
struct BlockBuffers {
  AlignedVector<float> st, ot_blk, ot, q, m, l;
  AlignedVector<uint16_t> pt, q_tiles, k_block, vt_block;
  void Size(int64_t dp, int64_t head_dim, int64_t heads = 1) {
    st.resize(kFlashRows * kFlashKeys);
    pt.resize(2 * kAmxTileElems);
    ot_blk.resize(dp * kFlashRows);
    ot.resize(heads * dp * kFlashRows);
    m.resize(heads * kFlashRows);
    l.resize(heads * kFlashRows);
    q.resize(kFlashRows * head_dim);
    q_tiles.resize(heads * AmxPackedSize(kFlashRows, head_dim));
    k_block.resize(heads * kFlashKeys * dp);
    vt_block.resize(heads * dp * kFlashKeys);
  }
  FlashScratch Scratch() { return {st.data(), pt.data(), ot_blk.data(), ot.data()}; }
};

// What every row block of a call shares.
struct CallArgs {
  const float* q;
  float* out;
  int64_t heads, group, head_dim, dp;
  float scale;
  // The tile products' machine: the tile unit (CpuHasAmx, CpuHasAvx512), its software model
  // (ForceAmxTileModel), or the portable emulation.
  enum class Tiles { kUnit, kModel, kEmulated } tiles;
};

// The tiles of this thread for a call's work items: configured on the tile unit or the model.
void TilesBegin(const CallArgs& c) {
  if (c.tiles == CallArgs::Tiles::kUnit) AmxThreadBegin();
  if (c.tiles == CallArgs::Tiles::kModel) AmxTileModel::loadconfig(&AmxBf16TileConfig());
}
void TilesEnd(const CallArgs& c) {
  if (c.tiles == CallArgs::Tiles::kUnit) AmxThreadEnd();
  if (c.tiles == CallArgs::Tiles::kModel) AmxTileModel::release();
}

void RunFlashGroup(const CallArgs& c, const FlashGroup& group, const FlashScratch& scratch) {
  switch (c.tiles) {
    case CallArgs::Tiles::kUnit:
      return FlashGroupHardware(group, scratch);
    case CallArgs::Tiles::kModel:
      return FlashGroupTileModel(group, scratch);
    case CallArgs::Tiles::kEmulated:
      return FlashGroupEmulated(group, scratch);
  }
}

// Row block [r0, r0 + 32) of unit u: gathers its query rows and packs them into q_tiles
// (positions into pos, output rows into outs); returns the block, K/V not yet set.
FlashBlock PrepareRowBlock(const CallArgs& c, const Unit& u, int64_t r0, float* q,
                           uint16_t* q_tiles, int32_t* pos, float** outs) {
  const int rows = static_cast<int>(std::min<int64_t>(kFlashRows, u.tokens * c.group - r0));
  for (int r = 0; r < kFlashRows; ++r) {
    pos[r] = -1;
    if (r >= rows) continue;
    const int64_t t = (r0 + r) / c.group, h = u.kv_head * c.group + (r0 + r) % c.group;
    const int64_t at = ((u.first_row + t) * c.heads + h) * c.head_dim;
    pos[r] = static_cast<int32_t>(u.start + t);
    outs[r] = c.out + at;
    std::copy_n(c.q + at, c.head_dim, q + r * c.head_dim);
  }
  for (int64_t tile = 0; tile * 16 < rows; ++tile) {
    PackAmxActivations(q, rows, c.head_dim, tile, q_tiles);
  }
  FlashBlock block;
  block.q_tiles = q_tiles;
  block.ctx_pad = u.ctx_pad;
  block.dp = c.dp;
  block.head_dim = c.head_dim;
  block.rows = rows;
  block.pos = pos;
  block.scale = c.scale;
  block.out = outs;
  return block;
}

// Row blocks [r0, r0 + 32 count) of unit u over its K/V packed in `packed`, stepping through
// the key blocks together: each key block is read into L1 once for all of them instead of once
// per row block (a prompt's K/V outgrow L2 long before its row blocks run out). Each row
// block takes the same steps in the same order as alone: the same bits.
void RunRowBlocks(const CallArgs& c, const Unit& u, int64_t r0, int count, const uint16_t* packed,
                  BlockBuffers* buf) {
  constexpr int kMax = kMaxFlashGroup;
  int32_t pos[kMax][kFlashRows];
  float* outs[kMax][kFlashRows];
  FlashBlock row_blocks[kMax];
  FlashState states[kMax];
  const int64_t q_tile_size = AmxPackedSize(kFlashRows, c.head_dim);
  for (int i = 0; i < count; ++i) {
    row_blocks[i] = PrepareRowBlock(c, u, r0 + i * kFlashRows, buf->q.data(),
                                    buf->q_tiles.data() + i * q_tile_size, pos[i], outs[i]);
    row_blocks[i].k_rows = packed + u.k_offset;
    row_blocks[i].vt = packed + u.v_offset;
    states[i] = {buf->m.data() + i * kFlashRows, buf->l.data() + i * kFlashRows,
                 buf->ot.data() + i * c.dp * kFlashRows};
  }
  FlashGroup group;
  group.count = count;
  group.blocks = row_blocks;
  group.states = states;
  RunFlashGroup(c, group, buf->Scratch());
}

// Units [first, first + heads) of one sequence, one row block each (decodes, short chunks),
// stepping through the key blocks together: each key block is packed for all of them at once,
// from the cache straight into L1/L2, and each cached row is read once.
void RunGroup(const CallArgs& c, const Unit* first, int heads, const KvCache& cache, int64_t layer,
              const BlockTable& blocks, BlockBuffers* buf) {
  constexpr int kMax = kMaxFlashGroup;
  int32_t pos[kMax][kFlashRows];
  float* outs[kMax][kFlashRows];
  FlashBlock row_blocks[kMax];
  FlashState states[kMax];
  uint16_t* k_blocks[kMax];
  uint16_t* vt_blocks[kMax];
  const int64_t q_tile_size = AmxPackedSize(kFlashRows, c.head_dim);
  for (int h = 0; h < heads; ++h) {
    row_blocks[h] = PrepareRowBlock(c, first[h], 0, buf->q.data(),
                                    buf->q_tiles.data() + h * q_tile_size, pos[h], outs[h]);
    states[h] = {buf->m.data() + h * kFlashRows, buf->l.data() + h * kFlashRows,
                 buf->ot.data() + h * c.dp * kFlashRows};
    k_blocks[h] = buf->k_block.data() + h * kFlashKeys * c.dp;
    vt_blocks[h] = buf->vt_block.data() + h * c.dp * kFlashKeys;
  }
  const GroupPacker packer{
      {first, heads, 0, kFlashKeys, k_blocks, vt_blocks}, &cache, layer, c.dp, &blocks};
  FlashGroup group;
  group.count = heads;
  group.blocks = row_blocks;
  group.states = states;
  group.k_blocks = k_blocks;
  group.vt_blocks = vt_blocks;
  group.pack = GroupPacker::Pack;
  group.pack_context = &packer;
  RunFlashGroup(c, group, buf->Scratch());
}

}  // namespace

void FlashGroupEmulated(const FlashGroup& group, const FlashScratch& scratch) {
  FlashGroupRun<EmulatedTiles>(group, scratch);
}

void FlashGroupTileModel(const FlashGroup& group, const FlashScratch& scratch) {
  FlashGroupRun<AmxFlashTiles<AmxTileModel>>(group, scratch);
}

const char* AttentionAmxKernelName() {
  return CpuHasAmx() && CpuHasAvx512() ? "amx_bf16" : "generic_amx_bf16";
}

}  // namespace internal

void PagedAttentionAmx(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                       int64_t layer, int64_t heads, float scale, float* out) {
  using internal::kFlashKeys;
  using internal::kFlashRows;
  using internal::Unit;
  const int64_t head_dim = cache.shape().head_dim, kv_heads = cache.shape().kv_heads;
  const int64_t group = heads / kv_heads;
  const int64_t dp = (head_dim + 31) / 32 * 32;
  using Tiles = internal::CallArgs::Tiles;
  const Tiles tiles = internal::AmxTileModelForced()                      ? Tiles::kModel
                      : internal::CpuHasAmx() && internal::CpuHasAvx512() ? Tiles::kUnit
                                                                          : Tiles::kEmulated;

  std::vector<Unit> units;
  int64_t row = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceSlice& slice = batch[s];
    if (slice.num_tokens > 0) {
      for (int64_t g = 0; g < kv_heads; ++g) {
        Unit u;
        u.seq = static_cast<int64_t>(s);
        u.kv_head = g;
        u.first_row = row;
        u.tokens = slice.num_tokens;
        u.start = slice.start_position;
        u.ctx = slice.start_position + slice.num_tokens;
        u.ctx_pad = (u.ctx + kFlashKeys - 1) / kFlashKeys * kFlashKeys;
        units.push_back(u);
      }
    }
    row += slice.num_tokens;
  }

  const internal::CallArgs args{q, out, heads, group, head_dim, dp, scale, tiles};
  // Units of one row block (decodes, short chunks) pack their K/V a key block at a time inside
  // their own work item: each cached row is read once, straight into L1.
  std::vector<Unit> staged, fused;
  for (const Unit& u : units) (u.row_blocks(group) == 1 ? fused : staged).push_back(u);
  // Units of one row block (decodes, short chunks) go in groups of a sequence's KV heads
  // (RunGroup): as few groups as leave every thread two or more, each of at most
  // kMaxFlashGroup consecutive heads. The grouping changes no bit, only what is read together.
  std::vector<std::pair<size_t, int>> groups;  // (first unit in fused, heads)
  if (!fused.empty()) {
    const int64_t seqs = static_cast<int64_t>(fused.size()) / kv_heads;
    const int64_t want = 2 * NumThreads();
    int64_t per = std::min<int64_t>(internal::kMaxFlashGroup, kv_heads);
    per = std::min<int64_t>(per, std::max<int64_t>(1, kv_heads * seqs / want));
    for (size_t i = 0; i < fused.size();) {
      size_t j = i + 1;
      while (j < fused.size() && fused[j].seq == fused[i].seq &&
             static_cast<int64_t>(j - i) < per) {
        ++j;
      }
      groups.push_back({i, static_cast<int>(j - i)});
      i = j;
    }
  }
  ParallelFor(static_cast<int64_t>(groups.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local internal::BlockBuffers buf;
    internal::TilesBegin(args);
    for (int64_t i = begin; i < end; ++i) {
      const Unit* first = fused.data() + groups[i].first;
      buf.Size(dp, head_dim, groups[i].second);
      internal::RunGroup(args, first, groups[i].second, cache, layer, *batch[first->seq].blocks,
                         &buf);
    }
    internal::TilesEnd(args);
  });

  // The others in rounds whose packed K/V fit the arena (a round takes at least one unit):
  // pack every unit of the round in parallel, then run its row blocks in parallel. The arena is
  // kept from call to call on this thread (one layer's worth of a step, at most ~32 MiB beyond
  // the largest single unit), so steps do not fault it in again.
  static thread_local AlignedVector<uint16_t> arena;
  for (size_t first = 0; first < staged.size();) {
    size_t last = first;
    int64_t total = 0;
    while (last < staged.size()) {
      const int64_t size = 2 * staged[last].ctx_pad * dp;
      if (last > first && (total + size) * 2 > internal::kArenaBytes) break;
      staged[last].k_offset = total;
      staged[last].v_offset = total + size / 2;
      total += size;
      ++last;
    }
    uint16_t* packed = GrowTo(&arena, total);  // the workers must not name this thread_local
    std::vector<int64_t> pack_starts{0}, block_starts{0};
    // A row work item: up to kStagedRowBlocks consecutive row blocks of one unit.
    constexpr int64_t kRun = internal::kStagedRowBlocks;
    for (size_t i = first; i < last; ++i) {
      const int64_t pieces = (staged[i].ctx_pad + internal::kPackKeys - 1) / internal::kPackKeys;
      pack_starts.push_back(pack_starts.back() + pieces);
      block_starts.push_back(block_starts.back() + (staged[i].row_blocks(group) + kRun - 1) / kRun);
    }
    auto unit_of = [](const std::vector<int64_t>& starts, int64_t item) {
      return std::upper_bound(starts.begin(), starts.end(), item) - starts.begin() - 1;
    };
    ParallelFor(pack_starts.back(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t j = unit_of(pack_starts, item);
        const Unit& u = staged[first + j];
        const int64_t k0 = (item - pack_starts[j]) * internal::kPackKeys;
        uint16_t* k_rows = packed + u.k_offset;
        uint16_t* vt = packed + u.v_offset;
        const internal::PackTarget target{&u, 1, 0, u.ctx_pad, &k_rows, &vt};
        internal::PackKeys(target, k0, std::min(u.ctx_pad, k0 + internal::kPackKeys), cache, layer,
                           *batch[u.seq].blocks, dp);
      }
    });
    ParallelFor(block_starts.back(), 1, [&](int64_t begin, int64_t end) {
      thread_local internal::BlockBuffers buf;
      buf.Size(dp, head_dim, kRun);
      internal::TilesBegin(args);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t j = unit_of(block_starts, item);
        const Unit& u = staged[first + j];
        const int64_t b0 = (item - block_starts[j]) * kRun;
        const int count = static_cast<int>(std::min(kRun, u.row_blocks(group) - b0));
        internal::RunRowBlocks(args, u, b0 * kFlashRows, count, packed, &buf);
      }
      internal::TilesEnd(args);
    });
    first = last;
  }
}

}  // namespace glmserve
