#include "core/cpu/ops/attention_bf16.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/attention.h"
#include "core/cpu/ops/attention_items.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"
#include "tests/core/cpu/ops/attention_fixture.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

// The shared fixture with PagedAttentionBf16.
struct Fixture : testing::AttentionFixture {
  Fixture(int64_t h, int64_t kvh, int64_t hd, int64_t bs,
          const std::vector<std::pair<int64_t, int64_t>>& s, uint32_t seed)
      : AttentionFixture(PagedAttentionBf16, h, kvh, hd, bs, s, seed) {}
};

// One lane of vdpbf16ps as its definition reads (written here again, not taken from the code
// under test): acc + hi * hi, then + lo * lo, each rounded once, bf16 subnormals as zero,
// subnormal results flushed.
float Lane(float acc, uint16_t a_lo, uint16_t a_hi, uint16_t b_lo, uint16_t b_hi) {
  auto in = [](uint16_t v) {
    const float f = Bf16ToFloat(v);
    return std::fabs(f) < FLT_MIN ? std::copysign(0.0f, f) : f;
  };
  auto flush = [](float f) { return std::fabs(f) < FLT_MIN ? std::copysign(0.0f, f) : f; };
  acc = flush(std::fma(in(a_hi), in(b_hi), acc));
  return flush(std::fma(in(a_lo), in(b_lo), acc));
}

// The arithmetic of attention_bf16.h, one row at a time over its whole context.
std::vector<float> Definition(const Fixture& s) {
  const int64_t hd = s.head_dim, kv_dim = s.kv_heads * hd, group = s.heads / s.kv_heads;
  auto b = [](const float* x, int64_t i, int64_t n) { return i < n ? FloatToBf16(x[i]) : 0; };
  std::vector<float> out(s.q.size());
  int64_t row = 0;
  for (size_t i = 0; i < s.batch.size(); ++i) {
    for (int64_t t = 0; t < s.batch[i].num_tokens; ++t, ++row) {
      const int64_t pos = s.batch[i].start_position + t;
      for (int64_t h = 0; h < s.heads; ++h) {
        const float* qv = s.q.data() + (row * s.heads + h) * hd;
        const int64_t off = (h / group) * hd;
        std::vector<float> probs(pos + 1);
        for (int64_t p = 0; p <= pos; ++p) {
          const float* k = s.keys[i].data() + p * kv_dim + off;
          float acc = 0.0f;
          for (int64_t d = 0; d < hd; d += 2) {
            acc = Lane(acc, b(qv, d, hd), b(qv, d + 1, hd), b(k, d, hd), b(k, d + 1, hd));
          }
          probs[p] = acc * s.scale();
        }
        const float sum = SoftmaxExpInPlace(probs.data(), pos + 1);
        float* o = out.data() + (row * s.heads + h) * hd;
        for (int64_t d = 0; d < hd; ++d) {
          float acc = 0.0f;
          for (int64_t p = 0; p <= pos; p += 2) {
            const float* v = s.values[i].data() + off + d;
            const uint16_t v_hi = p + 1 <= pos ? FloatToBf16(v[(p + 1) * kv_dim]) : 0;
            acc = Lane(acc, b(probs.data(), p, pos + 1), b(probs.data(), p + 1, pos + 1),
                       FloatToBf16(v[p * kv_dim]), v_hi);
          }
          o[d] = acc / sum;
        }
      }
    }
  }
  return out;
}

// The forms this machine can run (testing::KernelForms): the portable one, AVX2 where the CPU has
// it, AVX512_BF16 where it has that.
using testing::KernelForm;
using testing::KernelForms;

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached tokens, new tokens)
};

// Head dims odd (13: padded pairs), off the packers' grids (24, 40, 48: portable key packing,
// 48 AVX-512 value packing), on them (64, 128), past one 128-wide chunk of the weighted sum
// (136, 160); groups of 1, 3 and 12 query heads (runs of up to 12 rows); contexts across
// position blocks with odd and even ends; prefill, decode and a chunk after a cached prefix in
// one ragged batch.
const Case kCases[] = {
    {4, 2, 13, 3, {{0, 5}, {6, 1}, {2, 7}}},
    {24, 2, 128, 16, {{0, 70}, {100, 1}, {33, 40}, {0, 1}}},
    {3, 3, 40, 5, {{0, 1}, {31, 2}}},
    {6, 2, 24, 4, {{0, 66}, {63, 2}}},
    {12, 4, 48, 16, {{0, 65}, {128, 3}}},
    {12, 1, 64, 8, {{0, 129}}},
    {6, 2, 136, 16, {{0, 37}, {64, 1}}},
    {3, 1, 160, 16, {{17, 50}}},
    {8, 2, 32, 16, {{0, 5}, {0, 11}}},
    {2, 1, 32, 16, {{0, 5}, {0, 11}}},
    {8, 2, 32, 16, {{5, 1}, {11, 1}}},
};

