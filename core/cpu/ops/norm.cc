#include "core/cpu/ops/norm.h"

#include <algorithm>
#include <cmath>

#include "core/base/parallel.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/model/row_math.h"

namespace glmserve {

void RmsNorm(const float* x, const float* gain, int64_t rows, int64_t width, float eps, float* y) {
  // Rows in chunks of ~32K elements: small calls stay on the calling thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, width));
  ParallelFor(rows, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const float* xr = x + r * width;
      float* yr = y + r * width;
      const float sum = LaneDot(xr, xr, width);  // fp32 squares in the fixed lane order
      const float inv = rowmath::RmsInvScale(sum, width, eps);
      for (int64_t c = 0; c < width; ++c) yr[c] = gain[c] * (xr[c] * inv);
    }
  });
}

void LayerNorm(const float* x, const float* gain, const float* bias, int64_t rows, int64_t width,
               float eps, float* y) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, width));
  ParallelFor(rows, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const float* xr = x + r * width;
      float* yr = y + r * width;
      const float mean =
          LaneSum<8>(width, [&](int64_t i) { return xr[i]; }) / static_cast<float>(width);
      const float var = LaneSum<8>(width,
                                   [&](int64_t i) {
                                     const float d = xr[i] - mean;
                                     return d * d;
                                   }) /
                        static_cast<float>(width);
      const float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t c = 0; c < width; ++c) yr[c] = (xr[c] - mean) * inv * gain[c] + bias[c];
    }
  });
}

}  // namespace glmserve
