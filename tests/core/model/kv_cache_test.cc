// The paged KV cache's contract (core/model/kv_cache.h): the block allocator's order, reference
// counts and exhaustion; KvCacheBytes' checked size; CreateHost's refusals; the storage
// layout [num_layers, num_blocks, 2 (k, v), block_size, kv_dim]; Reserve's all-or-nothing
// growth; external storage shared by copies and released once.
#include "core/model/kv_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace glmserve {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

KvCacheShape SmallShape() {
  KvCacheShape s;
  s.num_layers = 3;
  s.kv_heads = 2;
  s.head_dim = 4;
  s.block_size = 4;
  s.num_blocks = 5;
  return s;
}

// ---------------------------------------------------------------------------------------
// BlockAllocator

TEST(BlockAllocatorTest, HandsOutLowIdsFirstThenRunsDry) {
  BlockAllocator a(4);
  EXPECT_EQ(a.num_blocks(), 4);
  EXPECT_EQ(a.num_free(), 4);
  for (int32_t expected = 0; expected < 4; ++expected) {
    EXPECT_EQ(a.Allocate(), expected);
    EXPECT_EQ(a.ref_count(expected), 1);
    EXPECT_EQ(a.num_free(), 3 - expected);
  }
  EXPECT_EQ(a.Allocate(), -1);
  EXPECT_EQ(a.Allocate(), -1);  // still dry, and the failed calls changed nothing
  EXPECT_EQ(a.num_free(), 0);
  for (int32_t b = 0; b < 4; ++b) EXPECT_EQ(a.ref_count(b), 1);
}

TEST(BlockAllocatorTest, EmptyAllocatorHasNothingToGive) {
  BlockAllocator a(0);
  EXPECT_EQ(a.num_blocks(), 0);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.Allocate(), -1);
}

TEST(BlockAllocatorTest, ReleasedBlockIsTheNextOneHandedOut) {
  BlockAllocator a(4);
  for (int i = 0; i < 3; ++i) a.Allocate();  // 0, 1, 2 taken; 3 free
  a.Release(1);
  EXPECT_EQ(a.ref_count(1), 0);
  EXPECT_EQ(a.num_free(), 2);
  // The free list is a stack: the most recently released block goes out first (its storage
  // is the most likely to be warm in cache), before the never-used block 3.
  EXPECT_EQ(a.Allocate(), 1);
  EXPECT_EQ(a.Allocate(), 3);
  EXPECT_EQ(a.Allocate(), -1);
}

TEST(BlockAllocatorTest, SharedBlockIsFreeOnlyAfterTheLastRelease) {
  BlockAllocator a(2);
  const int32_t b = a.Allocate();
  a.AddRef(b);
  a.AddRef(b);
  EXPECT_EQ(a.ref_count(b), 3);
  EXPECT_EQ(a.num_free(), 1);
  a.Release(b);
  a.Release(b);
  EXPECT_EQ(a.ref_count(b), 1);
  EXPECT_EQ(a.num_free(), 1);  // one holder left: not free
  EXPECT_NE(a.Allocate(), b);  // the other block, not the shared one
  EXPECT_EQ(a.Allocate(), -1);
  a.Release(b);
  EXPECT_EQ(a.ref_count(b), 0);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.Allocate(), b);
  EXPECT_EQ(a.ref_count(b), 1);  // a reallocated block starts again at one reference
}

