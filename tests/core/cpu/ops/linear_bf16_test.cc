// CpuMath::kBf16 (core/cpu/ops/linear.h): activations rounded to bf16, vdpbf16ps arithmetic.
// Checked against a float64 reference of the rounded product, for batch invariance (the
// contract), for bit equality between the AVX512_BF16 kernel and the portable emulation on
// machines that have the instruction, and for falling back to the exact arithmetic on
// weights that are not bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "tests/core/cpu/ops/bf16_reference.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;
using testing::RelativeError;

using testing::ToBf16;

// Runs with the portable kernels forced for the test's scope.
struct ForceGeneric {
  ForceGeneric() { internal::ForceGenericKernels(true); }
  ~ForceGeneric() { internal::ForceGenericKernels(false); }
};

struct Shape {
  int64_t m, n, k;
};

TEST(LinearBf16, MatchesFloat64ReferenceOfRoundedActivationsOnAwkwardShapes) {
  // K tails below 32 and odd, long K; m off the 3-row register tile (remainders 1 and 2) and
  // over it; N off the 8-row tile (every remainder 1-7 below) and the 32-row task block.
  const Shape shapes[] = {{1, 1, 1},      {1, 7, 5},     {3, 33, 17},  {4, 64, 64},   {5, 37, 1030},
                          {17, 130, 513}, {1, 96, 2048}, {9, 4, 33},   {6, 40, 3000}, {2, 45, 100},
                          {7, 46, 70},    {8, 59, 1100}, {10, 43, 96}, {11, 60, 64},  {2, 3, 40}};
  std::printf("kBf16 kernel on this machine: %s\n", LinearKernelName(CpuMath::kBf16));
  uint32_t seed = 11;
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const std::vector<uint16_t> wb = ToBf16(RandomVector(s.n * s.k, seed++, 0.1f));
    const Matrix w{DType::kBF16, s.n, s.k, wb.data()};
    const std::vector<float> bias = RandomVector(s.n, seed++);
    for (bool with_bias : {false, true}) {
      const float* b = with_bias ? bias.data() : nullptr;
      const std::vector<float> ref = testing::Bf16ActivationReference(x, s.m, wb, s.n, s.k, b);
      std::vector<float> y(s.m * s.n, NAN);  // poisoned: unwritten elements show
      Linear(x.data(), s.m, w, b, y.data(), CpuMath::kBf16);
      EXPECT_LT(RelativeError(y, ref), 2e-6) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
      std::vector<float> g(s.m * s.n, NAN);
      {
        ForceGeneric generic;
        Linear(x.data(), s.m, w, b, g.data(), CpuMath::kBf16);
      }
      EXPECT_LT(RelativeError(g, ref), 2e-6) << "generic, m=" << s.m << " k=" << s.k;
      // The emulation is the kernel's arithmetic, bit for bit.
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        ASSERT_EQ(y[i], g[i]) << LinearKernelName(CpuMath::kBf16) << " vs generic_bf16, m=" << s.m
                              << " n=" << s.n << " k=" << s.k << " element " << i;
      }
    }
  }
}

// Prefill-sized shapes, past what the awkward shapes reach: K in several of the kernel's
// 2,048-wide ranges with a tail, more rows than one 96-row chunk, and an activation over
// kBf16PartBytes, so its rows are cut into parts (the second shape: three). Each element is one
// lane chain over all of K whatever the cut, so the kernel still gives the emulation's bits.
TEST(LinearBf16, PrefillShapesAcrossRangesChunksAndPartsBitForBit) {
  const Shape shapes[] = {{200, 40, 4133}, {600, 41, 12300}};
  uint32_t seed = 71;
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomVector(s.m * s.k, seed++);
    const std::vector<uint16_t> wb = ToBf16(RandomVector(s.n * s.k, seed++, 0.05f));
    const Matrix w{DType::kBF16, s.n, s.k, wb.data()};
    const std::vector<float> bias = RandomVector(s.n, seed++);
    std::vector<float> y(s.m * s.n, NAN), g(s.m * s.n, NAN);
    Linear(x.data(), s.m, w, bias.data(), y.data(), CpuMath::kBf16);
    {
      ForceGeneric generic;
      Linear(x.data(), s.m, w, bias.data(), g.data(), CpuMath::kBf16);
    }
    const std::vector<float> ref =
        testing::Bf16ActivationReference(x, s.m, wb, s.n, s.k, bias.data());
    EXPECT_LT(RelativeError(y, ref), 2e-6) << "m=" << s.m << " k=" << s.k;
    for (int64_t i = 0; i < s.m * s.n; ++i) {
      ASSERT_EQ(y[i], g[i]) << "m=" << s.m << " k=" << s.k << " element " << i;
    }
    // A row alone (over all of K at once) and in a call of 5 (in ranges): the same bits.
    for (int64_t row : {int64_t{0}, s.m / 2, s.m - 5}) {
      for (int64_t count : {1, 5}) {
        std::vector<float> part(count * s.n);
        Linear(x.data() + row * s.k, count, w, bias.data(), part.data(), CpuMath::kBf16);
        for (int64_t i = 0; i < count * s.n; ++i) {
          ASSERT_EQ(part[i], y[row * s.n + i]) << "row " << row << " count " << count;
        }
      }
    }
  }
  // The second shape's activation (bf16 rows of 12,300) is cut into parts of 288 rows: 3.
  EXPECT_EQ(internal::ActivationPartRows(2 * 12300), 288);
  // Parts are whole 96-row chunks, at least one.
  EXPECT_EQ(internal::ActivationPartRows(2 * 4096), 960);
  EXPECT_EQ(internal::ActivationPartRows(int64_t{1} << 30), internal::kBf16ChunkRows);
}

