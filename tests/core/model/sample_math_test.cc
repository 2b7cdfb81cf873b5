// core/model/sample_math.h: DetExp against the C library's exp, the integer weights' limits,
// and the targets' bounds.
#include "core/model/sample_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace glmserve::samplemath {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SampleMathTest, DetExpIsWithinFourUlpOfExp) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-700.0, 0.0), narrow(-1.0, 0.0);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(rng) : narrow(rng);
    const double want = std::exp(x), got = DetExp(x);
    const double ulp = std::nextafter(want, kInf) - want;
    worst = std::max(worst, std::abs(got - want) / ulp);
  }
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(DetExp(0.0), 1.0);
  EXPECT_EQ(DetExp(-0.0), 1.0);
  EXPECT_EQ(DetExp(-kInf), 0.0);
  EXPECT_EQ(DetExp(-701.0), 0.0);
  // Never above 1 for x <= 0: the favourite's weight bounds every other.
  for (double x = -1e-300; x > -1e-3; x *= 3.0) EXPECT_LE(DetExp(x), 1.0) << x;
}

TEST(SampleMathTest, WeightShiftKeepsAWholeRowBelowTwoToThe63) {
  for (int64_t vocab : {1, 2, 3, 1000, 151552, 262143, 262144, 1 << 30}) {
    const int s = WeightShift(vocab);
    ASSERT_GT(s, 0);
    // vocab * 2^s < 2^63, and one more bit would not be.
    EXPECT_LT(static_cast<unsigned __int128>(vocab) << s, static_cast<unsigned __int128>(1) << 63);
    EXPECT_GE(static_cast<unsigned __int128>(vocab) << (s + 1), static_cast<unsigned __int128>(1)
                                                                    << 63);
  }
  EXPECT_EQ(WeightShift(151552), 45);
}

TEST(SampleMathTest, IntWeightLimitsAndMonotonicity) {
  const int s = 45;
  const uint64_t one = uint64_t{1} << s;
  EXPECT_EQ(IntWeight(3.0, 3.0, s), one);
  EXPECT_EQ(IntWeight(-kInf, 3.0, s), 0u);
  EXPECT_EQ(IntWeight(kInf, kInf, s), one);
  EXPECT_EQ(IntWeight(5.0, kInf, s), 0u);
  EXPECT_EQ(IntWeight(-kInf, -kInf, s), one);
  // Below 2^-s of the favourite the weight is 0; just above it, 1.
  EXPECT_EQ(IntWeight(-32.0, 0.0, s), 0u);
  EXPECT_EQ(IntWeight(-31.0, 0.0, s), static_cast<uint64_t>(std::exp(-31.0) * 0x1p45));
  uint64_t last = one;
  for (double z = 0.0; z > -40.0; z -= 0.01) {
    const uint64_t w = IntWeight(z, 0.0, s);
    EXPECT_LE(w, last) << z;
    last = w;
  }
}

TEST(SampleMathTest, TargetsStayInRange) {
  EXPECT_EQ(NucleusTarget(0.5f, 1000), 500u);
  EXPECT_EQ(NucleusTarget(0.0f, 1000), 1u);
  EXPECT_EQ(NucleusTarget(1.0f, 1000), 1000u);
  EXPECT_EQ(NucleusTarget(0.9f, uint64_t{1} << 62),
            static_cast<uint64_t>(std::ceil((0.9f - kTopPSlack) * 0x1p62)));
  EXPECT_EQ(DrawTarget(0.0, 7), 0u);
  EXPECT_EQ(DrawTarget(0.999999, 7), 6u);
  // u just below 1 over a mass that double cannot hold exactly still stays below it.
  const uint64_t big = (uint64_t{1} << 62) + 1;
  EXPECT_LT(DrawTarget(1.0 - 0x1p-53, big), big);
  EXPECT_EQ(MinPWeight(0.25f, 45), uint64_t{1} << 43);
}

TEST(SampleMathTest, UniformIsAFixedFunctionOfSeedAndIndex) {
  // The seeded stream is a contract across versions: these values must never change.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  const double u = Uniform(1234, 5);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
  EXPECT_EQ(u, Uniform(1234, 5));
  EXPECT_NE(u, Uniform(1234, 6));
}

}  // namespace
}  // namespace glmserve::samplemath
