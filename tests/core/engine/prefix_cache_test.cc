// The prefix cache's contract (core/engine/prefix_cache.h): only full, computed blocks are offered;
// a lookup matches whole leading blocks of the same chain (a block's identity includes every
// token before it); matched blocks are pinned by a reference for the caller; eviction frees
// least recently used blocks that no sequence holds, a chain's tail before its head; the hit
// counters count blocks; the cache gives back its references when it goes.
#include "core/engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <unordered_set>
#include <vector>

namespace glmserve {
namespace {

constexpr int64_t kBlockSize = 4;

// `n` tokens starting at `first`, consecutive.
std::vector<int32_t> Tokens(int64_t n, int32_t first = 100) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(first + static_cast<int32_t>(i));
  return t;
}

// A sequence that computed `tokens`: its own freshly allocated blocks, one per (partial)
// block of tokens.
BlockTable Computed(BlockAllocator& allocator, const std::vector<int32_t>& tokens) {
  BlockTable table;
  for (size_t i = 0; i < tokens.size(); i += kBlockSize) table.push_back(allocator.Allocate());
  for (int32_t b : table) EXPECT_GE(b, 0) << "test allocator too small";
  return table;
}

void ReleaseAll(BlockAllocator& allocator, BlockTable* table) {
  for (int32_t b : *table) allocator.Release(b);
  table->clear();
}

// ---------------------------------------------------------------------------------------
// ChainHash

TEST(PrefixCacheHashTest, DependsOnEveryTokenItsOrderAndTheParent) {
  const std::vector<int32_t> block = {1, 2, 3, 4};
  const uint64_t h = PrefixCache::ChainHash(0, block);
  EXPECT_EQ(h, PrefixCache::ChainHash(0, block));  // deterministic
  std::unordered_set<uint64_t> seen = {h};
  for (size_t i = 0; i < block.size(); ++i) {
    std::vector<int32_t> changed = block;
    changed[i] ^= 1 << 20;  // a high bit only: the mix must not drop it
    EXPECT_TRUE(seen.insert(PrefixCache::ChainHash(0, changed)).second) << "position " << i;
  }
  EXPECT_TRUE(seen.insert(PrefixCache::ChainHash(0, {4, 3, 2, 1})).second);   // order matters
  EXPECT_TRUE(seen.insert(PrefixCache::ChainHash(h, block)).second);          // the parent too
  EXPECT_TRUE(seen.insert(PrefixCache::ChainHash(0, {-1, 2, 3, 4})).second);  // negative ids
}

// ---------------------------------------------------------------------------------------
// Insert / Match

TEST(PrefixCacheTest, EmptyCacheMatchesNothingButCountsTheQueries) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  BlockTable table;
  EXPECT_EQ(cache.Match(Tokens(11), 100, &table), 0);  // 2 full blocks looked up
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(cache.queries(), 2);
  EXPECT_EQ(cache.hits(), 0);
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_EQ(cache.Match(Tokens(3), 100, &table), 0);  // no full block: no query
  EXPECT_EQ(cache.Match({}, 100, &table), 0);
  EXPECT_EQ(cache.queries(), 2);
  EXPECT_EQ(allocator.num_free(), 8);
}

TEST(PrefixCacheTest, InsertedFullBlocksAreFoundAgainAndPinnedForTheCaller) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(10);  // 2 full blocks and a partial one
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 10, own);
  EXPECT_EQ(cache.cached_blocks(), 2);  // the partial third block is not offered
  EXPECT_EQ(allocator.ref_count(own[0]), 2);
  EXPECT_EQ(allocator.ref_count(own[1]), 2);
  EXPECT_EQ(allocator.ref_count(own[2]), 1);
  EXPECT_EQ(cache.evictable_blocks(), 0);  // the sequence still holds them
  ReleaseAll(allocator, &own);
  EXPECT_EQ(cache.evictable_blocks(), 2);
  EXPECT_EQ(allocator.num_free(), 6);

  // A longer prompt with the same start finds both blocks.
  std::vector<int32_t> longer = Tokens(14);
  BlockTable table;
  EXPECT_EQ(cache.Match(longer, 100, &table), 2);
  EXPECT_EQ(table, BlockTable({0, 1}));
  EXPECT_EQ(allocator.ref_count(0), 2);  // one for the cache, one for the caller
  EXPECT_EQ(allocator.ref_count(1), 2);
  EXPECT_EQ(cache.evictable_blocks(), 0);
  EXPECT_EQ(cache.queries(), 3);  // blocks 0, 1 (hits) and 2 (a miss)
  EXPECT_EQ(cache.hits(), 2);
}

