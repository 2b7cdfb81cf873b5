// The paged KV cache: fixed-size blocks of token slots, handed out by a reference-counted
// block allocator, addressed per sequence through a block table.
//
// A block id names the same slot range in every layer (as in vLLM), so one block table
// serves the whole layer span. Keys and values are stored in fp32 on the CPU backend where
// its attention reads them in fp32, so the cache adds no rounding to the exact path, and in
// bf16 where its attention rounds them to bf16 anyway (or FP8, on request). Another backend
// (CUDA) can hand the cache storage it owns (device memory, bf16): the layout and the block
// bookkeeping stay the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/dtype.h"
#include "core/base/huge_pages.h"

namespace glmserve {

// Free list plus reference counts. Blocks shared by several sequences (a common prompt
// prefix) carry one reference per holder and return to the free list at zero.
class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  // A free block with reference count 1, or -1 when none is left.
  int32_t Allocate();
  void AddRef(int32_t block);
  // Drops one reference; the block is free again when none remain.
  void Release(int32_t block);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  std::vector<int32_t> free_;        // stack of free block ids
};

// A sequence's blocks in position order: token p lives in block table[p / block_size] at
// slot p % block_size.
using BlockTable = std::vector<int32_t>;

// Blocks that hold `positions` positions (the one rounding rule of the paged cache).
inline int64_t BlocksFor(int64_t positions, int64_t block_size) {
  return (positions + block_size - 1) / block_size;
}

// The KV cache's element format (EngineOptions::kv_cache_dtype, --kv_cache_dtype; the values
// travel as integers to remote ranks, so new ones go at the end). kAuto: the backend's choice
// (the GPU: bf16; the CPU: bf16 where its attention rounds K and V to bf16 anyway, so that the
// cache changes no bit, fp32 elsewhere: CpuModel::SetKvCacheDType). kFp32 (CPU only) and kBf16:
// those elements (GLM-4.5 K/V only on the CPU); kFp8E4M3: e4m3 with a scale per token and KV
// head (core/model/kv_fp8.h; CPU and CUDA backends, GLM-4.5 K/V only). docs/kv_cache.md.
enum class KvCacheDType : uint8_t { kAuto, kFp8E4M3, kBf16, kFp32 };
// "auto", "fp32", "bf16" or "fp8_e4m3"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<KvCacheDType> ParseKvCacheDType(absl::string_view name);
const char* KvCacheDTypeName(KvCacheDType dtype);
// The format of a cache holding `dtype` elements: kFp8E4M3, kBf16 or kFp32 (never kAuto).
KvCacheDType KvCacheDTypeOf(DType dtype);

struct KvCacheShape {
  int64_t num_layers = 0;  // layers of the served span
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // token slots per block
  int64_t num_blocks = 0;
  // The MLA (GLM-5) layout: ONE row of kv_heads * head_dim values per token slot and layer
  // (kv_heads 1, head_dim the row width: the normed latent, the rotary key and the DSA
  // indexer key; core/cpu/ops/mla.h), no separate values. False: the GQA key and value rows.
  bool latent = false;
  // E4m3 codes (one byte per value) plus one fp32 scale per token slot, kind and KV head
  // (core/model/kv_fp8.h) instead of fp32 values: host arrays on the CPU, one device allocation
  // (codes, then scales) on the GPU (core/cuda/model.h). GQA layout only (not `latent`).
  bool fp8 = false;
  // bf16 values (FloatToBf16 of what is written) instead of fp32 on the CPU, half the bytes. GQA
  // layout only; at most one of fp8 and bf16.
  bool bf16 = false;

  // Rows per token slot and layer: 2 (keys, values) or 1 (the latent row).
  int64_t kinds() const { return latent ? 1 : 2; }
};

// Bytes of K and V storage of `shape` at `element_bytes` per value, checked: INVALID_ARGUMENT
// when a dimension is not positive, there are more blocks than block ids (int32), or the
// product overflows (so a hostile --block_size or --kv_capacity_tokens is an error, never
// a wrapped size).
absl::StatusOr<int64_t> KvCacheBytes(const KvCacheShape& shape, int64_t element_bytes);

