#include "core/ops/norm.h"

#include <algorithm>
#include <cmath>

#include "core/ops/row_math.h"
#include "core/parallel.h"

namespace glmserve {
namespace {

// Sum of n values in 8 interleaved partial sums combined by a fixed tree: one order for
// every call, vectorisable.
template <typename F>
float LaneSum(int64_t n, F value) {
  float part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += value(i + j);
  for (int j = 0; i + j < n; ++j) part[j] += value(i + j);
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

}  // namespace

void RmsNorm(const float* x, const float* gain, int64_t rows, int64_t width, float eps, float* y) {
  // Rows in chunks of ~32K elements: small calls stay on the calling thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, width));
  ParallelFor(rows, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const float* xr = x + r * width;
      float* yr = y + r * width;
      // fp32 squares summed in 8 interleaved partial sums: a fixed order, vectorisable.
      float part[8] = {};
      int64_t i = 0;
      for (; i + 8 <= width; i += 8)
        for (int j = 0; j < 8; ++j) part[j] += xr[i + j] * xr[i + j];
      for (int j = 0; i + j < width; ++j) part[j] += xr[i + j] * xr[i + j];
      const float sum =
          ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
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
          LaneSum(width, [&](int64_t i) { return xr[i]; }) / static_cast<float>(width);
      const float var = LaneSum(width,
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
