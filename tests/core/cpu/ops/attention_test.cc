#include "core/cpu/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/base/dtype.h"
#include "core/cpu/ops/attention_simd.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (cached tokens, new tokens)
};

TEST(PagedAttentionTest, MatchesFloat64ReferenceOverRaggedBatch) {
  const Case cases[] = {
      {4, 2, 8, {3}, {{0, 5}, {6, 1}, {2, 7}}},  // prefill, decode, chunk after a prefix
      {3, 1, 16, {4}, {{0, 1}}},                 // one token, a single KV head
      {6, 6, 4, {1}, {{5, 3}, {0, 9}}},          // block size 1, MHA
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const int64_t kv_dim = c.kv_heads * c.head_dim;
    KvCacheShape shape{1, c.kv_heads, c.head_dim, c.block_size, 64};
    KvCache cache(shape);
    // Every sequence's full K/V history (cached + new), generated up front.
    std::vector<BlockTable> tables(c.seqs.size());
    std::vector<std::vector<float>> keys, values;
    std::vector<SequenceSlice> batch;
    std::vector<float> new_k, new_v;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const auto [cached, fresh] = c.seqs[s];
      // Take a spare block first so that tables are not contiguous.
      BlockTable spare;
      ASSERT_TRUE(cache.Reserve(&spare, 1).ok());
      ASSERT_TRUE(cache.Reserve(&tables[s], cached + fresh).ok());
      keys.push_back(testing::RandomVector((cached + fresh) * kv_dim, seed++));
      values.push_back(testing::RandomVector((cached + fresh) * kv_dim, seed++));
      // The cached part is written as an earlier step would have.
      SequenceSlice old{cached, 0, &tables[s]};
      if (cached > 0) WriteKv(keys[s].data(), values[s].data(), {old}, 0, &cache);
      batch.push_back({fresh, cached, &tables[s]});
      new_k.insert(new_k.end(), keys[s].begin() + cached * kv_dim, keys[s].end());
      new_v.insert(new_v.end(), values[s].begin() + cached * kv_dim, values[s].end());
    }
    WriteKv(new_k.data(), new_v.data(), batch, 0, &cache);
    int64_t total = 0;
    for (auto& s : batch) total += s.num_tokens;
    std::vector<float> q = testing::RandomVector(total * c.heads * c.head_dim, seed++);
    std::vector<float> out(q.size(), NAN);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    PagedAttention(q.data(), batch, cache, 0, c.heads, scale, out.data());

    std::vector<float> ref(q.size());
    int64_t row = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      for (int64_t t = 0; t < batch[s].num_tokens; ++t, ++row) {
        const int64_t pos = batch[s].start_position + t;
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t g = h / (c.heads / c.kv_heads);
          const float* qv = q.data() + (row * c.heads + h) * c.head_dim;
          std::vector<double> w(pos + 1);
          double mx = -INFINITY, sum = 0;
          for (int64_t p = 0; p <= pos; ++p) {
            double d = 0;
            for (int64_t i = 0; i < c.head_dim; ++i)
              d += double(qv[i]) * keys[s][p * kv_dim + g * c.head_dim + i];
            w[p] = d * scale;
            mx = std::max(mx, w[p]);
          }
          for (double& x : w) sum += (x = std::exp(x - mx));
          for (int64_t i = 0; i < c.head_dim; ++i) {
            double o = 0;
            for (int64_t p = 0; p <= pos; ++p)
              o += w[p] / sum * values[s][p * kv_dim + g * c.head_dim + i];
            ref[(row * c.heads + h) * c.head_dim + i] = static_cast<float>(o);
          }
        }
      }
    }
    EXPECT_LT(testing::RelativeError(out, ref), 1e-6) << "heads " << c.heads;
  }
}

