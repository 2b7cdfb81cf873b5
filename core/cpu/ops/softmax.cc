#include "core/cpu/ops/softmax.h"

#include "core/cpu/ops/bf16_math.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax_row.h"

namespace glmserve {
namespace internal {

void SoftmaxGeneric(float* scores, int64_t n) { SoftmaxRow(scores, n); }
float SoftmaxExpGeneric(float* scores, int64_t n) { return SoftmaxExpRow(scores, n); }

float SoftmaxExpPairsGeneric(float* scores, int64_t n, uint32_t* pairs) {
  const float sum = SoftmaxExpRow(scores, n);
  for (int64_t j = 0; 2 * j < n; ++j) {
    pairs[j] = Bf16Pair(scores[2 * j], 2 * j + 1 < n ? scores[2 * j + 1] : 0.f);
  }
  return sum;
}

}  // namespace internal

void SoftmaxInPlace(float* scores, int64_t n) {
  // Each probe is a cached flag and an atomic load (ForceGenericKernels is honoured).
  if (internal::CpuHasAvx512()) return internal::SoftmaxAvx512(scores, n);
  if (internal::CpuHasAvx2Fma()) return internal::SoftmaxAvx2(scores, n);
  internal::SoftmaxGeneric(scores, n);
}

float SoftmaxExpToBf16Pairs(float* scores, int64_t n, uint32_t* pairs) {
  if (internal::CpuHasAvx512()) return internal::SoftmaxExpPairsAvx512(scores, n, pairs);
  return internal::SoftmaxExpPairsGeneric(scores, n, pairs);
}

float SoftmaxExpInPlace(float* scores, int64_t n) {
  if (internal::CpuHasAvx512()) return internal::SoftmaxExpAvx512(scores, n);
  if (internal::CpuHasAvx2Fma()) return internal::SoftmaxExpAvx2(scores, n);
  return internal::SoftmaxExpGeneric(scores, n);
}

}  // namespace glmserve
