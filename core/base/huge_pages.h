// Large host buffers on transparent huge pages, for memory that kernels stream through: the
// weights, and the KV cache, whose attention reads each position's head slice (512 bytes on
// GLM-4.5 Air) a whole cache row (4 KiB) from the next, so with 4 KiB pages every position
// read was a TLB miss besides the cache miss.
#pragma once

#include <cstddef>
#include <new>

namespace glmserve {

// At or above this size a buffer is its own anonymous mapping marked MADV_HUGEPAGE (2 MiB
// pages where the kernel's THP setting is "madvise" or "always"; advisory, so a no-op where
// it is "never"). Smaller ones come from the heap.
inline constexpr std::size_t kHugePageThreshold = std::size_t{32} << 20;

// A zero-filled, 64-byte aligned buffer of `bytes`; nullptr when it cannot be had. Free it
// with FreeHugePageable and the same size.
void* AllocateHugePageable(std::size_t bytes);
void FreeHugePageable(void* p, std::size_t bytes);

// For std::vector storage (KvCache's arrays). Throws std::bad_alloc like the default allocator.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    void* p = AllocateHugePageable(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) { FreeHugePageable(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

}  // namespace glmserve