class KvCache {
 public:
  // Host fp32 storage, owned by the cache. RESOURCE_EXHAUSTED when it cannot be allocated
  // (larger than the machine's memory, or the allocation fails); INVALID_ARGUMENT for a
  // shape KvCacheBytes refuses.
  static absl::StatusOr<std::unique_ptr<KvCache>> CreateHost(const KvCacheShape& shape);
  explicit KvCache(const KvCacheShape& shape);
  // Storage owned elsewhere (e.g. GPU memory): `storage` holds num_elements() values of
  // `dtype` in the same layout as the host cache and is released with `deleter` when the
  // last copy of this cache goes (copies share it). Its backend addresses it through
  // storage() and ElementOffset(); keys() / values() return nullptr on it.
  KvCache(const KvCacheShape& shape, void* storage, DType dtype,
          std::function<void(void*)> deleter);

  const KvCacheShape& shape() const { return shape_; }
  int64_t kv_dim() const { return shape_.kv_heads * shape_.head_dim; }
  int64_t capacity_tokens() const { return shape_.num_blocks * shape_.block_size; }
  // Bytes of K and V storage per token across the span's layers (an FP8 cache: the codes
  // and the per-head scales).
  int64_t bytes_per_token() const {
    if (shape_.fp8) {
      return shape_.kinds() * shape_.num_layers * (kv_dim() + shape_.kv_heads * 4);
    }
    return shape_.kinds() * shape_.num_layers * kv_dim() * DTypeSize(dtype_);
  }

  // True for the plain constructor's host fp32 storage (the CPU backend's cache).
  bool host_fp32() const { return !external_storage_ && !shape_.fp8 && !shape_.bf16; }
  // True for the plain constructor's host FP8 storage (shape().fp8).
  bool host_fp8() const { return !external_storage_ && shape_.fp8; }
  // True for the plain constructor's host bf16 storage (shape().bf16).
  bool host_bf16() const { return !external_storage_ && shape_.bf16; }
  DType dtype() const { return dtype_; }
  // Elements of K and V storage: [num_layers, num_blocks, kinds (k, v), block_size, kv_dim].
  int64_t num_elements() const {
    return shape_.num_layers * shape_.num_blocks * shape_.kinds() * shape_.block_size * kv_dim();
  }
  // The start of the storage (host or device memory, of dtype()).
  void* storage() {
    return external_storage_ ? external_.get()
           : shape_.fp8      ? static_cast<void*>(codes_.data())
           : shape_.bf16     ? static_cast<void*>(bf16_.data())
                             : static_cast<void*>(data_.data());
  }
  const void* storage() const { return const_cast<KvCache*>(this)->storage(); }
  // Element offset of the key (kind 0) or value (kind 1) rows of `block` in `layer`.
  int64_t ElementOffset(int64_t layer, int32_t block, int kind) const {
    return Offset(layer, block, kind);
  }