TEST(PrefixCacheTest, ComputedTokensAndTableSizeBoundWhatIsOffered) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(16);
  BlockTable own = Computed(allocator, tokens);  // 4 blocks
  cache.Insert(tokens, 7, own);                  // only block 0 is full and computed
  EXPECT_EQ(cache.cached_blocks(), 1);
  cache.Insert(tokens, 0, own);  // nothing computed: nothing new
  EXPECT_EQ(cache.cached_blocks(), 1);
  const BlockTable first_two(own.begin(), own.begin() + 2);
  cache.Insert(tokens, 16, first_two);  // the table covers 2 blocks only
  EXPECT_EQ(cache.cached_blocks(), 2);
  cache.Insert(tokens, 16, own);
  EXPECT_EQ(cache.cached_blocks(), 4);
  std::set<int32_t> held;
  cache.ForEachBlock([&](int32_t b) { EXPECT_TRUE(held.insert(b).second); });
  EXPECT_EQ(held, std::set<int32_t>(own.begin(), own.end()));
}

TEST(PrefixCacheTest, InsertingAgainTakesNoSecondReference) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(8);
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 8, own);
  cache.Insert(tokens, 8, own);
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(allocator.ref_count(own[0]), 2);
  // Another sequence that computed the same tokens into its own blocks (no hit at its
  // admission): the cache keeps the first copy and takes no reference on the second.
  BlockTable twin = Computed(allocator, tokens);
  cache.Insert(tokens, 8, twin);
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(allocator.ref_count(twin[0]), 1);
  EXPECT_EQ(allocator.ref_count(twin[1]), 1);
  BlockTable table;
  EXPECT_EQ(cache.Match(tokens, 100, &table), 2);
  EXPECT_EQ(table, own);
}

TEST(PrefixCacheTest, ABlockIdIsCachedUnderOneChainOnly) {
  BlockAllocator allocator(4);
  PrefixCache cache(&allocator, kBlockSize);
  BlockTable own = {allocator.Allocate()};
  cache.Insert(Tokens(4, 0), 4, own);
  // The same block id offered again under other tokens (a caller bug, or storage reused
  // while still cached) must not register a second entry for it.
  cache.Insert(Tokens(4, 50), 4, own);
  EXPECT_EQ(cache.cached_blocks(), 1);
  EXPECT_EQ(allocator.ref_count(own[0]), 2);
  BlockTable table;
  EXPECT_EQ(cache.Match(Tokens(4, 50), 100, &table), 0);
  EXPECT_EQ(cache.Match(Tokens(4, 0), 100, &table), 1);
}

TEST(PrefixCacheTest, MatchStopsAtTheFirstDifferentBlock) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(12);
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 12, own);
  ReleaseAll(allocator, &own);

  for (int64_t diverge = 0; diverge < 12; ++diverge) {
    std::vector<int32_t> other = tokens;
    other[diverge] = -5;
    BlockTable table;
    const int64_t matched = cache.Match(other, 100, &table);
    EXPECT_EQ(matched, diverge / kBlockSize) << "diverging at " << diverge;
    EXPECT_EQ(static_cast<int64_t>(table.size()), matched);
    ReleaseAll(allocator, &table);
  }
  // Blocks 1 and 2's own tokens behind a different block 0 are a different chain: no hit.
  std::vector<int32_t> other_head = tokens;
  other_head[0] = -5;
  BlockTable table;
  EXPECT_EQ(cache.Match(other_head, 100, &table), 0);
  // The leading blocks of a shorter, block-aligned prompt match.
  EXPECT_EQ(cache.Match(Tokens(8), 100, &table), 2);
  ReleaseAll(allocator, &table);
  EXPECT_EQ(allocator.num_free(), 5);  // every caller reference given back
}

