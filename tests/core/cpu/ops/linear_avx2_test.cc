// The AVX2 exact kernel against a scalar model of its arithmetic (and of the AVX-512 kernel's),
// bit for bit: 16 lanes over k, one fused multiply-add per product, past-the-end elements of a
// 16-wide step as zero products, the lane tree, 512-wide K blocks added to y in order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using internal::kBlockK;
using internal::kBlockN;

// One weight matrix in a stored form, with its elements as the kernels widen them.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> values;  // [rows, cols], what the kernel multiplies by
  Matrix view;
};

Stored MakeDense(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  const std::vector<float> v = testing::RandomVector(rows * cols, seed, 0.1f);
  Stored s;
  s.bytes.resize(v.size() * DTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(s.bytes.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(v[i]) : FloatToF16(v[i]);
      std::memcpy(s.bytes.data() + 2 * i, &h, 2);
    }
    s.values.push_back(LoadAsFloat(s.bytes.data(), dtype, i));
  }
  s.view = Matrix{dtype, rows, cols, s.bytes.data()};
  return s;
}

// FP8 e4m3 codes (no NaN codes) with one scale per block_rows x block_cols block.
Stored MakeFp8(int64_t rows, int64_t cols, int32_t block_rows, int32_t block_cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Stored s;
  s.bytes.resize(rows * cols);
  for (uint8_t& b : s.bytes) {
    do {
      b = static_cast<uint8_t>(rng());
    } while ((b & 0x7f) == 0x7f);
  }
  const int64_t srows = (rows + block_rows - 1) / block_rows;
  const int64_t scols = (cols + block_cols - 1) / block_cols;
  for (int64_t i = 0; i < srows * scols; ++i) s.scales.push_back(0.001f * (1 + rng() % 97));
  s.view = Matrix{
      DType::kF8E4M3, rows,       cols, s.bytes.data(), WeightFormat::kFp8Scaled, s.scales.data(),
      block_rows,     block_cols, 0};
  const float* table = internal::E4m3Table();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      s.values.push_back(table[s.bytes[r * cols + c]] *
                         s.scales[(r / block_rows) * scols + c / block_cols]);
    }
  }
  return s;
}

// The scalar model: y[i][n] = ((+0 + block 0's sum) + block 1's sum) + ... (+ bias).
std::vector<float> Model(const std::vector<float>& x, int64_t m, const Stored& w,
                         const std::vector<float>* bias) {
  const int64_t n_rows = w.view.rows, k_total = w.view.cols;
  std::vector<float> y(m * n_rows);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < n_rows; ++n) {
      float acc = 0.f;
      for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
        const int64_t kk = std::min(kBlockK, k_total - k0);
        float lane[16] = {};
        for (int64_t k = 0; k < (kk + 15) / 16 * 16; ++k) {
          const float a = k < kk ? x[i * k_total + k0 + k] : 0.f;
          const float b = k < kk ? w.values[n * k_total + k0 + k] : 0.f;
          lane[k % 16] = std::fma(a, b, lane[k % 16]);
        }
        for (int width = 8; width >= 1; width /= 2)
          for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
        acc += lane[0];
      }
      if (bias != nullptr) acc += (*bias)[n];
      y[i * n_rows + n] = acc;
    }
  }
  return y;
}

using BlockFn = void (*)(const LinearJob&, int64_t, AlignedVector<float>*);

std::vector<float> RunBlocks(BlockFn fn, const std::vector<float>& x, int64_t m, const Stored& w,
                             const std::vector<float>* bias) {
  std::vector<float> y(m * w.view.rows, NAN);
  const LinearJob job{x.data(), m, &w.view, bias != nullptr ? bias->data() : nullptr, y.data()};
  AlignedVector<float> panel;
  for (int64_t nb = 0; nb * kBlockN < w.view.rows; ++nb) fn(job, nb, &panel);
  return y;
}

class LinearAvx2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!internal::CpuHasAvx2Fma()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  }
  // Every m from the decode row to past the in-register path (16), K with tails and several
  // 512 blocks, N not a multiple of any tile.
  void CheckAllShapes(const Stored& w, uint32_t seed) {
    const std::vector<float> bias = testing::RandomVector(w.view.rows, seed + 1);
    for (int64_t m : {1, 2, 3, 4, 5, 7, 16, 17, 40}) {
      const std::vector<float> x = testing::RandomVector(m * w.view.cols, seed + m);
      for (const std::vector<float>* b : {static_cast<const std::vector<float>*>(nullptr), &bias}) {
        const std::vector<float> want = Model(x, m, w, b);
        const std::vector<float> got = RunBlocks(internal::LinearBlockAvx2, x, m, w, b);
        for (size_t e = 0; e < want.size(); ++e) {
          ASSERT_EQ(std::memcmp(&got[e], &want[e], 4), 0)
              << "m=" << m << " element " << e << ": " << got[e] << " vs " << want[e];
        }
        if (internal::CpuHasAvx512()) {  // the AVX-512 kernel gives the same bits
          const std::vector<float> wide = RunBlocks(internal::LinearBlockAvx512, x, m, w, b);
          ASSERT_EQ(std::memcmp(wide.data(), got.data(), 4 * got.size()), 0) << "m=" << m;
        }
      }
    }
  }
};

TEST_F(LinearAvx2Test, Bf16EqualsTheScalarModelBitForBit) {
  for (int64_t k : {1, 15, 16, 33, 512, 1030}) CheckAllShapes(MakeDense(37, k, DType::kBF16, 3), 7);
}

TEST_F(LinearAvx2Test, F32AndF16EqualTheScalarModelBitForBit) {
  CheckAllShapes(MakeDense(35, 530, DType::kF32, 4), 11);
  CheckAllShapes(MakeDense(33, 47, DType::kF16, 5), 13);
}

TEST_F(LinearAvx2Test, Fp8BlockScaledEqualsTheScalarModelBitForBit) {
  CheckAllShapes(MakeFp8(70, 600, 128, 128, 6), 17);
  CheckAllShapes(MakeFp8(40, 100, 16, 16, 8), 19);
}

TEST_F(LinearAvx2Test, IsWhatExactLinearDispatchesWithoutAvx512) {
  if (internal::CpuHasAvx512()) GTEST_SKIP() << "this CPU dispatches to the AVX-512 kernel";
  EXPECT_STREQ(LinearKernelName(CpuMath::kExact), "avx2");
  const Stored w = MakeDense(50, 300, DType::kBF16, 9);
  const std::vector<float> x = testing::RandomVector(3 * 300, 10);
  std::vector<float> y(3 * 50);
  Linear(x.data(), 3, w.view, nullptr, y.data());
  const std::vector<float> want = Model(x, 3, w, nullptr);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), 4 * y.size()), 0);
}

}  // namespace
}  // namespace glmserve