// Every form gives the definition's bits, row by row, whatever the items, runs and blocks.
TEST(PagedAttentionBf16Test, EveryFormGivesTheDefinitionsBits) {
  uint32_t seed = 40;
  for (const KernelForm& form : KernelForms()) {
    form.Use();
    if (std::string(form.name) == "avx2") {  // what a CPU without AVX-512 dispatches to
      EXPECT_STREQ(internal::AttentionBf16KernelName(), "avx2_bf16");
    }
    for (const Case& c : kCases) {
      const Fixture s(c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs, seed += 10);
      const std::vector<float> out = s.Run(), want = Definition(s);
      ASSERT_EQ(out.size(), want.size());
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(std::memcmp(&out[i], &want[i], sizeof(float)), 0)
            << internal::AttentionBf16KernelName() << ", head_dim " << c.head_dim << ", element "
            << i << ": " << out[i] << " against " << want[i];
      }
    }
  }
  KernelForm::Reset();
}

// vdpbf16ps reads bf16 subnormal operands as zero and flushes subnormal results: keys, values and
// queries with bf16 subnormals (of both signs) and with 1e-20 entries whose products and sums
// underflow, in every form against the definition, bit for bit (the AVX2 form writes both rules
// out as masks).
TEST(PagedAttentionBf16Test, SubnormalsAreReadAsZeroAndFlushedInEveryForm) {
  for (const KernelForm& form : KernelForms()) {
    form.Use();
    for (const int64_t head_dim : {32, 13}) {
      Fixture s(4, 2, head_dim, 16, {{0, 37}, {5, 2}}, 555);
      auto sprinkle = [](std::vector<float>& x, int64_t salt) {
        for (size_t i = 0; i < x.size(); ++i) {
          switch ((i + salt) % 7) {
            case 0:
              x[i] = 3e-39f;
              break;
            case 1:
              x[i] = -2e-39f;
              break;
            case 2:
              x[i] = 1e-20f;
              break;
            case 3:
              x[i] = -1e-20f;
              break;
            default:
              break;
          }
        }
      };
      for (size_t i = 0; i < s.keys.size(); ++i) {
        sprinkle(s.keys[i], 1);
        sprinkle(s.values[i], 2);
      }
      sprinkle(s.q, 3);
      s.Write();
      const std::vector<float> out = s.Run(), want = Definition(s);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(std::memcmp(&out[i], &want[i], sizeof(float)), 0)
            << form.name << ", head_dim " << head_dim << ", element " << i << ": " << out[i]
            << " against " << want[i];
      }
    }
  }
  KernelForm::Reset();
}

// The AVX2 form drops its masks only where no partial sum can fall below FLT_MIN (exponents of
// each product's operands summing to at least 142). Here they do not: exps of 1 against values
// 2^-120 and -(2^-120 - 2^-127) cancel to 2^-127 in the second step of one lane, which vdpbf16ps
// flushes to zero; a threshold set too low would keep it. Every form, the definition's bits.
TEST(PagedAttentionBf16Test, ATinyPartialSumIsFlushedEvenAmongNormalOperands) {
  for (const KernelForm& form : KernelForms()) {
    form.Use();
    Fixture s(1, 1, 16, 16, {{0, 2}}, 77);
    std::fill(s.q.begin(), s.q.end(), 0.0f);  // equal scores: both exps are 1
    s.values[0][0] = 0x1p-120f;
    s.values[0][16] = -(0x1p-120f - 0x1p-127f);
    s.Write();
    const std::vector<float> out = s.Run(), want = Definition(s);
    EXPECT_EQ(want[16], 0.0f);  // the row at position 1, dim 0: flushed
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(std::memcmp(&out[i], &want[i], sizeof(float)), 0)
          << form.name << ", element " << i << ": " << out[i] << " against " << want[i];
    }
  }
  KernelForm::Reset();
}

// A bf16 cache (--kv_cache_dtype=bf16, the bf16 modes' default) stores FloatToBf16 of each key
// and value, the operands this attention rounds them to: every case gives the fp32 cache's bits,
// in every form (the AVX-512 packers load its pairs and widen its values instead of rounding;
// items of one run of rows, a decode step's, read its value rows unpacked).
TEST(PagedAttentionBf16Test, ABf16CacheGivesTheFp32CachesBits) {
  std::vector<testing::CacheCase> cases;
  for (const Case& c : kCases) {
    cases.push_back({c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs});
  }
  testing::ExpectTheBf16CacheGivesTheFp32CachesBits(PagedAttentionBf16, cases);
}

