#include "core/cpu/ops/attention_amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/bf16_math.h"  // Bf16Pair (internal linkage: this file's copy)
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "tests/core/cpu/ops/amx_test_util.h"
#include "tests/core/cpu/ops/attention_fixture.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

// The shared fixture with PagedAttentionAmx.
struct AttnFixture : testing::AttentionFixture {
  AttnFixture(int64_t h, int64_t kvh, int64_t hd, int64_t bs,
              const std::vector<std::pair<int64_t, int64_t>>& s, uint32_t seed)
      : AttentionFixture(PagedAttentionAmx, h, kvh, hd, bs, s, seed) {}
};

// Head dims off the 32 grid (8, 40) and on it (128); groups of 1, 2, 12 query heads (12: a
// 16-row tile spans two tokens); contexts across key blocks; prefill, decode and a chunk
// after a cached prefix in one ragged batch.
TEST(PagedAttentionAmxTest, MatchesFloat64ReferenceOnBf16Operands) {
  struct Case {
    int64_t heads, kv_heads, head_dim, block_size;
    std::vector<std::pair<int64_t, int64_t>> seqs;
  };
  const Case cases[] = {
      {4, 2, 8, 3, {{0, 5}, {6, 1}, {2, 7}}},
      {24, 2, 128, 16, {{0, 70}, {100, 1}, {33, 40}}},
      {3, 3, 40, 5, {{0, 1}, {31, 2}}},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    AttnFixture s(c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs, seed += 10);
    const std::vector<float> out = s.Run();
    // bf16 probabilities (relative 2^-9 each) and the exp polynomial: measured 6e-4 .. 7.4e-4.
    const double err = testing::RelativeError(out, testing::Bf16OperandsReference(s));
    std::printf("head_dim %lld: relative error %.3g\n", static_cast<long long>(c.head_dim), err);
    EXPECT_LT(err, 2e-3) << "head_dim " << c.head_dim;
  }
}

// The arithmetic is per row: a prompt gives the same bits in one chunk, in chunks, token by
// token, and inside any batch. A token alone (12 rows: one row block) packs its K/V a key block
// at a time inside its work item; longer chunks stage the whole context first: both paths are
// compared here with the whole prompt's.
TEST(PagedAttentionAmxTest, RowsAreBitIdenticalWhateverTheChunkOrBatch) {
  testing::ExpectChunksGiveTheWholePromptsBits(PagedAttentionAmx);
}

// Decode rows (one token: one row block per KV head) run in groups of a sequence's KV heads
// whose key blocks are packed together; how many heads a group takes follows the batch and
// the threads. Every grouping must give the bits of the whole prompt's rows: one sequence
// decoding (small groups), four (a group per sequence), on the tile unit and in the emulation.
TEST(PagedAttentionAmxTest, DecodeGroupsGiveTheWholePromptsBits) {
  const int64_t heads = 16, kv_heads = 8, head_dim = 64, n = 70;
  AttnFixture whole(heads, kv_heads, head_dim, 16, {{0, n}}, 2024);
  const std::vector<float> ref = whole.Run();
  const int64_t width = heads * head_dim;
  for (const bool generic : {false, true}) {
    internal::ForceGenericKernels(generic);
    for (const int64_t decoding : {1, 4}) {
      for (const int64_t t : {int64_t{0}, int64_t{31}, int64_t{32}, n - 1}) {
        std::vector<SequenceSlice> batch;
        std::vector<float> q;
        for (int64_t i = 0; i < decoding; ++i) {
          batch.push_back({1, t, &whole.tables[0]});
          q.insert(q.end(), whole.q.begin() + t * width, whole.q.begin() + (t + 1) * width);
        }
        std::vector<float> out(q.size(), NAN);
        PagedAttentionAmx(q.data(), batch, whole.cache, 0, heads, whole.scale(), out.data());
        for (int64_t i = 0; i < decoding; ++i) {
          EXPECT_EQ(
              0, std::memcmp(out.data() + i * width, ref.data() + t * width, width * sizeof(float)))
              << "generic " << generic << ", " << decoding << " decoding, position " << t
              << ", row " << i;
        }
      }
    }
  }
  internal::ForceGenericKernels(false);
}