TEST(BlockAllocatorTest, ManyCyclesNeverLoseOrDuplicateABlock) {
  constexpr int32_t kBlocks = 64;
  BlockAllocator a(kBlocks);
  std::vector<int32_t> held;
  uint32_t state = 12345;  // a fixed LCG: the test is deterministic
  for (int step = 0; step < 10000; ++step) {
    state = state * 1664525u + 1013904223u;
    if ((state >> 16) % 3 != 0 || held.empty()) {
      const int32_t b = a.Allocate();
      if (b < 0) {
        ASSERT_EQ(static_cast<int32_t>(held.size()), kBlocks);
        continue;
      }
      held.push_back(b);
    } else {
      const size_t i = (state >> 8) % held.size();
      a.Release(held[i]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(a.num_free() + static_cast<int32_t>(held.size()), kBlocks);
  }
  const std::set<int32_t> unique(held.begin(), held.end());
  EXPECT_EQ(unique.size(), held.size());
  for (int32_t b = 0; b < kBlocks; ++b) EXPECT_EQ(a.ref_count(b), unique.count(b) ? 1 : 0);
}

// ---------------------------------------------------------------------------------------
// KvCacheBytes

TEST(KvCacheBytesTest, IsKeysAndValuesOfEveryDimension) {
  const KvCacheShape s = SmallShape();
  // 2 (k, v) x 3 layers x 2 heads x 4 dims x 4 slots x 5 blocks x 4 bytes.
  EXPECT_EQ(*KvCacheBytes(s, 4), 2 * 3 * 2 * 4 * 4 * 5 * 4);
  EXPECT_EQ(*KvCacheBytes(s, 2), 2 * 3 * 2 * 4 * 4 * 5 * 2);
  KvCacheShape one;
  one.num_layers = one.kv_heads = one.head_dim = one.block_size = one.num_blocks = 1;
  EXPECT_EQ(*KvCacheBytes(one, 1), 2);
}

TEST(KvCacheBytesTest, RefusesEveryNonPositiveDimensionByName) {
  struct Case {
    const char* name;
    int64_t KvCacheShape::*field;
  };
  const Case cases[] = {{"layers", &KvCacheShape::num_layers},
                        {"KV heads", &KvCacheShape::kv_heads},
                        {"head dim", &KvCacheShape::head_dim},
                        {"block size", &KvCacheShape::block_size},
                        {"blocks", &KvCacheShape::num_blocks}};
  for (const Case& c : cases) {
    for (int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      KvCacheShape s = SmallShape();
      s.*c.field = bad;
      const absl::StatusOr<int64_t> bytes = KvCacheBytes(s, 4);
      ASSERT_FALSE(bytes.ok()) << c.name << " = " << bad;
      EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(bytes.status().message().find(std::string(c.name) + " must be > 0"),
                std::string::npos)
          << bytes.status();
    }
  }
  for (int64_t bad : {int64_t{0}, int64_t{-4}}) {
    const absl::StatusOr<int64_t> bytes = KvCacheBytes(SmallShape(), bad);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("element bytes must be > 0"), std::string::npos);
  }
}

TEST(KvCacheBytesTest, BlockCountIsBoundedByInt32BlockIds) {
  KvCacheShape s;
  s.num_layers = s.kv_heads = s.head_dim = s.block_size = 1;
  s.num_blocks = kInt32Max;  // the largest id range: fine
  EXPECT_EQ(*KvCacheBytes(s, 1), 2 * kInt32Max);
  s.num_blocks = kInt32Max + 1;
  const absl::StatusOr<int64_t> bytes = KvCacheBytes(s, 1);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("block ids"), std::string::npos) << bytes.status();
}

TEST(KvCacheBytesTest, OverflowIsAnErrorNeverAWrappedSize) {
  // Each dimension in turn carries the overflow, so no multiplication step is unchecked.
  for (int which = 0; which < 6; ++which) {
    KvCacheShape s;
    s.num_layers = s.kv_heads = s.head_dim = s.block_size = s.num_blocks = 1;
    int64_t element_bytes = 1;
    const int64_t huge = int64_t{1} << 62;  // x 2 (k, v) alone reaches 2^63
    switch (which) {
      case 0:
        s.num_layers = huge;
        break;
      case 1:
        s.kv_heads = huge;
        break;
      case 2:
        s.head_dim = huge;
        break;
      case 3:
        s.block_size = huge;
        break;
      case 4:
        s.num_blocks = kInt32Max;
        s.block_size = int64_t{1} << 32;
        break;
      case 5:
        element_bytes = huge;
        break;
    }
    const absl::StatusOr<int64_t> bytes = KvCacheBytes(s, element_bytes);
    ASSERT_FALSE(bytes.ok()) << "case " << which << " gave " << *bytes;
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("overflow"), std::string::npos) << bytes.status();
  }
  // The largest product that fits is still exact.
  KvCacheShape s;
  s.num_layers = s.kv_heads = s.head_dim = s.num_blocks = 1;
  s.block_size = (int64_t{1} << 62) - 1;
  EXPECT_EQ(*KvCacheBytes(s, 1), kInt64Max - 1);
}

// ---------------------------------------------------------------------------------------
// CreateHost and the host layout