// What the arithmetic promises against exact attention on the same bf16 operands: fp32
// accumulation, the exp polynomial and the probabilities' bf16 rounding (2^-9 relative each).
TEST(PagedAttentionBf16Test, MatchesFloat64ReferenceOnBf16Operands) {
  uint32_t seed = 500;
  for (const Case& c : kCases) {
    const Fixture s(c.heads, c.kv_heads, c.head_dim, c.block_size, c.seqs, seed += 10);
    const double err = testing::RelativeError(s.Run(), testing::Bf16OperandsReference(s));
    std::printf("head_dim %lld: relative error %.3g\n", static_cast<long long>(c.head_dim), err);
    // Measured 0.5e-3 .. 0.8e-3 (1.0e-3 .. 1.7e-3 with the probabilities normalized before
    // their rounding).
    EXPECT_LT(err, 2e-3) << "head_dim " << c.head_dim;
    EXPECT_GT(err, 0.0) << "nothing was rounded";
  }
}

// The arithmetic is per row: a prompt gives the same bits in one chunk, in chunks, token by
// token, and inside any batch.
TEST(PagedAttentionBf16Test, RowsAreBitIdenticalWhateverTheChunkOrBatch) {
  testing::ExpectChunksGiveTheWholePromptsBits(PagedAttentionBf16);
}

// A row at an even position reads its last pair's second position as probability +0 and value
// +0. There the cache holds the next token's row, which a later row of the same work item reads
// (here inf or NaN at position 41, whose own row and those after it are not checked): it must
// not reach the rows before it, in any form, from either cache (AVX-512 reads a bf16 cache's
// value rows where they lie: the row after the last pair's first must not be loaded into it).
TEST(PagedAttentionBf16Test, ThePositionAfterARowsOwnNeverReachesIt) {
  constexpr int64_t kHeads = 12, kHeadDim = 64, kPoisoned = 41;
  for (const KernelForm& form : KernelForms()) {
    form.Use();
    for (const float poison : {std::numeric_limits<float>::infinity(), NAN}) {
      Fixture s(kHeads, 1, kHeadDim, 16, {{0, 70}}, 321);
      std::fill_n(s.keys[0].begin() + kPoisoned * kHeadDim, kHeadDim, poison);
      std::fill_n(s.values[0].begin() + kPoisoned * kHeadDim, kHeadDim, poison);
      s.Write();
      for (const bool bf16_cache : {false, true}) {
        const std::vector<float> out = bf16_cache ? s.RunOn(s.Bf16Cache()) : s.Run();
        for (int64_t i = 0; i < kPoisoned * kHeads * kHeadDim; ++i) {
          ASSERT_TRUE(std::isfinite(out[i]))
              << internal::AttentionBf16KernelName() << ", poison " << poison << ", bf16 cache "
              << bf16_cache << ", element " << i;
        }
        EXPECT_FALSE(std::isfinite(out[kPoisoned * kHeads * kHeadDim]))
            << "the poison was not read";
      }
    }
  }
  KernelForm::Reset();
}

// Bits a rounding can trip on: signed zeros, subnormals (one rounding up to the smallest
// normal), ties to even and odd, the largest finite (rounding to inf), infinities, NaNs.
std::vector<float> AwkwardFloats(int64_t n, uint32_t seed) {
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x807fffffu,
                              0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu,
                              0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu};
  std::vector<float> x = testing::RandomVector(n, seed, 4.0f);
  for (int64_t i = 0; i < n; i += 3) {
    const uint32_t bits = special[(i / 3) % (sizeof special / sizeof special[0])];
    std::memcpy(&x[i], &bits, sizeof bits);
  }
  return x;
}

