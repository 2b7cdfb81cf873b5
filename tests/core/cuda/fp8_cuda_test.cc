// The CUDA FP8 kernels (core/cuda/fp8_linear.cu) against the CPU's FP8 path (core/cpu/ops/linear.h
// on a kFp8Scaled matrix) on awkward shapes: K not a multiple of 128 (partial scale blocks),
// one output row, one activation row, the GEMV / GEMM boundary, per-channel and 128x128
// block scales, and many experts with uneven (and empty) row counts. Outputs are poisoned
// (NaN) before each run so an unwritten element shows.
//
// Tolerance: relative error 1e-5 of the output's norm: both sides multiply the same fp32
// weights (e4m3 x scale, one rounding) by the same fp32 activations; only the summation
// order differs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels.h"
#include "core/model/checkpoint.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/cuda/device_buffers.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::RandomVector;
using ::glmserve::testing::RelativeError;

// A random FP8 matrix on the host (codes of N(0, 100) values, scales |N(0,1)| / 448) and on
// the device.
struct Fp8Pair {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Matrix host;
  DeviceBuffer d_codes, d_scales;
  Fp8DeviceMatrix device;
  Fp8Pair(int64_t rows, int64_t cols, int64_t br, int64_t bc, uint32_t seed) {
    for (float v : RandomVector(rows * cols, seed, 100.0f)) codes.push_back(FloatToE4m3(v));
    // A few subnormal codes.
    for (int64_t i = 0; i < rows * cols; i += 17) codes[i] = static_cast<uint8_t>(i % 8);
    const int64_t n = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
    for (float v : RandomVector(n, seed + 1, 1.0f)) scales.push_back(std::fabs(v) / 448);
    host = Matrix{DType::kF8E4M3, rows, cols, codes.data()};
    host.format = WeightFormat::kFp8Scaled;
    host.scales = scales.data();
    host.scale_block_rows = static_cast<int32_t>(br);
    host.scale_block_cols = static_cast<int32_t>(bc);
    d_codes = Upload(codes);
    d_scales = Upload(scales);
    device = {static_cast<const uint8_t*>(d_codes.get()),
              static_cast<const float*>(d_scales.get()),
              rows,
              cols,
              br,
              bc};
  }
};

TEST(Fp8CudaTest, LinearMatchesTheCpuFp8Path) {
  GLM_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int64_t n, k, br, bc, m;
  };
  for (const Shape& s : std::vector<Shape>{{37, 300, 128, 128, 1},
                                           {130, 1100, 128, 128, 5},
                                           {1, 700, 128, 128, 8},
                                           {65, 129, 1, 129, 9},
                                           {200, 160, 128, 128, 70},
                                           {3, 33, 1, 33, 33}}) {
    Fp8Pair w(s.n, s.k, s.br, s.bc, static_cast<uint32_t>(s.n * 131 + s.k));
    const std::vector<float> x = RandomVector(s.m * s.k, 7, 1.0f);
    std::vector<float> want(s.m * s.n);
    Linear(x.data(), s.m, w.host, nullptr, want.data());
    DeviceBuffer dx = Upload(x);
    DeviceBuffer dy = Upload(std::vector<float>(s.m * s.n, std::nanf("")));
    ASSERT_EQ(LaunchFp8Linear(static_cast<const float*>(dx.get()), s.m, w.device,
                              static_cast<float*>(dy.get()), nullptr),
              cudaSuccess);
    const std::vector<float> got = Download<float>(dy, want.size());
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "unwritten output";
    EXPECT_LT(RelativeError(got, want), 1e-5) << s.n << "x" << s.k << " m=" << s.m;
  }
}

