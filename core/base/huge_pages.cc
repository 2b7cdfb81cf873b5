#include "core/base/huge_pages.h"

#include <sys/mman.h>

#include <cstring>

namespace glmserve {
namespace {
constexpr std::align_val_t kAlign{64};
}  // namespace

void* AllocateHugePageable(std::size_t bytes) {
  if (bytes >= kHugePageThreshold) {
    // Anonymous mappings are zero-filled and page-aligned; the advice comes before the first
    // touch, so the pages fault in as huge pages.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    ::madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where THP is off
    return p;
  }
  void* p = ::operator new(bytes == 0 ? 1 : bytes, kAlign, std::nothrow);
  if (p != nullptr) std::memset(p, 0, bytes);
  return p;
}

void FreeHugePageable(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= kHugePageThreshold) {
    ::munmap(p, bytes);
  } else {
    ::operator delete(p, kAlign);
  }
}

}  // namespace glmserve
