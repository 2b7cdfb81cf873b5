// The fixed-order dot product the attention kernels share.
#pragma once

#include <cstdint>

namespace glmserve {

// a . b with 8 independent partial sums (lane j takes d = j, j + 8, ...) combined by a fixed
// tree: vectorisable without reassociation, and the same order for every call.
inline float LaneDot(const float* a, const float* b, int64_t n) {
  float lane[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[d + j] * b[d + j];
  }
  for (int j = 0; d + j < n; ++j) lane[j] += a[d + j] * b[d + j];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace glmserve