TEST(LinearBf16, ActivationsAreRoundedToNearestEven) {
  // K = 1, W = [1]: y is round_bf16(x) exactly. 1 + 2^-8 is halfway between 1 and 1 + 2^-7
  // (bf16 keeps 7 fraction bits): ties go to the even neighbour, 1; 1 + 3 * 2^-8 is halfway
  // between 1 + 2^-7 and 1 + 2^-6 and goes to 1 + 2^-6; 1 + 2^-8 + 2^-12 rounds up.
  const uint16_t one = FloatToBf16(1.0f);
  const Matrix w{DType::kBF16, 1, 1, &one};
  const float cases[][2] = {{1.0f + 0x1p-8f, 1.0f},
                            {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},
                            {1.0f + 0x1p-8f + 0x1p-12f, 1.0f + 0x1p-7f},
                            {-(1.0f + 0x1p-8f), -1.0f}};
  for (const auto& [x, want] : cases) {
    float y = NAN;
    Linear(&x, 1, w, nullptr, &y, CpuMath::kBf16);
    EXPECT_EQ(y, want) << "x = " << x;
    // The exact mode keeps the fp32 activation.
    Linear(&x, 1, w, nullptr, &y, CpuMath::kExact);
    EXPECT_EQ(y, x);
  }
}

// The batch-invariance contract in this mode: a row's bits do not depend on which rows
// share the call, over all of K at once (m <= 3) and in K ranges (m > 3).
TEST(LinearBf16, RowResultIndependentOfBatch) {
  const int64_t n = 70, k = 2100, m = 13;
  const std::vector<float> x = RandomVector(m * k, 7);
  const std::vector<uint16_t> wb = ToBf16(RandomVector(n * k, 8, 0.05f));
  const Matrix w{DType::kBF16, n, k, wb.data()};
  const std::vector<float> bias = RandomVector(n, 9);
  std::vector<float> all(m * n);
  Linear(x.data(), m, w, bias.data(), all.data(), CpuMath::kBf16);
  for (int64_t start = 0; start < m; ++start) {
    for (int64_t count = 1; start + count <= m; count += 2) {
      std::vector<float> part(count * n);
      Linear(x.data() + start * k, count, w, bias.data(), part.data(), CpuMath::kBf16);
      for (int64_t i = 0; i < count * n; ++i) {
        ASSERT_EQ(part[i], all[start * n + i]) << "start " << start << " count " << count;
      }
    }
  }
}

// LinearMany shares one rounded activation between jobs; each job's result is what Linear
// gives for it alone, and mixed weight dtypes each take their own arithmetic.
TEST(LinearBf16, ManyJobsMatchSingleCallsAndNonBf16WeightsStayExact) {
  const int64_t m = 5, k = 300, n = 45;
  const std::vector<float> x = RandomVector(m * k, 21);
  const std::vector<float> wf = RandomVector(n * k, 22, 0.1f);
  const std::vector<uint16_t> wb = ToBf16(wf);
  const Matrix w_bf16{DType::kBF16, n, k, wb.data()};
  const Matrix w_f32{DType::kF32, n, k, wf.data()};
  std::vector<float> a(m * n), b(m * n), c(m * n);
  const LinearJob jobs[] = {{x.data(), m, &w_bf16, nullptr, a.data()},
                            {x.data(), m, &w_f32, nullptr, b.data()},
                            {x.data() + k, m - 1, &w_bf16, nullptr, c.data()}};
  LinearMany(jobs, CpuMath::kBf16);
  std::vector<float> want(m * n);
  Linear(x.data(), m, w_bf16, nullptr, want.data(), CpuMath::kBf16);
  EXPECT_EQ(a, want);
  Linear(x.data(), m, w_f32, nullptr, want.data(), CpuMath::kExact);
  EXPECT_EQ(b, want) << "fp32 weights take the exact arithmetic in bf16 mode";
  for (int64_t i = 0; i < (m - 1) * n; ++i) ASSERT_EQ(c[i], a[n + i]) << i;
  // And the two modes do differ on bf16 weights (the rounding of x is real).
  Linear(x.data(), m, w_bf16, nullptr, want.data(), CpuMath::kExact);
  EXPECT_NE(a, want);
  EXPECT_LT(RelativeError(a, want), 1e-2);
}

TEST(LinearBf16, ParsesModeNames) {
  EXPECT_EQ(*ParseCpuMath("exact"), CpuMath::kExact);
  EXPECT_EQ(*ParseCpuMath("bf16"), CpuMath::kBf16);
  const absl::StatusOr<CpuMath> bad = ParseCpuMath("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("exact, bf16, bf16_amx"), std::string::npos);
  EXPECT_STREQ(CpuMathName(CpuMath::kBf16), "bf16");
  const std::string kernel = LinearKernelName(CpuMath::kBf16);
  EXPECT_TRUE(kernel == "avx512_bf16" || kernel == "generic_bf16") << kernel;
}

}  // namespace
}  // namespace glmserve