TEST(PrefixCacheTest, MaxBlocksBoundsTheMatchAndItsQueries) {
  BlockAllocator allocator(8);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(12);
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 12, own);
  BlockTable table;
  EXPECT_EQ(cache.Match(tokens, 2, &table), 2);
  EXPECT_EQ(table, BlockTable(own.begin(), own.begin() + 2));
  EXPECT_EQ(cache.queries(), 2);
  table.clear();
  EXPECT_EQ(cache.Match(tokens, 0, &table), 0);
  EXPECT_EQ(cache.Match(tokens, -3, &table), 0);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(cache.queries(), 2);  // nothing looked up: no queries
  EXPECT_EQ(cache.hits(), 2);
}

TEST(PrefixCacheTest, QueriesCountEveryFullBlockHitsCountMatchedOnes) {
  BlockAllocator allocator(16);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(8);
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 8, own);
  std::vector<int32_t> prompt = Tokens(23);  // 5 full blocks; the first 2 cached
  BlockTable table;
  EXPECT_EQ(cache.Match(prompt, 100, &table), 2);
  EXPECT_EQ(cache.queries(), 5);
  EXPECT_EQ(cache.hits(), 2);
  prompt[1] = -1;  // misses at once: still 5 blocks looked up
  BlockTable none;
  EXPECT_EQ(cache.Match(prompt, 100, &none), 0);
  EXPECT_EQ(cache.queries(), 10);
  EXPECT_EQ(cache.hits(), 2);
}

// ---------------------------------------------------------------------------------------
// Eviction

TEST(PrefixCacheEvictionTest, NothingIsEvictedWhileEnoughIsFree) {
  BlockAllocator allocator(4);
  PrefixCache cache(&allocator, kBlockSize);
  BlockTable own = Computed(allocator, Tokens(4));
  cache.Insert(Tokens(4), 4, own);
  ReleaseAll(allocator, &own);
  EXPECT_TRUE(cache.EnsureFree(0));
  EXPECT_TRUE(cache.EnsureFree(3));
  EXPECT_EQ(cache.cached_blocks(), 1);
  EXPECT_EQ(allocator.num_free(), 3);
  EXPECT_TRUE(cache.EnsureFree(4));  // now it must go
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_EQ(allocator.num_free(), 4);
  EXPECT_FALSE(cache.EnsureFree(5));  // more than exist: false, and nothing to do
}

TEST(PrefixCacheEvictionTest, LeastRecentlyUsedChainGoesFirst) {
  BlockAllocator allocator(3);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> a = Tokens(4, 0), b = Tokens(4, 10), c = Tokens(4, 20);
  for (const auto* t : {&a, &b, &c}) {
    BlockTable own = Computed(allocator, *t);
    cache.Insert(*t, 4, own);
    ReleaseAll(allocator, &own);
  }
  // Use a again (a hit): b is now the least recently used.
  BlockTable table;
  ASSERT_EQ(cache.Match(a, 100, &table), 1);
  ReleaseAll(allocator, &table);
  ASSERT_EQ(allocator.num_free(), 0);
  EXPECT_TRUE(cache.EnsureFree(1));
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(cache.Match(b, 100, &table), 0);
  EXPECT_EQ(cache.Match(c, 100, &table), 1);
  EXPECT_EQ(cache.Match(a, 100, &table), 1);  // a most recent, c least
  ReleaseAll(allocator, &table);
  // Re-inserting counts as a use as well: c is refreshed, so a goes next.
  BlockTable own_c = {allocator.Allocate()};
  ASSERT_GE(own_c[0], 0);
  cache.Insert(c, 4, own_c);  // already cached under another block: a touch only
  ReleaseAll(allocator, &own_c);
  EXPECT_TRUE(cache.EnsureFree(2));
  EXPECT_EQ(cache.Match(a, 100, &table), 0);
  EXPECT_EQ(cache.Match(c, 100, &table), 1);
  ReleaseAll(allocator, &table);
}