TEST(KvCacheCreateHostTest, RefusesAShapeKvCacheBytesRefuses) {
  KvCacheShape s = SmallShape();
  s.head_dim = 0;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::CreateHost(s);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cache.status().message().find("head dim"), std::string::npos);

  s = SmallShape();
  s.num_layers = int64_t{1} << 62;
  cache = KvCache::CreateHost(s);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheCreateHostTest, RefusesMoreThanTheMachineHasWithoutTouchingIt) {
  // ~2^56 bytes: a valid size, far beyond any machine's memory. It must be refused up front
  // (RESOURCE_EXHAUSTED), not overcommitted and then killed by the OOM killer.
  KvCacheShape s;
  s.num_layers = 1 << 10;
  s.kv_heads = 1 << 5;
  s.head_dim = 1 << 7;
  s.block_size = 1 << 4;
  s.num_blocks = 1 << 27;
  ASSERT_TRUE(KvCacheBytes(s, sizeof(float)).ok());
  const absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::CreateHost(s);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(cache.status().message().find("--kv_capacity_tokens"), std::string::npos)
      << cache.status();
}

TEST(KvCacheCreateHostTest, FreshCacheIsZeroedFp32WithEveryBlockFree) {
  const KvCacheShape s = SmallShape();
  absl::StatusOr<std::unique_ptr<KvCache>> made = KvCache::CreateHost(s);
  ASSERT_TRUE(made.ok()) << made.status();
  const KvCache& cache = **made;
  EXPECT_TRUE(cache.host_fp32());
  EXPECT_EQ(cache.dtype(), DType::kF32);
  EXPECT_EQ(cache.kv_dim(), 8);
  EXPECT_EQ(cache.capacity_tokens(), 20);
  EXPECT_EQ(cache.bytes_per_token(), 2 * 3 * 8 * 4);
  EXPECT_EQ(cache.num_elements(), 3 * 5 * 2 * 4 * 8);
  EXPECT_EQ(cache.num_elements() * 4, *KvCacheBytes(s, 4));
  EXPECT_EQ(cache.allocator().num_blocks(), 5);
  EXPECT_EQ(cache.allocator().num_free(), 5);
  const float* data = static_cast<const float*>(cache.storage());
  for (int64_t i = 0; i < cache.num_elements(); ++i) ASSERT_EQ(data[i], 0.0f) << i;
}

// The bf16 host cache (--kv_cache_dtype=bf16): two bytes per value in the fp32 cache's layout,
// zeroed, no fp32 or FP8 view; refused for the latent layout and beside FP8.
TEST(KvCacheCreateHostTest, Bf16CacheHalvesTheBytesInTheSameLayout) {
  KvCacheShape s = SmallShape();
  s.bf16 = true;
  absl::StatusOr<std::unique_ptr<KvCache>> made = KvCache::CreateHost(s);
  ASSERT_TRUE(made.ok()) << made.status();
  KvCache& cache = **made;
  EXPECT_TRUE(cache.host_bf16());
  EXPECT_FALSE(cache.host_fp32());
  EXPECT_FALSE(cache.host_fp8());
  EXPECT_EQ(cache.dtype(), DType::kBF16);
  EXPECT_EQ(KvCacheDTypeOf(cache.dtype()), KvCacheDType::kBf16);
  EXPECT_EQ(cache.bytes_per_token(), 2 * 3 * 8 * 2);
  EXPECT_EQ(cache.keys(0, 0), nullptr);
  EXPECT_EQ(cache.codes(0, 0, 0), nullptr);
  const uint16_t* base = static_cast<const uint16_t*>(cache.storage());
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int32_t b = 0; b < s.num_blocks; ++b) {
      for (int kind = 0; kind < 2; ++kind) {
        EXPECT_EQ(cache.bf16_rows(l, b, kind) - base, cache.ElementOffset(l, b, kind));
      }
    }
  }
  for (int64_t i = 0; i < cache.num_elements(); ++i) ASSERT_EQ(base[i], 0u) << i;

  KvCacheShape latent = s;
  latent.latent = true;
  EXPECT_EQ(KvCache::CreateHost(latent).status().code(), absl::StatusCode::kInvalidArgument);
  KvCacheShape both = s;
  both.fp8 = true;
  EXPECT_EQ(KvCache::CreateHost(both).status().code(), absl::StatusCode::kInvalidArgument);
}

