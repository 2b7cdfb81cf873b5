// The portable kBf16 kernel: an exact emulation of the AVX512_BF16 one (linear_avx512bf16.cc)
// for CPUs without vdpbf16ps, bit for bit (tests/core/cpu/ops/linear_bf16_test.cc checks this on
// machines that have both), and the reference that documents the arithmetic.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/cpu/ops/bf16_math.h"
#include "core/cpu/ops/linear.h"

namespace glmserve::internal {
namespace {

// One element: 16 fp32 lanes; per 32-wide step s, lane j adds x[k+1] w[k+1] and then x[k] w[k]
// for k = 32 s + 2 j, each an FMA with one rounding (as the instruction's definition
// specifies), past-the-end elements reading as +0 (the masked load's zeros); then the lane
// tree (j, j+8), (j, j+4), (j, j+2), (j, j+1).
float DotBf16(const uint16_t* x, const uint16_t* w, int64_t k_total) {
  float lane[16] = {};
  for (int64_t k0 = 0; k0 < k_total; k0 += 32) {
    for (int j = 0; j < 16; ++j) {
      const int64_t k = k0 + 2 * j;
      const uint16_t x0 = k < k_total ? x[k] : 0, w0 = k < k_total ? w[k] : 0;
      const uint16_t x1 = k + 1 < k_total ? x[k + 1] : 0, w1 = k + 1 < k_total ? w[k + 1] : 0;
      lane[j] = Ftz(std::fma(DazBf16(x1), DazBf16(w1), lane[j]));
      lane[j] = Ftz(std::fma(DazBf16(x0), DazBf16(w0), lane[j]));
    }
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

}  // namespace

void Bf16BlockGeneric(const Bf16Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  for (int64_t i = 0; i < job.m; ++i) {
    for (int64_t n = n0; n < n0 + nn; ++n) {
      const uint16_t* x = job.xb + i * k_total;
      float v = DotBf16(x, static_cast<const uint16_t*>(w.data) + n * k_total, k_total);
      if (job.bias != nullptr) v += job.bias[n];
      job.y[i * n_rows + n] = v;
    }
  }
}

}  // namespace glmserve::internal