// One sequence of `tokens` random keys and values (seeded from *seed, which advances) in a
// one-layer cache of 8-position blocks: what the loop-level tests below read.
struct FilledCache {
  FilledCache(int64_t kv_heads, int64_t head_dim, int64_t tokens, int64_t blocks, uint32_t* seed)
      : cache(KvCacheShape{1, kv_heads, head_dim, 8, blocks}),
        k(testing::RandomVector(tokens * kv_heads * head_dim, (*seed)++)),
        v(testing::RandomVector(tokens * kv_heads * head_dim, (*seed)++)) {
    EXPECT_TRUE(cache.Reserve(&table, tokens).ok());
    batch = {{tokens, 0, &table}};
    WriteKv(k.data(), v.data(), batch, 0, &cache);
  }
  KvCache cache;
  BlockTable table;
  std::vector<float> k, v;  // [tokens, kv_heads * head_dim]
  std::vector<SequenceSlice> batch;
};

// The fp32 path's AVX-512 loops (attention_avx512.cc) against the portable ones, bit for bit:
// head dims with an 8-lane tail (7, 13), a masked last 16-wide register (24, 136), more than
// one 128-wide register chunk (136, 260); contexts across blocks; grouped heads.
TEST(PagedAttentionTest, Avx512EqualsPortableBitForBit) {
  if (!internal::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  uint32_t seed = 300;
  for (const int64_t head_dim : {7, 13, 24, 128, 136, 260}) {
    const int64_t heads = 4, kv_heads = 2, tokens = 37;
    const FilledCache filled(kv_heads, head_dim, tokens, 16, &seed);
    const KvCache& cache = filled.cache;
    const std::vector<SequenceSlice>& batch = filled.batch;
    const std::vector<float> q = testing::RandomVector(tokens * heads * head_dim, seed++, 3.f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> fast(q.size(), NAN), portable(q.size(), NAN);
    PagedAttention(q.data(), batch, cache, 0, heads, scale, fast.data());
    internal::ForceGenericKernels(true);
    PagedAttention(q.data(), batch, cache, 0, heads, scale, portable.data());
    internal::ForceGenericKernels(false);
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_EQ(fast[i], portable[i]) << "head_dim " << head_dim << " element " << i;
    }
  }
}

// Each SIMD form of the two inner loops, called directly (so a machine with AVX-512 checks its
// AVX2 form too), against the portable one: the same head dims as above, a context across
// blocks, both KV heads of a row.
TEST(PagedAttentionTest, EverySimdFormEqualsPortableBitForBit) {
  using Scores = void (*)(const internal::AttentionRows&, const float*, float, float*);
  using Sum = void (*)(const internal::AttentionRows&, const float*, float*);
  std::vector<std::pair<Scores, Sum>> forms;
  if (internal::CpuHasAvx2Fma()) {
    forms.push_back({internal::AttentionScoresAvx2, internal::AttentionWeightedSumAvx2});
  }
  if (internal::CpuHasAvx512()) {
    forms.push_back({internal::AttentionScoresAvx512, internal::AttentionWeightedSumAvx512});
  }
  if (forms.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512 on this CPU";
  uint32_t seed = 400;
  for (const int64_t head_dim : {7, 13, 24, 64, 128, 136, 260}) {
    const int64_t kv_heads = 2, kv_dim = kv_heads * head_dim, context = 29;
    const FilledCache filled(kv_heads, head_dim, context, 8, &seed);
    const KvCache& cache = filled.cache;
    const BlockTable& table = filled.table;
    const std::vector<float> q = testing::RandomVector(head_dim, seed++, 3.f);
    const std::vector<float> probs = testing::RandomVector(context, seed++);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const internal::AttentionRows rows{&cache, &table, 0,        h * head_dim,
                                         kv_dim, 8,      head_dim, context};
      std::vector<float> scores(context), sum(head_dim);
      internal::AttentionScoresGeneric(rows, q.data(), 0.125f, scores.data());
      internal::AttentionWeightedSumGeneric(rows, probs.data(), sum.data());
      for (const auto& [scores_fn, sum_fn] : forms) {
        // Whole, and in the ranges PagedAttention's position blocks take: the same bits.
        for (const std::vector<int64_t>& cuts :
             {std::vector<int64_t>{0, context}, std::vector<int64_t>{0, 5, 8, 21, context}}) {
          std::vector<float> s2(context, NAN), o2(head_dim, 0.0f);
          for (size_t c = 0; c + 1 < cuts.size(); ++c) {
            internal::AttentionRows part = rows;
            part.begin = cuts[c];
            part.context = cuts[c + 1];
            scores_fn(part, q.data(), 0.125f, s2.data());
            sum_fn(part, probs.data(), o2.data());
          }
          for (int64_t p = 0; p < context; ++p) {
            ASSERT_EQ(s2[p], scores[p]) << "head_dim " << head_dim << " score " << p;
          }
          for (int64_t d = 0; d < head_dim; ++d) {
            ASSERT_EQ(o2[d], sum[d]) << "head_dim " << head_dim << " element " << d;
          }
        }
      }
    }
  }
}

// The AVX-512 multi-row loops (rows that read the same positions: PagedAttention's runs in a
// position block) against the portable single-row loops, bit for bit: 1 to 7 rows (whole groups
// of two and three, and ragged ones), head dims with an 8-lane tail (13, not a multiple of 8: the
// row-by-row fallback), a masked last register (24, 136), two 128-wide chunks (260); packed
// parts of 5, 3, 13 and 8 positions (ragged against the 8-position step), and the rows read in
// place (a decode item's way), whose runs end at the cache's 8-position blocks too.
TEST(PagedAttentionTest, Avx512RowsFormsEqualPortableBitForBit) {
  if (!internal::CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  uint32_t seed = 500;
  for (const int64_t head_dim : {13, 24, 64, 128, 136, 260}) {
    const int64_t kv_heads = 2, kv_dim = kv_heads * head_dim, context = 29, n_rows = 7;
    const FilledCache filled(kv_heads, head_dim, context, 8, &seed);
    const KvCache& cache = filled.cache;
    const BlockTable& table = filled.table;
    const std::vector<float>&k = filled.k, &v = filled.v;
    const std::vector<float> q = testing::RandomVector(n_rows * head_dim, seed++, 3.f);
    const std::vector<float> probs = testing::RandomVector(n_rows * context, seed++);
    const int64_t h = 1;  // the second KV head: a nonzero offset in the cache row
    const internal::AttentionRows rows{&cache, &table, 0,        h * head_dim,
                                       kv_dim, 8,      head_dim, context};
    // The reference: each row alone over the whole context.
    std::vector<float> scores(n_rows * context), sums(n_rows * head_dim, 0.0f);
    for (int64_t r = 0; r < n_rows; ++r) {
      internal::AttentionScoresGeneric(rows, q.data() + r * head_dim, 0.125f,
                                       scores.data() + r * context);
      internal::AttentionWeightedSumGeneric(rows, probs.data() + r * context,
                                            sums.data() + r * head_dim);
    }
    for (const bool packed : {true, false}) {
      const char* form_name = packed ? " packed" : " in place";
      for (int64_t n = 1; n <= n_rows; ++n) {
        std::vector<float> s2(n * context, NAN), o2(n * head_dim, 0.0f);
        std::vector<const float*> qs(n), ps(n);
        std::vector<float*> ss(n), os(n);
        for (int64_t r = 0; r < n; ++r) {
          qs[r] = q.data() + r * head_dim;
          ps[r] = probs.data() + r * context;
          ss[r] = s2.data() + r * context;
          os[r] = o2.data() + r * head_dim;
        }
        const std::vector<int64_t> cuts = {0, 5, 8, 21, context};
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          internal::AttentionRows part = rows;
          part.begin = cuts[c];
          part.context = cuts[c + 1];
          std::vector<float> keys, values;  // the part's rows of head h, contiguous
          if (packed) {
            for (int64_t p = cuts[c]; p < cuts[c + 1]; ++p) {
              keys.insert(keys.end(), k.begin() + p * kv_dim + h * head_dim,
                          k.begin() + p * kv_dim + (h + 1) * head_dim);
              values.insert(values.end(), v.begin() + p * kv_dim + h * head_dim,
                            v.begin() + p * kv_dim + (h + 1) * head_dim);
            }
            part.packed_begin = cuts[c];
            part.kv_dim = head_dim;
            part.packed = keys.data();
          }
          internal::AttentionScoresRowsAvx512(part, n, qs.data(), 0.125f, ss.data());
          if (packed) part.packed = values.data();
          internal::AttentionWeightedSumRowsAvx512(part, n, ps.data(), os.data());
        }
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t p = 0; p < context; ++p) {
            ASSERT_EQ(s2[r * context + p], scores[r * context + p])
                << "head_dim " << head_dim << " rows " << n << " row " << r << " score " << p
                << form_name;
          }
          for (int64_t d = 0; d < head_dim; ++d) {
            ASSERT_EQ(o2[r * head_dim + d], sums[r * head_dim + d])
                << "head_dim " << head_dim << " rows " << n << " row " << r << " element " << d
                << form_name;
          }
        }
      }
    }
  }
}

