#include "core/cpu/ops/softmax.h"

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax_row.h"

namespace glmserve {
namespace internal {

void SoftmaxGeneric(float* scores, int64_t n) { SoftmaxRow(scores, n); }
float SoftmaxExpGeneric(float* scores, int64_t n) { return SoftmaxExpRow(scores, n); }

}  // namespace internal

void SoftmaxInPlace(float* scores, int64_t n) {
  // Each probe is a cached flag and an atomic load (ForceGenericKernels is honoured).
  if (internal::CpuHasAvx512()) return internal::SoftmaxAvx512(scores, n);
  if (internal::CpuHasAvx2Fma()) return internal::SoftmaxAvx2(scores, n);
  internal::SoftmaxGeneric(scores, n);
}

float SoftmaxExpInPlace(float* scores, int64_t n) {
  if (internal::CpuHasAvx512()) return internal::SoftmaxExpAvx512(scores, n);
  if (internal::CpuHasAvx2Fma()) return internal::SoftmaxExpAvx2(scores, n);
  return internal::SoftmaxExpGeneric(scores, n);
}

}  // namespace glmserve
