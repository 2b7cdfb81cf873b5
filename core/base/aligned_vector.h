// std::vector storage on 64-byte (cache-line) boundaries.
//
// Why: an AMX tile load reads 16 rows of 64 bytes; a row that straddles two cache lines costs
// two L1 accesses, and on the Xeons measured (docs/performance.md) a misaligned operand made
// the whole tile loop ~3x slower. malloc only promises 16 bytes, so buffers that kernels read
// as tiles or full vectors (packed activations, padded weight rows) use this allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace glmserve {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{kCacheLine}); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// A reused arena sized to at least n elements, never shrunk: its users write every element they
// read, and a resize back up after a smaller call (a decode step after a prompt) would zero-fill
// the regrown part again. Returns its data.
template <typename T>
T* GrowTo(AlignedVector<T>* arena, int64_t n) {
  if (static_cast<int64_t>(arena->size()) < n) arena->resize(n);
  return arena->data();
}

}  // namespace glmserve
