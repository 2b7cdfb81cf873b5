#include "core/cpu/ops/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax_row.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;

constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t OrderedBits(float f) {  // floats in order as integers, for ulp distances
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i;
}

// Rows with what attention produces and what it must survive: masked (-inf) scores, scores far
// below the max (exp underflows to 0), ties, every length around the 8-lane tails.
std::vector<std::vector<float>> Rows() {
  std::vector<std::vector<float>> rows;
  uint32_t seed = 7;
  for (int64_t n : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1000, 4097, 16385}) {
    for (float stddev : {0.5f, 4.0f, 40.0f}) rows.push_back(RandomVector(n, seed++, stddev));
  }
  std::vector<float> masked = RandomVector(40, seed++, 3.0f);
  for (int i = 20; i < 40; ++i) masked[i] = -kInf;
  rows.push_back(masked);
  rows.push_back(std::vector<float>(33, 2.5f));             // all tied: 1/33 each
  rows.push_back({0.0f, -100.0f, -86.9f, -87.1f, -1e30f});  // underflow on both sides of -87
  rows.push_back({-0.0f, 0.0f, -0.0f});
  return rows;
}

TEST(SoftmaxTest, ExpWithinTwoUlpOfTheCorrectlyRoundedExp) {
  // Every 97th float in [-87, 0] (about 1.2e7 of them, from -0 and the subnormals to -87):
  // each result against exp in double, rounded once to float.
  int64_t worst = 0, checked = 0;
  uint32_t limit;
  const float bound = 87.0f;
  std::memcpy(&limit, &bound, sizeof limit);
  for (uint32_t magnitude = 0; magnitude <= limit; magnitude += 97, ++checked) {
    float x;
    const uint32_t bits = magnitude | 0x80000000u;
    std::memcpy(&x, &bits, sizeof x);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t ulps = std::llabs(OrderedBits(internal::ExpNonPositive(x)) - OrderedBits(want));
    worst = std::max(worst, ulps);
  }
  EXPECT_GT(checked, 1000000);
  EXPECT_LE(worst, 2) << "over " << checked << " points";
  EXPECT_EQ(internal::ExpNonPositive(0.0f), 1.0f);
  EXPECT_EQ(internal::ExpNonPositive(-0.0f), 1.0f);
  EXPECT_EQ(internal::ExpNonPositive(-87.5f), 0.0f);
  EXPECT_EQ(internal::ExpNonPositive(-kInf), 0.0f);
}

// Each SIMD form this CPU runs (an AVX-512 one checks its AVX2 form too) against the portable
// code, bit for bit.
TEST(SoftmaxTest, EverySimdFormEqualsPortableBitForBit) {
  std::vector<std::pair<const char*, void (*)(float*, int64_t)>> forms;
  if (internal::CpuHasAvx2Fma()) forms.push_back({"avx2", internal::SoftmaxAvx2});
  if (internal::CpuHasAvx512()) forms.push_back({"avx512", internal::SoftmaxAvx512});
  if (forms.empty()) GTEST_SKIP() << "neither AVX2 nor AVX-512 on this CPU";
  for (const std::vector<float>& row : Rows()) {
    std::vector<float> portable = row;
    internal::SoftmaxGeneric(portable.data(), static_cast<int64_t>(row.size()));
    for (const auto& [name, form] : forms) {
      std::vector<float> simd = row;
      form(simd.data(), static_cast<int64_t>(row.size()));
      ASSERT_EQ(0, std::memcmp(portable.data(), simd.data(), row.size() * sizeof(float)))
          << name << ", row of " << row.size();
    }
  }
}

// The first part alone (SoftmaxExpInPlace: the exps and their sum, for PagedAttentionBf16): the
// same bits in every form, and what SoftmaxInPlace has before its division.
TEST(SoftmaxTest, ExpPartGivesTheSoftmaxsExpsAndSumInEveryForm) {
  std::vector<std::pair<const char*, float (*)(float*, int64_t)>> forms = {
      {"generic", internal::SoftmaxExpGeneric}};
  if (internal::CpuHasAvx2Fma()) forms.push_back({"avx2", internal::SoftmaxExpAvx2});
  if (internal::CpuHasAvx512()) forms.push_back({"avx512", internal::SoftmaxExpAvx512});
  for (const std::vector<float>& row : Rows()) {
    const int64_t n = static_cast<int64_t>(row.size());
    float max_score = -kInf;
    for (float s : row) max_score = std::max(max_score, s);
    std::vector<float> e(n);
    for (int64_t i = 0; i < n; ++i) {
      const float x = row[i] - max_score;
      e[i] = x == x ? internal::ExpNonPositive(x) : x;
    }
    const float sum = LaneSum<8>(n, [&](int64_t i) { return e[i]; });
    std::vector<float> softmax = row;
    SoftmaxInPlace(softmax.data(), n);
    for (const auto& [name, form] : forms) {
      std::vector<float> got = row;
      const float got_sum = form(got.data(), n);
      ASSERT_EQ(0, std::memcmp(&got_sum, &sum, sizeof sum)) << name << ", row of " << n;
      ASSERT_EQ(0, std::memcmp(got.data(), e.data(), n * sizeof(float)))
          << name << ", row of " << n;
      for (int64_t i = 0; i < n; ++i) got[i] *= 1.0f / got_sum;
      ASSERT_EQ(0, std::memcmp(got.data(), softmax.data(), n * sizeof(float))) << name;
    }
  }
}