// The flag's names round-trip, and anything else names every accepted value.
TEST(KvCacheDTypeTest, NamesRoundTripAndAnUnknownNameListsTheAccepted) {
  for (const KvCacheDType d :
       {KvCacheDType::kAuto, KvCacheDType::kFp32, KvCacheDType::kBf16, KvCacheDType::kFp8E4M3}) {
    absl::StatusOr<KvCacheDType> parsed = ParseKvCacheDType(KvCacheDTypeName(d));
    ASSERT_TRUE(parsed.ok()) << KvCacheDTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  const absl::StatusOr<KvCacheDType> bad = ParseKvCacheDType("fp16");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, fp32, bf16, fp8_e4m3"), std::string::npos);
  EXPECT_EQ(KvCacheDTypeOf(DType::kF32), KvCacheDType::kFp32);
  EXPECT_EQ(KvCacheDTypeOf(DType::kF8E4M3), KvCacheDType::kFp8E4M3);
}

TEST(KvCacheLayoutTest, KeysAndValuesRowsTileTheStorageInDocumentedOrder) {
  const KvCacheShape s = SmallShape();
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(s);
  const int64_t row = s.block_size * cache->kv_dim();  // one block's K (or V) rows
  float* base = static_cast<float*>(cache->storage());
  // Write a tag naming (layer, block, kind, element) through keys() / values() ...
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int32_t b = 0; b < s.num_blocks; ++b) {
      EXPECT_EQ(cache->keys(l, b) - base, cache->ElementOffset(l, b, 0));
      EXPECT_EQ(cache->values(l, b) - base, cache->ElementOffset(l, b, 1));
      for (int64_t i = 0; i < row; ++i) {
        cache->keys(l, b)[i] = static_cast<float>(((l * 10 + b) * 2 + 0) * 1000 + i);
        cache->values(l, b)[i] = static_cast<float>(((l * 10 + b) * 2 + 1) * 1000 + i);
      }
    }
  }
  // ... and read the storage back in [layer, block, kind, slot x kv_dim] order: every element
  // written exactly once (no overlap, no gap).
  int64_t flat = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int32_t b = 0; b < s.num_blocks; ++b) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int64_t i = 0; i < row; ++i, ++flat) {
          ASSERT_EQ(base[flat], static_cast<float>(((l * 10 + b) * 2 + kind) * 1000 + i))
              << "layer " << l << " block " << b << " kind " << kind << " element " << i;
        }
      }
    }
  }
  EXPECT_EQ(flat, cache->num_elements());
  // The const accessors address the same rows.
  const KvCache& c = *cache;
  EXPECT_EQ(c.keys(2, 4), cache->keys(2, 4));
  EXPECT_EQ(c.values(1, 3), cache->values(1, 3));
}

// ---------------------------------------------------------------------------------------
// Reserve / Free

TEST(KvCacheReserveTest, CoversExactlyTheTokensAskedFor) {
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(SmallShape());  // block_size 4
  BlockTable t;
  ASSERT_TRUE(cache->Reserve(&t, 0).ok());
  EXPECT_TRUE(t.empty());
  ASSERT_TRUE(cache->Reserve(&t, 1).ok());
  EXPECT_EQ(t, BlockTable({0}));
  ASSERT_TRUE(cache->Reserve(&t, 4).ok());  // the first block's last slot: no new block
  EXPECT_EQ(t, BlockTable({0}));
  ASSERT_TRUE(cache->Reserve(&t, 5).ok());
  EXPECT_EQ(t, BlockTable({0, 1}));
  ASSERT_TRUE(cache->Reserve(&t, 3).ok());  // shrinking is not Reserve's job: unchanged
  EXPECT_EQ(t, BlockTable({0, 1}));
  ASSERT_TRUE(cache->Reserve(&t, 12).ok());
  EXPECT_EQ(t, BlockTable({0, 1, 2}));
  EXPECT_EQ(cache->allocator().num_free(), 2);
  ASSERT_TRUE(cache->Reserve(&t, -7).ok());  // nothing to cover
  EXPECT_EQ(t.size(), 3u);
}