// A packer pair against the portable code, bit for bit, on awkward values (AwkwardFloats) in an
// fp32 or a bf16 cache: head dims on and off the 16 and 32 grids, blocks of 1 .. 64 positions
// starting at block boundaries and inside them.
using PackFn = void (*)(const internal::AttentionRows&, uint32_t*);
void ExpectPackingEqualsPortable(PackFn pack_keys, PackFn pack_values, bool bf16_cache = false) {
  for (const int64_t head_dim : {32, 48, 64, 128}) {
    const int64_t kv_heads = 2, tokens = 150, kv_dim = kv_heads * head_dim;
    KvCacheShape shape{1, kv_heads, head_dim, 16, 16};
    shape.bf16 = bf16_cache;
    KvCache cache(shape);
    BlockTable table;
    ASSERT_TRUE(cache.Reserve(&table, tokens).ok());
    const std::vector<float> k = AwkwardFloats(tokens * kv_dim, 8);
    const std::vector<float> v = AwkwardFloats(tokens * kv_dim, 9);
    const SequenceSlice all{tokens, 0, &table};
    WriteKv(k.data(), v.data(), {all}, 0, &cache);
    const int64_t key_pairs = (head_dim + 1) / 2, width = (head_dim + 15) / 16 * 16;
    for (const auto [p0, p1] :
         {std::pair<int64_t, int64_t>{0, 64}, {64, 65}, {64, 79}, {128, 150}, {64, 127}}) {
      const internal::AttentionRows rows{.cache = &cache,
                                         .blocks = &table,
                                         .layer = 0,
                                         .kv_off = head_dim,  // the second KV head
                                         .kv_dim = kv_dim,
                                         .block_size = 16,
                                         .head_dim = head_dim,
                                         .context = p1,
                                         .begin = p0};
      std::vector<uint32_t> fast(key_pairs * internal::kPositionBlock, 0u), portable = fast;
      pack_keys(rows, fast.data());
      internal::PackKeysBf16Generic(rows, portable.data());
      for (int64_t i = 0; i < key_pairs; ++i) {
        for (int64_t j = 0; j < p1 - p0; ++j) {
          const int64_t at = i * internal::kPositionBlock + j;
          ASSERT_EQ(fast[at], portable[at])
              << "keys, head_dim " << head_dim << ", pair " << i << ", position " << p0 + j;
        }
      }
      std::vector<uint32_t> vfast(internal::kPositionBlock / 2 * width, 0x12345678u);
      std::vector<uint32_t> vportable = vfast;
      pack_values(rows, vfast.data());
      internal::PackValuesBf16Generic(rows, vportable.data());
      const int64_t used = (p1 - p0 + 1) / 2 * width;
      ASSERT_TRUE(std::equal(vfast.begin(), vfast.begin() + used, vportable.begin()))
          << "values, head_dim " << head_dim << ", block " << p0 << ".." << p1;
    }
  }
}

// The AVX2 loops' exponent scan against its definition: the smallest biased exponent among the
// nonzero halves (sign ignored), 0 where one is subnormal, 255 where all are zero; every length
// (the 8-dword body and its tail).
TEST(PagedAttentionBf16Test, MinExponentOfPairsIsTheSmallestNonzeroHalfsExponent) {
  if (!internal::CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
  const std::vector<float> x = AwkwardFloats(64, 11);
  std::vector<uint32_t> pairs(32);
  internal::RoundPairsGeneric(x.data(), 64, pairs.data());
  for (uint32_t& p : pairs) p &= (p % 3 == 0) ? 0xffff0000u : 0xffffffffu;  // some zero halves
  pairs[5] = 0x80000000u;                                                   // -0 and +0
  for (int64_t n = 0; n <= 32; ++n) {
    int want = 255;
    for (int64_t i = 0; i < n; ++i) {
      for (const uint32_t half : {pairs[i] >> 16, pairs[i] & 0xffffu}) {
        if ((half & 0x7fffu) != 0) want = std::min(want, static_cast<int>((half >> 7) & 0xffu));
      }
    }
    EXPECT_EQ(internal::MinExponentOfPairs(pairs.data(), n), want) << "n " << n;
  }
  const std::vector<uint32_t> zeros(9, 0u), subnormal = {0x3f800001u, 0x00058000u};
  EXPECT_EQ(internal::MinExponentOfPairs(zeros.data(), 9), 255);
  EXPECT_EQ(internal::MinExponentOfPairs(subnormal.data(), 2), 0);
}

TEST(PagedAttentionBf16Test, Avx512PackingEqualsPortable) {
  if (!internal::CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  ExpectPackingEqualsPortable(internal::PackKeysBf16Avx512, internal::PackValuesBf16Avx512);
  ExpectPackingEqualsPortable(internal::PackKeysBf16Avx512, internal::PackValuesBf16Avx512,
                              /*bf16_cache=*/true);
}

TEST(PagedAttentionBf16Test, Avx2PackingEqualsPortable) {
  if (!internal::CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectPackingEqualsPortable(internal::PackKeysBf16Avx2, internal::PackValuesBf16Avx2);
  ExpectPackingEqualsPortable(internal::PackKeysBf16Avx2, internal::PackValuesBf16Avx2,
                              /*bf16_cache=*/true);
}

// The AVX-512 rounding of pair runs against the portable code: every length up to past two
// registers, and the dword after the pairs untouched.
TEST(PagedAttentionBf16Test, Avx512RoundPairsEqualPortable) {
  if (!internal::CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  const std::vector<float> x = AwkwardFloats(80, 7);
  for (int64_t n = 1; n <= 80; ++n) {
    std::vector<uint32_t> fast((n + 1) / 2 + 1, 0xdeadbeefu), portable = fast;
    internal::RoundPairsAvx512(x.data(), n, fast.data());
    internal::RoundPairsGeneric(x.data(), n, portable.data());
    ASSERT_EQ(fast, portable) << "n " << n;
  }
}

}  // namespace
}  // namespace glmserve
