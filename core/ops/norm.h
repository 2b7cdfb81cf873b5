// RMSNorm: y = gain * (x * rsqrt(mean(x^2) + eps)), reduced in fp32 over each row.
#pragma once

#include <cstdint>

namespace glmserve {

// x, y: [rows, width] (y may alias x); gain: [width].
void RmsNorm(const float* x, const float* gain, int64_t rows, int64_t width, float eps, float* y);

}  // namespace glmserve