TEST(KvCacheReserveTest, FillsTheWholeCapacityAndNotOneTokenMore) {
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(SmallShape());  // 20 tokens
  BlockTable t;
  ASSERT_TRUE(cache->Reserve(&t, cache->capacity_tokens()).ok());
  EXPECT_EQ(t, BlockTable({0, 1, 2, 3, 4}));
  EXPECT_EQ(cache->allocator().num_free(), 0);
  const absl::Status more = cache->Reserve(&t, cache->capacity_tokens() + 1);
  EXPECT_EQ(more.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.size(), 5u);
}

TEST(KvCacheReserveTest, ExhaustionIsAllOrNothing) {
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(SmallShape());  // 5 blocks of 4
  BlockTable a, b;
  ASSERT_TRUE(cache->Reserve(&a, 9).ok());  // 3 blocks
  ASSERT_TRUE(cache->Reserve(&b, 2).ok());  // 1 block: 1 left
  const BlockTable before = b;
  const absl::Status s = cache->Reserve(&b, 12);  // needs 2 more, 1 free
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("12 tokens need 2 more blocks, 1 free of 5"), std::string::npos) << s;
  EXPECT_EQ(b, before);                         // no partial growth ...
  EXPECT_EQ(cache->allocator().num_free(), 1);  // ... and no block leaked
  ASSERT_TRUE(cache->Reserve(&b, 8).ok());      // what does fit still succeeds
  EXPECT_EQ(cache->allocator().num_free(), 0);
}

TEST(KvCacheReserveTest, HugeTokenCountsAreExhaustionNotAWrappedBlockCount) {
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(SmallShape());
  for (int64_t tokens : {kInt64Max, kInt64Max - 2, kInt64Max / 2}) {
    BlockTable t;
    const absl::Status s = cache->Reserve(&t, tokens);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << tokens << ": " << s;
    EXPECT_TRUE(t.empty());
    EXPECT_EQ(cache->allocator().num_free(), 5);
  }
}

TEST(KvCacheReserveTest, FreeReturnsEveryBlockAndClearsTheTable) {
  std::unique_ptr<KvCache> cache = *KvCache::CreateHost(SmallShape());
  BlockTable a, b;
  ASSERT_TRUE(cache->Reserve(&a, 8).ok());
  // b shares a's first block (a common prefix), then grows its own.
  b.push_back(a[0]);
  cache->allocator().AddRef(a[0]);
  ASSERT_TRUE(cache->Reserve(&b, 6).ok());
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(cache->allocator().num_free(), 2);
  cache->Free(&a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(cache->allocator().num_free(), 3);  // a's second block only: the shared one stays
  EXPECT_EQ(cache->allocator().ref_count(b[0]), 1);
  cache->Free(&b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(cache->allocator().num_free(), 5);
  cache->Free(&b);  // freeing an empty table is a no-op
  EXPECT_EQ(cache->allocator().num_free(), 5);
}

// ---------------------------------------------------------------------------------------
// External storage

TEST(KvCacheExternalTest, DescribesItsStorageAndReleasesItOnceAfterTheLastCopy) {
  const KvCacheShape s = SmallShape();
  std::vector<uint16_t> storage(3 * 5 * 2 * 4 * 8);  // stands in for device bf16 memory
  int deletes = 0;
  void* seen = nullptr;
  {
    KvCache cache(s, storage.data(), DType::kBF16, [&](void* p) {
      ++deletes;
      seen = p;
    });
    EXPECT_FALSE(cache.host_fp32());
    EXPECT_EQ(cache.dtype(), DType::kBF16);
    EXPECT_EQ(cache.storage(), storage.data());
    EXPECT_EQ(static_cast<const KvCache&>(cache).storage(), storage.data());
    EXPECT_EQ(cache.bytes_per_token(), 2 * 3 * 8 * 2);  // bf16: 2 bytes a value
    EXPECT_EQ(cache.num_elements(), static_cast<int64_t>(storage.size()));
    EXPECT_EQ(cache.ElementOffset(2, 4, 1), ((2 * 5 + 4) * 2 + 1) * 4 * 8);
    EXPECT_EQ(cache.allocator().num_free(), 5);
    {
      KvCache copy = cache;  // copies share the storage
      EXPECT_EQ(copy.storage(), storage.data());
    }
    EXPECT_EQ(deletes, 0);  // one copy left
  }
  EXPECT_EQ(deletes, 1);
  EXPECT_EQ(seen, storage.data());
}

}  // namespace
}  // namespace glmserve