  // Key / value rows of one block in one layer: [block_size, kv_heads * head_dim]. Host fp32
  // caches only: on storage owned elsewhere (a device cache) they return nullptr, never an
  // address into memory this cache does not hold. A latent cache has only the key rows (its
  // latent rows); values() must not be used on it.
  float* keys(int64_t layer, int32_t block) { return HostRows(layer, block, 0); }
  float* values(int64_t layer, int32_t block) { return HostRows(layer, block, 1); }
  // A host FP8 cache's rows of one block in one layer, kind 0 (keys) or 1 (values): codes
  // [block_size, kv_heads * head_dim] and scales [block_size, kv_heads]; nullptr otherwise.
  uint8_t* codes(int64_t layer, int32_t block, int kind) {
    return host_fp8() ? codes_.data() + Offset(layer, block, kind) : nullptr;
  }
  const uint8_t* codes(int64_t layer, int32_t block, int kind) const {
    return const_cast<KvCache*>(this)->codes(layer, block, kind);
  }
  float* scales(int64_t layer, int32_t block, int kind) {
    return host_fp8() ? scales_.data() + Offset(layer, block, kind) / shape_.head_dim : nullptr;
  }
  const float* scales(int64_t layer, int32_t block, int kind) const {
    return const_cast<KvCache*>(this)->scales(layer, block, kind);
  }
  // A host bf16 cache's rows of one block in one layer, kind 0 (keys) or 1 (values):
  // [block_size, kv_heads * head_dim] bf16 bits; nullptr otherwise.
  uint16_t* bf16_rows(int64_t layer, int32_t block, int kind) {
    return host_bf16() ? bf16_.data() + Offset(layer, block, kind) : nullptr;
  }
  const uint16_t* bf16_rows(int64_t layer, int32_t block, int kind) const {
    return const_cast<KvCache*>(this)->bf16_rows(layer, block, kind);
  }
  const float* keys(int64_t layer, int32_t block) const {
    return const_cast<KvCache*>(this)->HostRows(layer, block, 0);
  }
  const float* values(int64_t layer, int32_t block) const {
    return const_cast<KvCache*>(this)->HostRows(layer, block, 1);
  }

  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // A tensor-parallel group's cache (core/model/rank_group.h): the engine holds rank 0's cache
  // and allocates blocks from it; rank 0's cache owns the other ranks' caches (the same blocks
  // and block size, each rank's own KV heads), which use the same block ids.
  void AdoptRankCaches(std::vector<std::unique_ptr<KvCache>> caches) {
    rank_caches_ = std::make_shared<std::vector<std::unique_ptr<KvCache>>>(std::move(caches));
  }
  int num_ranks() const { return rank_caches_ ? static_cast<int>(rank_caches_->size()) + 1 : 1; }
  // Rank r's cache (rank 0: this one).
  KvCache* rank_cache(int rank) { return rank == 0 ? this : (*rank_caches_)[rank - 1].get(); }
  // Bytes per token over every rank's cache.
  int64_t group_bytes_per_token() const {
    int64_t total = bytes_per_token();
    if (rank_caches_) {
      for (const auto& c : *rank_caches_) total += c->bytes_per_token();
    }
    return total;
  }

  // Grows `table` with fresh blocks until it covers `tokens` positions. All or nothing: on
  // RESOURCE_EXHAUSTED the table and the allocator are as they were.
  absl::Status Reserve(BlockTable* table, int64_t tokens);
  // Releases every block of the table and clears it.
  void Free(BlockTable* table);

 private:
  float* HostRows(int64_t layer, int32_t block, int kind) {
    return host_fp32() ? data_.data() + Offset(layer, block, kind) : nullptr;
  }
  int64_t Offset(int64_t layer, int32_t block, int kind) const {
    return ((layer * shape_.num_blocks + block) * shape_.kinds() + kind) * shape_.block_size *
           kv_dim();
  }

  KvCacheShape shape_;
  DType dtype_ = DType::kF32;
  // On huge pages (core/base/huge_pages.h): attention reads a head's slice of each position a
  // whole cache row from the next, one 4 KiB page per position when the pages are small.
  std::vector<float, HugePageAllocator<float>> data_;  // [num_layers, num_blocks, kinds,
                                                       //  block_size, kv_dim]
  // FP8 (shape_.fp8) instead of data_: the codes and the per-head scales.
  std::vector<uint8_t, HugePageAllocator<uint8_t>> codes_;  // [.., block_size, kv_dim]
  std::vector<float, HugePageAllocator<float>> scales_;     // [.., block_size, kv_heads]
  // bf16 (shape_.bf16) instead of data_, in its layout.
  std::vector<uint16_t, HugePageAllocator<uint16_t>> bf16_;  // [.., block_size, kv_dim]
  bool external_storage_ = false;
  std::shared_ptr<void> external_;  // used instead of data_ for storage owned elsewhere
  BlockAllocator allocator_;
  std::shared_ptr<std::vector<std::unique_ptr<KvCache>>> rank_caches_;  // ranks 1..N-1
};

}  // namespace glmserve
