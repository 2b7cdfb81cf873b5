#include "core/model/kv_fp8.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>

#include "core/base/dtype.h"

namespace glmserve {

void EncodeKvRow(const float* x, int64_t heads, int64_t head_dim, uint8_t* codes, float* scales) {
  constexpr float kE4m3Max = 448.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* row = x + h * head_dim;  // [head_dim]
    float amax = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) {
      if (std::isfinite(row[d])) amax = std::max(amax, std::fabs(row[d]));
    }
    // FLT_MIN keeps x / scale finite for a head of tiny (subnormal fp32) values.
    const float scale = amax > 0.f ? std::max(amax / kE4m3Max, FLT_MIN) : 1.0f;
    scales[h] = scale;
    uint8_t* out = codes + h * head_dim;  // [head_dim]
    for (int64_t d = 0; d < head_dim; ++d) out[d] = FloatToE4m3(row[d] / scale);
  }
}

void DecodeKvHead(const uint8_t* codes, float scale, int64_t head_dim, float* out) {
  // Attention decodes every attended row for every query head: a 256-entry table of
  // E4m3ToFloat's values (the same values, so the same products) instead of its branches.
  static const std::array<float, 256> kValues = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = E4m3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  for (int64_t d = 0; d < head_dim; ++d) out[d] = kValues[codes[d]] * scale;
}

}  // namespace glmserve