// PagedAttention's fp32 path works in items (a block of tokens x some heads of one KV head,
// positions in blocks of 64, packed when an item has several rows) and splits a KV head's group of
// query heads when the batch is small. Each row must still get the bits it gets alone: scores,
// softmax and weighted sum of that row by the portable loops over its whole context. A ragged batch
// (a 300-token prefill, a decode row at position 260, a 20-token chunk after 150 cached positions),
// then the decode row alone (few items: the group is split).
TEST(PagedAttentionTest, BlockedItemsGiveEachRowItsLoneBits) {
  const int64_t heads = 12, kv_heads = 2, head_dim = 64, kv_dim = kv_heads * head_dim;
  const int64_t group = heads / kv_heads;
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{0, 300}, {260, 1}, {150, 20}};
  KvCache cache(KvCacheShape{1, kv_heads, head_dim, 16, 64});
  std::vector<BlockTable> tables(seqs.size());
  std::vector<SequenceSlice> batch;
  uint32_t seed = 700;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto [cached, fresh] = seqs[i];
    ASSERT_TRUE(cache.Reserve(&tables[i], cached + fresh).ok());
    const std::vector<float> k = testing::RandomVector((cached + fresh) * kv_dim, seed++);
    const std::vector<float> v = testing::RandomVector((cached + fresh) * kv_dim, seed++);
    const std::vector<SequenceSlice> all = {{cached + fresh, 0, &tables[i]}};
    WriteKv(k.data(), v.data(), all, 0, &cache);
    batch.push_back({fresh, cached, &tables[i]});
  }
  const int64_t rows = 321;
  const std::vector<float> q = testing::RandomVector(rows * heads * head_dim, seed++, 3.f);
  const float scale = 0.125f;
  // The reference: one row at a time, its whole context in one call of each portable loop.
  std::vector<float> ref(q.size());
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t t = 0; t < batch[i].num_tokens; ++t, ++row) {
      for (int64_t h = 0; h < heads; ++h) {
        const internal::AttentionRows r{
            &cache, &tables[i], 0,        (h / group) * head_dim,
            kv_dim, 16,         head_dim, batch[i].start_position + t + 1};
        std::vector<float> probs(r.context);
        const int64_t at = (row * heads + h) * head_dim;
        internal::AttentionScoresGeneric(r, q.data() + at, scale, probs.data());
        SoftmaxInPlace(probs.data(), r.context);
        std::fill_n(ref.data() + at, head_dim, 0.0f);
        internal::AttentionWeightedSumGeneric(r, probs.data(), ref.data() + at);
      }
    }
  }
  std::vector<float> out(q.size(), NAN);
  PagedAttention(q.data(), batch, cache, 0, heads, scale, out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], ref[i]) << "element " << i;
  // The decode row alone: 2 KV heads, fewer items than threads want, so groups are split.
  const int64_t decode_at = 300 * heads * head_dim;
  std::vector<float> alone(heads * head_dim, NAN);
  PagedAttention(q.data() + decode_at, {batch[1]}, cache, 0, heads, scale, alone.data());
  for (int64_t i = 0; i < heads * head_dim; ++i) {
    ASSERT_EQ(alone[i], ref[decode_at + i]) << "decode element " << i;
  }
}

