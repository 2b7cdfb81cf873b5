#include "core/cpu/ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace glmserve {
namespace {

// float64 NeoX partial rotation of one head vector.
std::vector<double> Rotate(const float* v, int64_t head_dim, int64_t rot, double theta, int pos) {
  std::vector<double> out(v, v + head_dim);
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = pos * std::pow(theta, -2.0 * i / rot);
    out[i] = v[i] * std::cos(angle) - v[i + half] * std::sin(angle);
    out[i + half] = v[i + half] * std::cos(angle) + v[i] * std::sin(angle);
  }
  return out;
}

TEST(RopeTest, PartialAndFullRotaryMatchReference) {
  const int64_t head_dim = 16, heads = 3, tokens = 4;
  for (int64_t rot : {2, 8, 16}) {
    RotaryEmbedding rope(head_dim, rot, 10000.0);
    std::vector<float> x = testing::RandomVector(tokens * heads * head_dim, 11);
    std::vector<float> y = x;
    const int32_t positions[] = {0, 1, 7, 300};
    rope.Apply(y.data(), tokens, heads, positions);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = x.data() + (t * heads + h) * head_dim;
        std::vector<double> ref = Rotate(in, head_dim, rot, 10000.0, positions[t]);
        for (int64_t d = 0; d < head_dim; ++d) {
          EXPECT_NEAR(y[(t * heads + h) * head_dim + d], ref[d], 1e-4)
              << "rot " << rot << " t " << t << " d " << d;
        }
        // Channels past the rotary width pass through untouched.
        for (int64_t d = rot; d < head_dim; ++d) {
          EXPECT_EQ(y[(t * heads + h) * head_dim + d], in[d]);
        }
      }
    }
  }
}

TEST(RopeTest, PositionZeroIsIdentity) {
  RotaryEmbedding rope(8, 4, 1e6);
  std::vector<float> x = testing::RandomVector(8, 2);
  std::vector<float> y = x;
  const int32_t pos = 0;
  rope.Apply(y.data(), 1, 1, &pos);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace glmserve