TEST(Fp8CudaTest, RandomFp8OnTheDeviceEqualsTheHostPreset) {
  GLM_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-fp8");
  ASSERT_TRUE(w.ok()) << w.status();
  RandomWeightOptions options;  // LoadModel's defaults: seed 0, stddev 0.02
  for (const auto& [name, m] : std::vector<std::pair<std::string, const Matrix*>>{
           {"model.layers.0.self_attn.q_proj.weight", &w->layers[0].attn.q_proj},
           {"model.layers.1.mlp.experts.5.down_proj.weight", &w->layers[1].moe.experts[5].down}}) {
    const RandomFp8Stream stream = RandomFp8StreamFor(name, options);
    EXPECT_EQ(m->scales[0], stream.fp8_scale) << name;
    const int64_t n = m->rows * m->cols;
    absl::StatusOr<DeviceBuffer> codes = DeviceBuffer::Create(n);
    ASSERT_TRUE(codes.ok());
    ASSERT_EQ(LaunchRandomFp8(codes->as<uint8_t>(), n, stream.key, stream.value_scale, nullptr),
              cudaSuccess);
    ASSERT_TRUE(SynchronizeDevice().ok());
    std::vector<uint8_t> got(n);
    ASSERT_TRUE(CopyToHost(got.data(), codes->get(), n).ok());
    EXPECT_EQ(0, std::memcmp(got.data(), m->data, n)) << name;
  }
}

TEST(Fp8CudaTest, ManyExpertsMatchTheCpu) {
  GLM_REQUIRE_CUDA_DEVICE();
  constexpr int64_t kExperts = 64, kWidth = 48, kHidden = 160;
  std::vector<std::unique_ptr<Fp8Pair>> experts;
  std::vector<Fp8DeviceMatrix> device;
  for (int64_t e = 0; e < kExperts; ++e) {
    experts.push_back(std::make_unique<Fp8Pair>(kWidth, kHidden, 128, 128, 1000 + e));
    device.push_back(experts.back()->device);
  }
  // Uneven rows per expert: 0 for every third, up to 11 (both kernels) otherwise.
  std::vector<int64_t> offsets = {0};
  for (int64_t e = 0; e < kExperts; ++e) offsets.push_back(offsets.back() + (e % 3 ? e % 12 : 0));
  const int64_t rows = offsets.back();
  const std::vector<float> x = RandomVector(rows * kHidden, 3, 1.0f);
  std::vector<float> want(rows * kWidth);
  for (int64_t e = 0; e < kExperts; ++e) {
    const int64_t r = offsets[e + 1] - offsets[e];
    if (r > 0) {
      Linear(x.data() + offsets[e] * kHidden, r, experts[e]->host, nullptr,
             want.data() + offsets[e] * kWidth);
    }
  }
  DeviceBuffer dx = Upload(x);
  DeviceBuffer dy = Upload(std::vector<float>(rows * kWidth, std::nanf("")));
  ASSERT_EQ(LaunchFp8Experts(static_cast<const float*>(dx.get()), offsets.data(), device.data(),
                             kExperts, static_cast<float*>(dy.get()), nullptr),
            cudaSuccess);
  const std::vector<float> got = Download<float>(dy, want.size());
  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "unwritten output";
  EXPECT_LT(RelativeError(got, want), 1e-5);
}

// The runner's form: bf16 activations, results written with a row stride (a column slice of
// a fused output). Reference: the CPU FP8 path on the same bf16-rounded activations.
TEST(Fp8CudaTest, Bf16InputsIntoAStridedOutput) {
  GLM_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int64_t n, k, br, bc, m;
  };
  for (const Shape& s : std::vector<Shape>{{37, 300, 128, 128, 1},
                                           {48, 160, 128, 128, 8},
                                           {65, 129, 1, 129, 9},
                                           {20, 33, 1, 33, 40}}) {
    Fp8Pair w(s.n, s.k, s.br, s.bc, static_cast<uint32_t>(s.n * 7 + s.k));
    std::vector<float> x = RandomVector(s.m * s.k, 11, 1.0f);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x16[i] = FloatToBf16(x[i]);
      x[i] = Bf16ToFloat(x16[i]);
    }
    std::vector<float> want(s.m * s.n);
    Linear(x.data(), s.m, w.host, nullptr, want.data());
    // Columns [3, 3 + n) of rows of width n + 5: the rest must stay untouched.
    const int64_t ld = s.n + 5;
    std::vector<float> init(s.m * ld);
    for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i);
    DeviceBuffer dx = Upload(x16);
    DeviceBuffer dy = Upload(init);
    ASSERT_EQ(LaunchFp8LinearBf16(static_cast<const uint16_t*>(dx.get()), s.m, w.device,
                                  static_cast<float*>(dy.get()) + 3, ld, nullptr),
              cudaSuccess);
    const std::vector<float> all = Download<float>(dy, init.size());
    std::vector<float> got;
    for (int64_t r = 0; r < s.m; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        if (c >= 3 && c < 3 + s.n) {
          got.push_back(all[r * ld + c]);
        } else {
          ASSERT_EQ(all[r * ld + c], init[r * ld + c]) << "wrote outside its columns";
        }
      }
    }
    EXPECT_LT(RelativeError(got, want), 1e-5) << s.n << "x" << s.k << " m=" << s.m;
  }
}

