// The fixed-order reductions of the CPU ops, written once. Every sum over a row (a dot
// product, a norm's sum of squares, a mean) uses kLanes interleaved partial sums (lane j
// takes i = j, j + kLanes, ...) combined by one halving tree (lane j += lane j + width for
// width = kLanes/2, ..., 1). The order depends only on n, never on the batch, the thread or
// the call site, which is what makes results bit-identical however a step is batched; and the
// lanes map onto SIMD registers, so the compiler vectorises without reassociating (the build
// also forbids FMA contraction: -ffp-contract=off).
//
// The 16-lane form is the exact fp32 linear's reference order (its AVX-512 kernel computes
// the same sums, one lane per vector element); the 8-lane form serves norms and attention.
#pragma once

#include <cstdint>

namespace glmserve {

template <int kLanes, typename F>
inline float LaneSum(int64_t n, F value) {
  static_assert(kLanes >= 1 && (kLanes & (kLanes - 1)) == 0, "kLanes: a power of two");
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] += value(i + j);
  }
  for (int j = 0; i + j < n; ++j) lane[j] += value(i + j);
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

// a . b in the LaneSum order.
template <int kLanes = 8>
inline float LaneDot(const float* a, const float* b, int64_t n) {
  return LaneSum<kLanes>(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

}  // namespace glmserve
