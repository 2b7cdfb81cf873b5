#include "core/cpu/ops/linear.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::RandomVector;
using testing::RelativeError;

// Stores values in `dtype`, returning the bytes and the exactly-representable float values.
struct StoredMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // what the stored elements are, widened
  Matrix view;
};

StoredMatrix Store(const std::vector<float>& v, int64_t rows, int64_t cols, DType dtype) {
  StoredMatrix s;
  s.bytes.resize(v.size() * DTypeSize(dtype));
  s.values.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      reinterpret_cast<float*>(s.bytes.data())[i] = v[i];
    } else if (dtype == DType::kBF16) {
      reinterpret_cast<uint16_t*>(s.bytes.data())[i] = FloatToBf16(v[i]);
    } else {
      reinterpret_cast<uint16_t*>(s.bytes.data())[i] = FloatToF16(v[i]);
    }
    s.values[i] = LoadAsFloat(s.bytes.data(), dtype, i);
  }
  s.view = Matrix{dtype, rows, cols, s.bytes.data()};
  return s;
}

// float64 reference of y = x W^T + b.
std::vector<float> Reference(const std::vector<float>& x, int64_t m, const StoredMatrix& w,
                             const std::vector<float>* bias) {
  const int64_t n = w.view.rows, k = w.view.cols;
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias ? (*bias)[j] : 0.0;
      for (int64_t c = 0; c < k; ++c)
        acc += static_cast<double>(x[i * k + c]) * w.values[j * k + c];
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

struct Shape {
  int64_t m, n, k;
};

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesFloat64ReferenceOnAwkwardShapes) {
  const DType dtype = GetParam();
  // One token, odd sizes, K tails below 16, K spanning several 512 blocks, N not a multiple
  // of the 4-row tile or of the 32-row task block.
  const Shape shapes[] = {{1, 1, 1},     {1, 7, 5},      {3, 33, 17},   {4, 64, 64},
                          {5, 37, 1030}, {17, 130, 513}, {1, 96, 2048}, {9, 4, 16}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    std::vector<float> x = RandomVector(s.m * s.k, seed++);
    StoredMatrix w = Store(RandomVector(s.n * s.k, seed++, 0.1f), s.n, s.k, dtype);
    std::vector<float> bias = RandomVector(s.n, seed++);
    for (bool with_bias : {false, true}) {
      std::vector<float> y(s.m * s.n, NAN);  // poisoned: unwritten elements show
      Linear(x.data(), s.m, w.view, with_bias ? bias.data() : nullptr, y.data());
      std::vector<float> ref = Reference(x, s.m, w, with_bias ? &bias : nullptr);
      EXPECT_LT(RelativeError(y, ref), 1e-6)
          << "m=" << s.m << " n=" << s.n << " k=" << s.k << " bias=" << with_bias;
      std::vector<float> g(s.m * s.n, NAN);
      internal::LinearGeneric(x.data(), s.m, w.view, with_bias ? bias.data() : nullptr, g.data());
      EXPECT_LT(RelativeError(g, ref), 1e-6) << "generic kernel, m=" << s.m;
    }
  }
}

// The batch-invariance contract: a row's result does not depend on which rows share the
// call, bit for bit, for every m and every row position inside the register tiles.
TEST_P(LinearTest, RowResultIndependentOfBatch) {
  const DType dtype = GetParam();
  const int64_t n = 70, k = 1100, m = 11;
  std::vector<float> x = RandomVector(m * k, 7);
  StoredMatrix w = Store(RandomVector(n * k, 8, 0.05f), n, k, dtype);
  std::vector<float> all(m * n);
  Linear(x.data(), m, w.view, nullptr, all.data());
  for (int64_t start = 0; start < m; ++start) {
    for (int64_t count = 1; start + count <= m; count += 3) {
      std::vector<float> part(count * n);
      Linear(x.data() + start * k, count, w.view, nullptr, part.data());
      for (int64_t i = 0; i < count * n; ++i) {
        ASSERT_EQ(part[i], all[start * n + i]) << "start " << start << " count " << count;
      }
    }
  }
}

// The same across the switch between the kernel's in-register path (few rows) and its panel
// path (many rows): a row's bits do not depend on which one the batch size picked.
TEST_P(LinearTest, RowResultIndependentOfBatchAcrossKernelPaths) {
  const DType dtype = GetParam();
  const int64_t n = 37, k = 700, m = 140;
  std::vector<float> x = RandomVector(m * k, 17);
  StoredMatrix w = Store(RandomVector(n * k, 18, 0.05f), n, k, dtype);
  std::vector<float> all(m * n);
  Linear(x.data(), m, w.view, nullptr, all.data());
  for (const auto& [start, count] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {3, 4}, {5, 9}, {11, 16}, {20, 17}, {0, 127}, {2, 129}, {7, 133}}) {
    std::vector<float> part(count * n);
    Linear(x.data() + start * k, count, w.view, nullptr, part.data());
    for (int64_t i = 0; i < count * n; ++i) {
      ASSERT_EQ(part[i], all[start * n + i]) << "start " << start << " count " << count;
    }
  }
}

// A prefill-sized activation (fp32 rows of 4,200: 16.4 MB) runs in parts of 480 rows
// (linear.h, kPartBytes): every row is written, and each row's bits are what it gets alone,
// on either side of each cut.
TEST_P(LinearTest, ActivationCutIntoPartsGivesEachRowItsBits) {
  const DType dtype = GetParam();
  const int64_t n = 40, k = 4200, m = 1000;
  ASSERT_EQ(internal::ActivationPartRows(4 * k), 480);
  std::vector<float> x = RandomVector(m * k, 27);
  StoredMatrix w = Store(RandomVector(n * k, 28, 0.05f), n, k, dtype);
  const std::vector<float> bias = RandomVector(n, 29);
  std::vector<float> all(m * n, NAN);  // poisoned: unwritten elements show
  Linear(x.data(), m, w.view, bias.data(), all.data());
  EXPECT_LT(RelativeError(all, Reference(x, m, w, &bias)), 1e-5);
  for (int64_t row : {0, 479, 480, 959, 960, 999}) {
    std::vector<float> alone(n);
    Linear(x.data() + row * k, 1, w.view, bias.data(), alone.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], all[row * n + j]) << "row " << row;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, LinearTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(LinearKernel, ReportsItsName) {
  const std::string name = LinearKernelName();
  EXPECT_TRUE(name == "avx512" || name == "avx2" || name == "generic") << name;
}

}  // namespace
}  // namespace glmserve