// The AMX tile unit and the portable emulation give the same bits.
TEST(PagedAttentionAmxTest, HardwareEqualsEmulationBitForBit) {
  GLM_REQUIRE_AMX(internal::CpuHasAmx(), "AMX-BF16");
  // Decodes of 8 KV heads (grouped, packed a key block at a time) beside a prefill (staged).
  AttnFixture s(64, 8, 128, 16, {{0, 70}, {100, 1}, {33, 1}, {5, 1}, {33, 40}}, 1234);
  const std::vector<float> fast = s.Run();
  internal::ForceGenericKernels(true);
  EXPECT_STREQ(internal::AttentionAmxKernelName(), "generic_amx_bf16");
  const std::vector<float> emulated = s.Run();
  internal::ForceGenericKernels(false);
  EXPECT_STREQ(internal::AttentionAmxKernelName(), "amx_bf16");
  ASSERT_EQ(fast.size(), emulated.size());
  EXPECT_EQ(0, std::memcmp(fast.data(), emulated.data(), fast.size() * sizeof(float)));
}

// The tile unit's own tile code (attention_amx_tiles.h) on the software tile model, on any CPU:
// the emulation's bits for decode groups, staged prefills (several row blocks per item) and
// head dims on and off the 32 grid, and a prompt in chunks the whole prompt's bits.
TEST(PagedAttentionAmxTest, TheTileUnitsCodeOnTheTileModelEqualsTheEmulation) {
  struct Case {
    int64_t heads, kv_heads, head_dim, block_size;
    std::vector<std::pair<int64_t, int64_t>> seqs;
  };
  const Case cases[] = {{64, 8, 128, 16, {{0, 70}, {100, 1}, {33, 1}, {5, 1}, {33, 40}}},
                        {4, 2, 40, 5, {{0, 37}, {20, 1}, {2, 150}}}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    AttnFixture s(c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs, seed += 10);
    internal::ForceAmxTileModel(true);
    const std::vector<float> model = s.Run();
    internal::ForceAmxTileModel(false);
    internal::ForceGenericKernels(true);
    const std::vector<float> emulated = s.Run();
    internal::ForceGenericKernels(false);
    ASSERT_EQ(model.size(), emulated.size());
    EXPECT_EQ(0, std::memcmp(model.data(), emulated.data(), model.size() * sizeof(float)))
        << "head_dim " << c.head_dim;
  }
  internal::ForceAmxTileModel(true);
  testing::ExpectChunksGiveTheWholePromptsBits(PagedAttentionAmx);
  internal::ForceAmxTileModel(false);
}

// A bf16 cache (the bf16_amx mode's default) stores FloatToBf16 of each key and value, what the
// packing rounds them to: the fp32 cache's bits in the tile unit's form (or its emulation) and
// the portable packing, for decode groups, staged prefills, head dims on and off the 32 grid.
TEST(PagedAttentionAmxTest, ABf16CacheGivesTheFp32CachesBits) {
  testing::ExpectTheBf16CacheGivesTheFp32CachesBits(
      PagedAttentionAmx, {{64, 8, 128, 16, {{0, 70}, {100, 1}, {33, 1}, {5, 1}, {33, 40}}},
                          {4, 2, 40, 16, {{0, 37}, {20, 1}}},
                          {2, 1, 8, 4, {{0, 9}, {3, 2}}}});
}

// The probabilities go to the tile unit as bf16 pairs: each half FloatToBf16's bits (nearest
// even, NaN made quiet), for every kind of value, ties and the largest finite included.
TEST(PagedAttentionAmxTest, ProbabilityPairsRoundAsFloatToBf16) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u,
                                0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
                                0x7f7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffbfffffu, 0x7fffffffu, 0xbf808000u, 0xc2ae0000u};
  uint32_t state = 12345;
  for (int i = 0; i < 20000; ++i) {
    state = state * 1664525u + 1013904223u;
    bits.push_back(state);
  }
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t lo_bits = bits[i], hi_bits = bits[(i * 7 + 3) % bits.size()];
    float lo, hi;
    std::memcpy(&lo, &lo_bits, sizeof lo);
    std::memcpy(&hi, &hi_bits, sizeof hi);
    const uint32_t want = uint32_t{FloatToBf16(lo)} | (uint32_t{FloatToBf16(hi)} << 16);
    ASSERT_EQ(internal::Bf16Pair(lo, hi), want) << std::hex << lo_bits << " " << hi_bits;
  }
}

}  // namespace
}  // namespace glmserve
