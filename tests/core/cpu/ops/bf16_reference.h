// Test helpers shared by the bf16-activation linear tests (kBf16 and kBf16Amx): both modes
// round the activations to bf16 and multiply bf16 weights, and differ only in their fp32
// summation order, so one float64 reference serves both.
#pragma once

#include <cstdint>
#include <vector>

#include "core/base/dtype.h"

namespace glmserve::testing {

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

// float64 y = round_bf16(x) W^T + b, for x [m, k], W [n, k] in bf16, b [n] or nullptr.
inline std::vector<float> Bf16ActivationReference(const std::vector<float>& x, int64_t m,
                                                  const std::vector<uint16_t>& w, int64_t n,
                                                  int64_t k, const float* bias) {
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias ? bias[j] : 0.0;
      for (int64_t c = 0; c < k; ++c) {
        acc +=
            static_cast<double>(Bf16ToFloat(FloatToBf16(x[i * k + c]))) * Bf16ToFloat(w[j * k + c]);
      }
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

}  // namespace glmserve::testing
