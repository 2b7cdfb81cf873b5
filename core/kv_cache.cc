#include "core/kv_cache.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"

namespace glm {

BlockAllocator::BlockAllocator(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  // Hand out low ids first: a fresh cache fills from the start of its storage.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::Allocate() {
  if (free_.empty()) return -1;
  const int32_t block = free_.back();
  free_.pop_back();
  ref_counts_[block] = 1;
  return block;
}

void BlockAllocator::AddRef(int32_t block) {
  assert(ref_counts_[block] > 0);
  ++ref_counts_[block];
}

void BlockAllocator::Release(int32_t block) {
  assert(ref_counts_[block] > 0);
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape),
      data_(shape.num_layers * shape.num_blocks * 2 * shape.block_size * shape.kv_heads *
            shape.head_dim),
      allocator_(static_cast<int32_t>(shape.num_blocks)) {}

KvCache::KvCache(const KvCacheShape& shape, void* storage, DType dtype,
                 std::function<void(void*)> deleter)
    : shape_(shape),
      dtype_(dtype),
      external_storage_(true),
      external_(storage, std::move(deleter)),
      allocator_(static_cast<int32_t>(shape.num_blocks)) {}

absl::Status KvCache::Reserve(BlockTable* table, int64_t tokens) {
  const int64_t needed = (tokens + shape_.block_size - 1) / shape_.block_size;
  const int64_t missing = needed - static_cast<int64_t>(table->size());
  if (missing <= 0) return absl::OkStatus();
  if (missing > allocator_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: ", tokens, " tokens need ", missing,
                                                     " more blocks, ", allocator_.num_free(),
                                                     " free of ", allocator_.num_blocks()));
  }
  for (int64_t i = 0; i < missing; ++i) table->push_back(allocator_.Allocate());
  return absl::OkStatus();
}

void KvCache::Free(BlockTable* table) {
  for (int32_t block : *table) allocator_.Release(block);
  table->clear();
}

}  // namespace glm
