#include "core/cpu/ops/softmax.h"

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax_row.h"

namespace glmserve {
namespace internal {

void SoftmaxGeneric(float* scores, int64_t n) { SoftmaxRow(scores, n); }

}  // namespace internal

void SoftmaxInPlace(float* scores, int64_t n) {
  // Both probes are a cached flag and an atomic load (ForceGenericKernels is honoured).
  // (AVX-512 CPUs take the AVX2 code too: the order has 8 lanes.)
  if (internal::CpuHasAvx2Fma()) return internal::SoftmaxAvx2(scores, n);
  internal::SoftmaxGeneric(scores, n);
}

}  // namespace glmserve
