#include "core/cpu/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace glmserve {
namespace {

TEST(RmsNormTest, MatchesFloat64Reference) {
  for (int64_t width : {1, 7, 16, 64, 129}) {
    const int64_t rows = 5;
    std::vector<float> x = testing::RandomVector(rows * width, 3, 2.0f);
    std::vector<float> gain = testing::RandomVector(width, 4);
    const float eps = 1e-5f;
    std::vector<float> y(rows * width, NAN);
    RmsNorm(x.data(), gain.data(), rows, width, eps, y.data());
    std::vector<float> ref(rows * width);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < width; ++c) ss += double(x[r * width + c]) * x[r * width + c];
      const double inv = 1.0 / std::sqrt(ss / width + eps);
      for (int64_t c = 0; c < width; ++c) ref[r * width + c] = gain[c] * x[r * width + c] * inv;
    }
    EXPECT_LT(testing::RelativeError(y, ref), 1e-6) << "width " << width;
  }
}

TEST(RmsNormTest, InPlaceAndZeroRow) {
  std::vector<float> x = {0.f, 0.f, 0.f, 0.f, 1.f, 2.f, 3.f, 4.f};
  std::vector<float> gain = {1.f, 1.f, 1.f, 1.f};
  RmsNorm(x.data(), gain.data(), 2, 4, 1e-5f, x.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(x[i], 0.f);  // eps keeps a zero row finite
  const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-5);
  EXPECT_NEAR(x[7], 4.0 / rms, 1e-6);
}

}  // namespace
}  // namespace glmserve
