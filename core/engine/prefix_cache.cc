#include "core/engine/prefix_cache.h"

#include <algorithm>
#include <iterator>

namespace glmserve {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(BlockAllocator* allocator, int64_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

PrefixCache::~PrefixCache() {
  for (auto& [hash, entry] : entries_) allocator_->Release(entry.block);
}

uint64_t PrefixCache::ChainHash(uint64_t parent, absl::Span<const int32_t> block_tokens) {
  uint64_t h = Mix(parent ^ 0x243f6a8885a308d3ull);
  for (int32_t t : block_tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;  // 0 is reserved for "no parent"
}

std::list<uint64_t>::iterator PrefixCache::Touch(Entry& entry,
                                                 std::list<uint64_t>::iterator where) {
  lru_.splice(where, lru_, entry.lru);  // iterators stay valid; a no-op if already there
  return std::next(entry.lru);
}

int64_t PrefixCache::Match(absl::Span<const int32_t> tokens, int64_t max_blocks,
                           BlockTable* table) {
  const int64_t full =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()) / block_size_, max_blocks);
  uint64_t parent = 0;
  int64_t matched = 0;
  auto where = lru_.begin();  // a chain's blocks go to the front in position order
  for (int64_t b = 0; b < full; ++b) {
    ++queries_;
    const auto block_tokens = tokens.subspan(b * block_size_, block_size_);
    const uint64_t hash = ChainHash(parent, block_tokens);
    auto it = entries_.find(hash);
    if (it == entries_.end() || it->second.parent != parent ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin())) {
      break;
    }
    ++hits_;
    allocator_->AddRef(it->second.block);
    table->push_back(it->second.block);
    where = Touch(it->second, where);
    parent = hash;
    ++matched;
  }
  // Count the remaining full blocks as queries too: the hit rate is per looked-up block.
  queries_ += std::max<int64_t>(0, full - matched - (matched < full ? 1 : 0));
  return matched;
}

void PrefixCache::Insert(absl::Span<const int32_t> tokens, int64_t computed_tokens,
                         const BlockTable& table) {
  const int64_t full =
      std::min<int64_t>(computed_tokens / block_size_, static_cast<int64_t>(table.size()));
  uint64_t parent = 0;
  auto where = lru_.begin();  // a chain's blocks go to the front in position order
  for (int64_t b = 0; b < full; ++b) {
    const auto block_tokens = tokens.subspan(b * block_size_, block_size_);
    const uint64_t hash = ChainHash(parent, block_tokens);
    auto it = entries_.find(hash);
    if (it == entries_.end()) {
      if (by_block_.count(table[b]) == 0) {  // a block is cached under one chain only
        const auto lru = lru_.insert(where, hash);
        entries_.emplace(
            hash, Entry{table[b], parent,
                        std::vector<int32_t>(block_tokens.begin(), block_tokens.end()), lru});
        by_block_[table[b]] = hash;
        allocator_->AddRef(table[b]);
        where = std::next(lru);
      }
    } else {
      where = Touch(it->second, where);
    }
    parent = hash;
  }
}

int64_t PrefixCache::evictable_blocks() const {
  int64_t n = 0;
  for (const auto& [hash, entry] : entries_) n += allocator_->ref_count(entry.block) == 1;
  return n;
}

bool PrefixCache::EnsureFree(int64_t needed) {
  auto it = lru_.end();
  while (allocator_->num_free() < needed && it != lru_.begin()) {
    --it;
    auto entry = entries_.find(*it);
    if (allocator_->ref_count(entry->second.block) != 1) continue;  // still in use
    // A child block (same chain, later position) is found only through its parent. Match
    // and Insert place a chain's blocks at the front in position order, so a parent is
    // always more recent than its children: the tail goes first and no cached block is
    // left unreachable behind an evicted parent.
    allocator_->Release(entry->second.block);
    by_block_.erase(entry->second.block);
    entries_.erase(entry);
    it = lru_.erase(it);
  }
  return allocator_->num_free() >= needed;
}

}  // namespace glmserve