// WriteKv into a bf16 cache stores FloatToBf16 of each key and value (nearest even, NaN kept
// NaN and quiet): ties both ways, subnormals, infinities, the largest finite (which rounds to
// inf), NaNs with a payload only in the low half, at their slots of a block past the first.
TEST(WriteKvTest, ABf16CacheStoresEachValueRoundedToNearestEven) {
  KvCacheShape shape{2, 2, 4, 4, 3};
  shape.bf16 = true;
  KvCache cache(shape);
  ASSERT_TRUE(cache.host_bf16());
  EXPECT_EQ(cache.keys(0, 0), nullptr);  // no fp32 view of bf16 storage
  BlockTable table = {2, 0};
  const std::vector<float> specials = {
      1.0f + 0x1p-8f, 1.0f + 0x3p-8f,  -1.0f - 0x1p-8f, 0x1p-130f,
      -0x1p-140f,     INFINITY,        -INFINITY,       3.4028235e38f,
      std::nanf(""),  -std::nanf("1"), 1.0f + 0x1p-20f, 0.0f,
      -0.0f,          65504.0f,        1e-38f,          2.5f};
  std::vector<float> k(5 * 8), v(5 * 8);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = specials[i % specials.size()];
    v[i] = -specials[(i + 3) % specials.size()];
  }
  float low_payload_nan;  // a NaN whose payload is only in the bits rounding drops
  const uint32_t bits = 0x7f800001u;
  std::memcpy(&low_payload_nan, &bits, sizeof bits);
  k[3] = low_payload_nan;
  // Positions 3..7 of a sequence: slots 3 of block 2, then 0..3 of block 0; layer 1.
  WriteKv(k.data(), v.data(), {{5, 3, &table}}, 1, &cache);
  for (int64_t t = 0; t < 5; ++t) {
    const int64_t pos = 3 + t;
    const int32_t block = table[pos / 4];
    for (int64_t i = 0; i < 8; ++i) {
      const uint16_t key = cache.bf16_rows(1, block, 0)[(pos % 4) * 8 + i];
      const uint16_t value = cache.bf16_rows(1, block, 1)[(pos % 4) * 8 + i];
      ASSERT_EQ(key, FloatToBf16(k[t * 8 + i])) << "key " << t << ", " << i;
      ASSERT_EQ(value, FloatToBf16(v[t * 8 + i])) << "value " << t << ", " << i;
    }
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(cache.bf16_rows(1, 2, 0)[3 * 8 + 3])));
  EXPECT_EQ(cache.bf16_rows(1, 2, 0)[3 * 8 + 0], 0x3f80u);  // 1 + 2^-8 ties to even: 1
  EXPECT_EQ(cache.bf16_rows(1, 2, 0)[3 * 8 + 1], 0x3f82u);  // 1 + 3 x 2^-8 ties up
  // Layer 0 untouched.
  for (int32_t b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < 32; ++i) ASSERT_EQ(cache.bf16_rows(0, b, 0)[i], 0u);
  }
}