// The graph-capturable expert kernel: device-side offsets, the experts stacked as the device
// weights hold them, bf16 inputs, a strided output; uneven rows (0 to 19: several passes of 8).
TEST(Fp8CudaTest, ExpertGemvWithDeviceOffsetsMatchesTheCpu) {
  GLM_REQUIRE_CUDA_DEVICE();
  constexpr int64_t kExperts = 40, kWidth = 48, kHidden = 160, kLd = 2 * kWidth;
  for (const int64_t bc : {int64_t{128}, kHidden}) {
    const int64_t br = bc == kHidden ? 1 : 128;  // 128x128 blocks, or per output channel
    std::vector<std::unique_ptr<Fp8Pair>> experts;
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    for (int64_t e = 0; e < kExperts; ++e) {
      experts.push_back(std::make_unique<Fp8Pair>(kWidth, kHidden, br, bc, 2000 + e));
      codes.insert(codes.end(), experts.back()->codes.begin(), experts.back()->codes.end());
      scales.insert(scales.end(), experts.back()->scales.begin(), experts.back()->scales.end());
    }
    std::vector<int32_t> offsets = {0};
    for (int64_t e = 0; e < kExperts; ++e) {
      offsets.push_back(offsets.back() + static_cast<int32_t>(e % 4 ? (e * 7) % 20 : 0));
    }
    const int64_t rows = offsets.back();
    std::vector<float> x = RandomVector(rows * kHidden, 5, 1.0f);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x16[i] = FloatToBf16(x[i]);
      x[i] = Bf16ToFloat(x16[i]);
    }
    std::vector<float> want(rows * kWidth);
    for (int64_t e = 0; e < kExperts; ++e) {
      const int64_t r = offsets[e + 1] - offsets[e];
      if (r > 0) {
        Linear(x.data() + offsets[e] * kHidden, r, experts[e]->host, nullptr,
               want.data() + offsets[e] * kWidth);
      }
    }
    DeviceBuffer d_codes = Upload(codes), d_scales = Upload(scales), d_off = Upload(offsets);
    DeviceBuffer dx = Upload(x16);
    DeviceBuffer dy = Upload(std::vector<float>(rows * kLd, std::nanf("")));
    const Fp8DeviceMatrix expert0{static_cast<const uint8_t*>(d_codes.get()),
                                  static_cast<const float*>(d_scales.get()),
                                  kWidth,
                                  kHidden,
                                  br,
                                  bc};
    ASSERT_EQ(LaunchFp8ExpertGemv(expert0, kExperts, static_cast<const int32_t*>(d_off.get()),
                                  static_cast<const uint16_t*>(dx.get()),
                                  static_cast<float*>(dy.get()) + kWidth, kLd, nullptr),
              cudaSuccess);
    const std::vector<float> all = Download<float>(dy, rows * kLd);
    std::vector<float> got;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < kWidth; ++c) {
        ASSERT_TRUE(std::isnan(all[r * kLd + c])) << "wrote outside its columns";
        got.push_back(all[r * kLd + kWidth + c]);
      }
    }
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "unwritten output";
    EXPECT_LT(RelativeError(got, want), 1e-5) << "block cols " << bc;
  }
}

}  // namespace
}  // namespace glmserve::cuda
