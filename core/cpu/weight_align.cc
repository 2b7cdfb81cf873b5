#include "core/cpu/weight_align.h"

#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"

namespace glmserve {

int64_t AlignLinearMatrices(ModelWeights* weights) {
  std::vector<Matrix*> moved;
  std::vector<int64_t> offsets = {0};  // moved[i] goes to offsets[i]; the last is the total
  for (Matrix* m : weights->LinearMatrices()) {
    if (m->format != WeightFormat::kDense) continue;
    if (reinterpret_cast<uintptr_t>(m->data) % kCacheLine == 0) continue;
    moved.push_back(m);
    offsets.push_back(offsets.back() + (m->bytes() + kCacheLine - 1) / kCacheLine * kCacheLine);
  }
  if (moved.empty()) return 0;
  const int64_t total = offsets.back();
  constexpr std::align_val_t kAlign{kCacheLine};
  void* raw = ::operator new(static_cast<size_t>(total), kAlign, std::nothrow);
  if (raw == nullptr) return 0;
  std::shared_ptr<char> buffer(static_cast<char*>(raw), [](char* p) {
    ::operator delete (p, std::align_val_t{kCacheLine});
  });
  // One matrix per task: the copy streams the checkpoint's pages in on both threads.
  ParallelFor(static_cast<int64_t>(moved.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(buffer.get() + offsets[i], moved[i]->data, moved[i]->bytes());
    }
  });
  for (size_t i = 0; i < moved.size(); ++i) moved[i]->data = buffer.get() + offsets[i];
  weights->storage.push_back(std::move(buffer));
  return total;
}

}  // namespace glmserve