// The fp32 path (exact, and any arithmetic on weights that are not bf16) on a bf16 cache: each
// row widened exactly, so the bits are those of an fp32 cache holding the rounded values, in
// the SIMD forms and the portable one, whatever the item's rows (a lone row reads unpacked from
// an fp32 cache but is widened into a block from a bf16 one).
TEST(PagedAttentionTest, ABf16CacheIsAnFp32CacheOfTheRoundedValues) {
  uint32_t seed = 900;
  for (const bool generic : {false, true}) {
    internal::ForceGenericKernels(generic);
    for (const Case& c : std::vector<Case>{{4, 2, 13, 3, {{0, 5}, {6, 1}, {2, 7}}},
                                           {24, 2, 128, 16, {{0, 70}, {100, 1}, {33, 40}}},
                                           {2, 2, 24, 8, {{0, 1}, {30, 1}, {0, 19}}},
                                           {3, 1, 64, 16, {{64, 1}, {0, 66}}}}) {
      int64_t cached = 0, total = 0;
      for (const auto& [before, fresh] : c.seqs) cached += before + fresh, total += fresh;
      const int64_t kv_dim = c.kv_heads * c.head_dim;
      KvCacheShape shape{1, c.kv_heads, c.head_dim, c.block_size, cached / c.block_size + 8};
      KvCache fp32(shape);
      shape.bf16 = true;
      KvCache bf16(shape);
      std::vector<BlockTable> tables(c.seqs.size());
      std::vector<SequenceSlice> batch;
      for (size_t i = 0; i < c.seqs.size(); ++i) {
        const int64_t n = c.seqs[i].first + c.seqs[i].second;
        ASSERT_TRUE(fp32.Reserve(&tables[i], n).ok());
        std::vector<float> k = testing::RandomVector(n * kv_dim, seed++);
        std::vector<float> v = testing::RandomVector(n * kv_dim, seed++);
        WriteKv(k.data(), v.data(), {{n, 0, &tables[i]}}, 0, &bf16);
        for (float& x : k) x = Bf16ToFloat(FloatToBf16(x));
        for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
        WriteKv(k.data(), v.data(), {{n, 0, &tables[i]}}, 0, &fp32);
        batch.push_back({c.seqs[i].second, c.seqs[i].first, &tables[i]});
      }
      const std::vector<float> q = testing::RandomVector(total * c.heads * c.head_dim, seed++, 3.f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
      PagedAttention(q.data(), batch, fp32, 0, c.heads, scale, want.data());
      PagedAttention(q.data(), batch, bf16, 0, c.heads, scale, got.data());
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << (generic ? "portable" : "fast") << ", head_dim " << c.head_dim << ", element " << i
            << ": " << got[i] << " against " << want[i];
      }
    }
  }
  internal::ForceGenericKernels(false);
}

TEST(KvCacheTest, ReserveIsAllOrNothingAndFreeReturnsBlocks) {
  KvCache cache({2, 1, 4, 4, 5});
  BlockTable a, b;
  ASSERT_TRUE(cache.Reserve(&a, 9).ok());  // 3 blocks
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(cache.allocator().num_free(), 2);
  absl::Status s = cache.Reserve(&b, 12);  // needs 3, only 2 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(cache.allocator().num_free(), 2);
  ASSERT_TRUE(cache.Reserve(&a, 12).ok());  // growing an existing table adds one block
  EXPECT_EQ(a.size(), 3u);
  ASSERT_TRUE(cache.Reserve(&a, 13).ok());
  EXPECT_EQ(a.size(), 4u);
  // A shared block survives its first holder.
  cache.allocator().AddRef(a[0]);
  const int32_t shared = a[0];
  cache.Free(&a);
  EXPECT_EQ(cache.allocator().num_free(), 4);
  EXPECT_EQ(cache.allocator().ref_count(shared), 1);
  cache.allocator().Release(shared);
  EXPECT_EQ(cache.allocator().num_free(), 5);
}

}  // namespace
}  // namespace glmserve