TEST(PrefixCacheEvictionTest, AChainLosesItsTailBeforeItsHead) {
  // A child block is only ever found through its parent, so evicting a parent first would
  // leave its children cached yet unreachable. Freeing one block of a 3-block chain must
  // keep the 2-block prefix usable.
  BlockAllocator allocator(3);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> tokens = Tokens(12);
  BlockTable own = Computed(allocator, tokens);
  cache.Insert(tokens, 12, own);
  ReleaseAll(allocator, &own);
  ASSERT_TRUE(cache.EnsureFree(1));
  BlockTable table;
  EXPECT_EQ(cache.Match(tokens, 100, &table), 2);
  ReleaseAll(allocator, &table);
  // Also after a hit refreshed the chain (Match touches it head first).
  ASSERT_TRUE(cache.EnsureFree(2));
  EXPECT_EQ(cache.Match(tokens, 100, &table), 1);
  ReleaseAll(allocator, &table);
  // A branch off the head: the branch's tail goes before the shared head.
  std::vector<int32_t> branch = Tokens(8);
  branch[5] = -1;
  BlockTable branch_table;
  ASSERT_EQ(cache.Match(branch, 100, &branch_table), 1);  // shares the head
  branch_table.push_back(allocator.Allocate());
  cache.Insert(branch, 8, branch_table);
  ReleaseAll(allocator, &branch_table);
  EXPECT_EQ(cache.cached_blocks(), 2);
  ASSERT_TRUE(cache.EnsureFree(allocator.num_blocks() - 1));  // all but one block
  EXPECT_EQ(cache.Match(tokens, 100, &table), 1);             // the head survived
  ReleaseAll(allocator, &table);
}

TEST(PrefixCacheEvictionTest, PinnedBlocksAreNeverEvicted) {
  BlockAllocator allocator(4);
  PrefixCache cache(&allocator, kBlockSize);
  const std::vector<int32_t> a = Tokens(8, 0), b = Tokens(8, 50);
  BlockTable own_a = Computed(allocator, a), own_b = Computed(allocator, b);
  cache.Insert(a, 8, own_a);
  cache.Insert(b, 8, own_b);
  ReleaseAll(allocator, &own_b);  // b idle, a still running
  EXPECT_EQ(cache.evictable_blocks(), 2);
  EXPECT_FALSE(cache.EnsureFree(3));  // only b's two blocks can go
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(cache.evictable_blocks(), 0);
  BlockTable table;
  EXPECT_EQ(cache.Match(a, 100, &table), 2);  // a is still there
  // A hit pins as well: after a finishes, the match's reference keeps the blocks.
  ReleaseAll(allocator, &own_a);
  EXPECT_FALSE(cache.EnsureFree(3));
  EXPECT_EQ(cache.cached_blocks(), 2);
  ReleaseAll(allocator, &table);
  EXPECT_TRUE(cache.EnsureFree(4));
  EXPECT_EQ(cache.cached_blocks(), 0);
}

TEST(PrefixCacheTest, DestructorGivesBackTheCachesReferences) {
  BlockAllocator allocator(6);
  BlockTable own;
  {
    PrefixCache cache(&allocator, kBlockSize);
    own = Computed(allocator, Tokens(12));
    cache.Insert(Tokens(12), 12, own);
    EXPECT_EQ(allocator.num_free(), 3);
  }
  for (int32_t b : own) EXPECT_EQ(allocator.ref_count(b), 1);  // the sequence's only
  ReleaseAll(allocator, &own);
  EXPECT_EQ(allocator.num_free(), 6);
}

}  // namespace
}  // namespace glmserve
