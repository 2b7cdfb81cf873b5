// The attention softmax of the CPU ops (GLM-4.5's attention and GLM-5's MLA), written once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace glmserve {

// scores[0, n) -> probabilities in place: exp(s - max) / sum, the sum taken in index order
// (one fixed order, like every reduction here). n >= 1.
inline void SoftmaxInPlace(float* scores, int64_t n) {
  float max_score = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_score = std::max(max_score, scores[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    scores[i] = std::exp(scores[i] - max_score);
    sum += scores[i];
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) scores[i] *= inv_sum;
}

}  // namespace glmserve
