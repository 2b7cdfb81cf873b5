// Prefix sharing: full KV blocks of token sequences, found again by the hash of their block
// chain (the hash of every token from position 0 through the block's end), so a prompt that
// starts like an earlier one reuses the earlier one's blocks instead of recomputing them.
//
// The cache holds one reference on each block it knows. A block whose only holder is the
// cache is "evictable": it stays findable until the allocator runs dry, then the least
// recently used evictable block is released (a chain's blocks count as used from its head
// to its tail, so its tail goes first and its head last). Because the CPU kernels are
// batch- and chunk-invariant, a block computed for one request holds exactly the keys and
// values any other request with the same prefix would compute: a hit gives bit-identical
// output.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "core/model/kv_cache.h"

namespace glmserve {

class PrefixCache {
 public:
  PrefixCache(BlockAllocator* allocator, int64_t block_size);
  ~PrefixCache();  // releases the cache's references

  // Hash of a block given its parent's chain hash (0 for the first block).
  static uint64_t ChainHash(uint64_t parent, absl::Span<const int32_t> block_tokens);

  // Appends to `table` (empty on entry) the cached blocks matching the leading full blocks of
  // `tokens`, at most `max_blocks`, taking a reference on each for the caller. Returns the
  // number of blocks matched. Every full block looked up counts as a query.
  int64_t Match(absl::Span<const int32_t> tokens, int64_t max_blocks, BlockTable* table);

  // Offers the full blocks of a sequence (tokens[0 .. table.size() * block_size) computed,
  // table in position order): each not yet cached is registered, the cache taking its own
  // reference. `computed_tokens` bounds which blocks are full and valid.
  void Insert(absl::Span<const int32_t> tokens, int64_t computed_tokens, const BlockTable& table);

  // Releases least recently used evictable blocks until `needed` blocks are free in the
  // allocator or nothing more can be evicted. Returns true if `needed` are now free.
  bool EnsureFree(int64_t needed);

  int64_t evictable_blocks() const;
  // Calls fn(block) for every block the cache holds a reference on.
  template <typename Fn>
  void ForEachBlock(Fn fn) const {
    for (const auto& [hash, entry] : entries_) fn(entry.block);
  }  // cached blocks no sequence holds
  int64_t cached_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }

 private:
  struct Entry {
    int32_t block;
    uint64_t parent;                    // parent chain hash, checked on lookup
    std::vector<int32_t> tokens;        // the block's tokens, checked on lookup (no false hits)
    std::list<uint64_t>::iterator lru;  // position in lru_ (front = most recent)
  };

  // Marks `entry` used: moves it in lru_ to just before `where` and returns the position
  // after it, where the chain's next block goes (so a parent stays ahead of its children).
  std::list<uint64_t>::iterator Touch(Entry& entry, std::list<uint64_t>::iterator where);

  BlockAllocator* allocator_;
  int64_t block_size_;
  std::unordered_map<uint64_t, Entry> entries_;     // by chain hash
  std::unordered_map<int32_t, uint64_t> by_block_;  // block id -> chain hash
  std::list<uint64_t> lru_;                         // chain hashes, most recent first
  int64_t queries_ = 0;
  int64_t hits_ = 0;
};

}  // namespace glmserve
