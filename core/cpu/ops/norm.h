// Row norms: RMSNorm, y = gain * (x * rsqrt(mean(x^2) + eps)), and LayerNorm, both reduced in
// fp32 over each row in a fixed order.
#pragma once

#include <cstdint>

namespace glmserve {

// x, y: [rows, width] (y may alias x); gain: [width].
void RmsNorm(const float* x, const float* gain, int64_t rows, int64_t width, float eps, float* y);

// LayerNorm (torch.nn.LayerNorm): y = (x - mean) / sqrt(var + eps) * gain + bias, with the
// biased variance mean((x - mean)^2), both reduced in fp32 over each row. x, y: [rows, width]
// (y may alias x); gain, bias: [width].
void LayerNorm(const float* x, const float* gain, const float* bias, int64_t rows, int64_t width,
               float eps, float* y);

}  // namespace glmserve