TEST(SoftmaxTest, IsExpOfTheDifferenceOverTheLaneSum) {
  // An independent composition of the documented arithmetic: the max, ExpNonPositive, the sum
  // in lane_sum.h's LaneSum<8> order and one reciprocal. Scores spread over 40 units give exps
  // over 17 decades, whose rounded sum depends on the order: a serial sum fails this.
  for (const std::vector<float>& row : Rows()) {
    const int64_t n = static_cast<int64_t>(row.size());
    float max_score = -kInf;
    for (float s : row) max_score = std::max(max_score, s);
    std::vector<float> e(n);
    for (int64_t i = 0; i < n; ++i) e[i] = internal::ExpNonPositive(row[i] - max_score);
    const float inv = 1.0f / LaneSum<8>(n, [&](int64_t i) { return e[i]; });
    std::vector<float> got = row;
    SoftmaxInPlace(got.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], e[i] * inv) << "n " << n << " i " << i;
  }
}

TEST(SoftmaxTest, MatchesFloat64Softmax) {
  for (const std::vector<float>& row : Rows()) {
    const int64_t n = static_cast<int64_t>(row.size());
    double max_score = -INFINITY, sum = 0;
    for (float s : row) max_score = std::max<double>(max_score, s);
    for (float s : row) sum += std::exp(s - max_score);
    std::vector<float> got = row;
    SoftmaxInPlace(got.data(), n);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = row[i] - max_score, want = std::exp(x) / sum;
      total += got[i];
      // The relative error bound of each step: rounding x = s - max to float (half an ulp of x,
      // at most |x| 2^-24, moves exp(x) by that much: 4e-6 at x = -70), exp's 2 ulp, the sum's
      // (each lane a chain of n / 8 adds, then 3 in the tree) and the reciprocal's and product's
      // roundings. Below exp's -87 cut the reference is under 2e-38 and the result +0;
      // a masked score (-inf) gives exactly 0.
      const double sum_error = (static_cast<double>(n) / 8 + 3) * 0x1p-24;
      const double bound =
          want == 0 ? 0 : (std::fabs(x) * 0x1p-24 + 4 * 0x1p-24 + sum_error) * want + 2e-38;
      ASSERT_NEAR(got[i], want, bound) << "n " << n << " i " << i;
    }
    EXPECT_NEAR(total, 1.0, 1e-5) << "n " << n;
  }
  float one = -3.0f;
  SoftmaxInPlace(&one, 1);
  EXPECT_EQ(one, 1.0f);
}

TEST(SoftmaxTest, NanAnywhereGivesARowOfNan) {
  // As the C library's exp did: a NaN score (a NaN activation upstream) is never hidden as a
  // zero weight. An +inf score makes inf - inf, a NaN too.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
    for (int64_t n : {1, 5, 8, 13, 16, 20, 37}) {
      std::vector<float> row = RandomVector(n, 3, 1.0f);
      row[n / 2] = bad;
      SoftmaxInPlace(row.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(row[i])) << "n " << n << " i " << i;
    }
  }
}

TEST(SoftmaxTest, DispatchHonoursForcedPortableKernels) {
  const std::vector<float> row = RandomVector(1001, 11, 5.0f);
  std::vector<float> fast = row, forced = row;
  SoftmaxInPlace(fast.data(), 1001);
  internal::ForceGenericKernels(true);
  SoftmaxInPlace(forced.data(), 1001);
  internal::ForceGenericKernels(false);
  EXPECT_EQ(0, std::memcmp(fast.data(), forced.data(), sizeof(float) * 1001));
}

}  // namespace
}  // namespace glmserve
