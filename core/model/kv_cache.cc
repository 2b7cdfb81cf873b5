#include "core/model/kv_cache.h"

#include <unistd.h>

#include <cassert>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {

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

absl::StatusOr<KvCacheDType> ParseKvCacheDType(absl::string_view name) {
  for (KvCacheDType dtype :
       {KvCacheDType::kAuto, KvCacheDType::kFp32, KvCacheDType::kBf16, KvCacheDType::kFp8E4M3}) {
    if (name == KvCacheDTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_cache_dtype '", name, "' is not one of auto, fp32, bf16, fp8_e4m3"));
}

const char* KvCacheDTypeName(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kFp8E4M3:
      return "fp8_e4m3";
    case KvCacheDType::kBf16:
      return "bf16";
    case KvCacheDType::kFp32:
      return "fp32";
    case KvCacheDType::kAuto:
      break;
  }
  return "auto";
}

KvCacheDType KvCacheDTypeOf(DType dtype) {
  return dtype == DType::kF8E4M3 ? KvCacheDType::kFp8E4M3
         : dtype == DType::kBF16 ? KvCacheDType::kBf16
                                 : KvCacheDType::kFp32;
}

absl::StatusOr<int64_t> KvCacheBytes(const KvCacheShape& shape, int64_t element_bytes) {
  const std::pair<const char*, int64_t> dims[] = {
      {"layers", shape.num_layers}, {"KV heads", shape.kv_heads},
      {"head dim", shape.head_dim}, {"block size", shape.block_size},
      {"blocks", shape.num_blocks}, {"element bytes", element_bytes}};
  for (const auto& [name, value] : dims) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache: ", name, " must be > 0, got ", value));
    }
  }
  if (shape.num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", shape.num_blocks, " blocks exceed the 2^31-1 block ids"));
  }
  // Keys and values (or the latent row); element_bytes is checked too: a hostile element size
  // must not wrap before the loop.
  int64_t bytes = shape.kinds();
  for (int64_t d : {element_bytes, shape.num_layers, shape.kv_heads, shape.head_dim,
                    shape.block_size, shape.num_blocks}) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache: ", shape.num_blocks, " blocks of ", shape.block_size,
                       " tokens over ", shape.num_layers, " layers overflow a 64-bit byte count"));
    }
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CreateHost(const KvCacheShape& shape) {
  if ((shape.fp8 || shape.bf16) && shape.latent) {
    return absl::InvalidArgumentError(absl::StrCat("a host ", shape.fp8 ? "FP8" : "bf16",
                                                   " KV cache holds GQA keys and values only"));
  }
  if (shape.fp8 && shape.bf16) {
    return absl::InvalidArgumentError("a KV cache is FP8 or bf16, not both");
  }
  // FP8: a code per value plus a 4-byte scale per head_dim values.
  ASSIGN_OR_RETURN(int64_t bytes, KvCacheBytes(shape, shape.fp8    ? 1
                                                      : shape.bf16 ? 2
                                                                   : sizeof(float)));
  if (shape.fp8) bytes += bytes / shape.head_dim * 4;
  // Refuse what cannot fit in RAM at all: the zero-filled storage is touched at once, so an
  // allocation the kernel overcommits would end in the OOM killer rather than an error.
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0 && bytes / page_size >= pages) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", shape.num_blocks * shape.block_size, " tokens needs ", bytes,
                     " bytes, more than this machine's ", static_cast<int64_t>(pages) * page_size,
                     " bytes of memory; lower --kv_capacity_tokens"));
  }
  try {
    return std::make_unique<KvCache>(shape);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV cache of ", bytes, " bytes"));
  }
}

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape),
      dtype_(shape.fp8    ? DType::kF8E4M3
             : shape.bf16 ? DType::kBF16
                          : DType::kF32),
      data_(shape.fp8 || shape.bf16 ? 0 : num_elements()),
      codes_(shape.fp8 ? num_elements() : 0),
      scales_(shape.fp8 ? num_elements() / shape.head_dim : 0),
      bf16_(shape.bf16 ? num_elements() : 0),
      allocator_(static_cast<int32_t>(shape.num_blocks)) {}

KvCache::KvCache(const KvCacheShape& shape, void* storage, DType dtype,
                 std::function<void(void*)> deleter)
    : shape_(shape),
      dtype_(dtype),
      external_storage_(true),
      external_(storage, std::move(deleter)),
      allocator_(static_cast<int32_t>(shape.num_blocks)) {}

absl::Status KvCache::Reserve(BlockTable* table, int64_t tokens) {
  // Rounded up without `tokens + block_size - 1`, which wraps for tokens near 2^63 (and a
  // wrapped, negative count would "succeed" without reserving anything).
  const int64_t needed = tokens / shape_.block_size + (tokens % shape_.block_size > 0 ? 1 : 0);
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

}  // namespace glmserve
