#include "core/model/rope_freq.h"

#include <cmath>

namespace glmserve {

std::vector<float> RopeInvFreq(int64_t rotary_dim, double theta) {
  std::vector<float> inv_freq(rotary_dim / 2);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(exponent)));
  }
  return inv_freq;
}

}  // namespace glmserve
