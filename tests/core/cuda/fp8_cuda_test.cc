// The CUDA FP8 kernels (core/cuda/fp8_linear.cu) against the CPU's FP8 path (core/cpu/ops/linear.h
// on a kFp8Scaled matrix) on awkward shapes: K not a multiple of 128 (partial scale blocks),
// one output row, one activation row, the GEMV / GEMM boundary, per-channel and 128x128
// block scales, and many experts with uneven (and empty) row counts; the grouped tensor-core
// GEMM of large MoE steps (core/cuda/fp8_moe_gemm_tc.cu) likewise, and its batch invariance;
// its quantized-activation form against the quantized arithmetic and the quantizing GEMV.
// Outputs are poisoned (NaN) before each run so an unwritten element shows.
//
// Tolerance: relative error 1e-5 of the output's norm: both sides multiply the same fp32
// weights (e4m3 x scale, one rounding) by the same fp32 activations; only the summation
// order differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
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

// Experts stacked as the device weights hold them (expert e's codes and scales after expert
// 0's at e times their sizes), each also a host Matrix for the CPU's FP8 path.
struct StackedExperts {
  std::vector<std::unique_ptr<Fp8Pair>> experts;
  DeviceBuffer d_codes, d_scales;
  Fp8DeviceMatrix expert0;
  StackedExperts(int64_t n_experts, int64_t n, int64_t k, int64_t br, int64_t bc, uint32_t seed) {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    for (int64_t e = 0; e < n_experts; ++e) {
      experts.push_back(std::make_unique<Fp8Pair>(n, k, br, bc, seed + static_cast<uint32_t>(e)));
      codes.insert(codes.end(), experts.back()->codes.begin(), experts.back()->codes.end());
      scales.insert(scales.end(), experts.back()->scales.begin(), experts.back()->scales.end());
    }
    d_codes = Upload(codes);
    d_scales = Upload(scales);
    expert0 = {static_cast<const uint8_t*>(d_codes.get()),
               static_cast<const float*>(d_scales.get()),
               n,
               k,
               br,
               bc};
  }
};

std::vector<int32_t> OffsetsOf(const std::vector<int32_t>& counts) {
  std::vector<int32_t> offsets = {0};
  for (const int32_t c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

// LaunchFp8ExpertGemmTc on rows x16 ([pairs, k] bf16, grouped by expert as `offsets` says) into
// columns [kCol, kCol + n) of NaN-poisoned rows of width n + kPad, plus guard rows past
// `pairs`; everything outside those columns and rows must stay NaN. Returns out [pairs, n].
constexpr int64_t kCol = 3, kPad = 8, kGuardRows = 2;
std::vector<float> RunExpertGemmTc(const StackedExperts& w, const std::vector<int32_t>& offsets,
                                   const std::vector<uint16_t>& x16) {
  const int64_t n = w.expert0.rows, ld = n + kPad, pairs = offsets.back();
  const int64_t n_experts = static_cast<int64_t>(offsets.size()) - 1;
  DeviceBuffer d_off = Upload(offsets), dx = Upload(x16);
  DeviceBuffer dy = Poisoned<float>((pairs + kGuardRows) * ld);
  EXPECT_EQ(LaunchFp8ExpertGemmTc(w.expert0, n_experts, static_cast<const int32_t*>(d_off.get()),
                                  pairs, static_cast<const uint16_t*>(dx.get()),
                                  static_cast<float*>(dy.get()) + kCol, ld, nullptr),
            cudaSuccess);
  const std::vector<float> all = Download<float>(dy, (pairs + kGuardRows) * ld);
  std::vector<float> got;
  int64_t outside_written = 0, inside_unwritten = 0;
  for (int64_t r = 0; r < pairs + kGuardRows; ++r) {
    for (int64_t c = 0; c < ld; ++c) {
      const float v = all[r * ld + c];
      if (r < pairs && c >= kCol && c < kCol + n) {
        inside_unwritten += std::isfinite(v) ? 0 : 1;
        got.push_back(v);
      } else {
        outside_written += std::isnan(v) ? 0 : 1;
      }
    }
  }
  EXPECT_EQ(inside_unwritten, 0) << "unwritten outputs";
  EXPECT_EQ(outside_written, 0) << "wrote outside its columns or past `pairs`";
  return got;
}

// bf16 activations [rows, k], and the same values in fp32 for the CPU.
void RandomBf16Rows(int64_t rows, int64_t k, uint32_t seed, std::vector<uint16_t>* x16,
                    std::vector<float>* x) {
  *x = RandomVector(rows * k, seed, 1.0f);
  x16->resize(x->size());
  for (size_t i = 0; i < x->size(); ++i) {
    (*x16)[i] = FloatToBf16((*x)[i]);
    (*x)[i] = Bf16ToFloat((*x16)[i]);
  }
}

// The grouped tensor-core GEMM of large FP8 MoE steps against the CPU's FP8 path, expert by
// expert: one row in all; 0, 1, 63, 64, 65 and 130 rows per expert (several without rows);
// every expert chosen; n and k off the 64-column and 32-deep tiles; per-channel scales,
// 128x128 blocks cut short at both edges (k 300 = 128 + 128 + 44, n 200 = 128 + 72), and
// blocks wider than k (one scale per 128 output rows: the per-row form). A strided output at
// a column offset, every row checked. Tolerance: each row within 1e-5 of its norm (the
// weights' values differ from the CPU's only in where the scale multiplies; fp32 sums).
TEST(Fp8CudaTest, ExpertGemmTcMatchesTheCpu) {
  GLM_REQUIRE_CUDA_DEVICE();
  struct Case {
    int64_t n, k, br, bc;
    std::vector<int32_t> counts;
  };
  const std::vector<int32_t> edges = {63, 0, 1, 130, 0, 64, 65, 0};
  const std::vector<int32_t> every = {3, 70, 17, 64, 2, 129};
  for (const Case& t : std::vector<Case>{{72, 300, 1, 300, edges},
                                         {200, 300, 128, 128, every},
                                         {130, 160, 128, 128, {0, 0, 1, 0, 0}},
                                         {40, 37, 128, 128, edges},
                                         {64, 96, 1, 96, every}}) {
    const std::string name = std::to_string(t.n) + "x" + std::to_string(t.k) + " blocks " +
                             std::to_string(t.br) + "x" + std::to_string(t.bc);
    const int64_t n_experts = static_cast<int64_t>(t.counts.size());
    StackedExperts w(n_experts, t.n, t.k, t.br, t.bc, static_cast<uint32_t>(3000 + t.n));
    ASSERT_TRUE(Fp8ExpertGemmTcSupported(w.expert0)) << name;
    const std::vector<int32_t> offsets = OffsetsOf(t.counts);
    const int64_t pairs = offsets.back();
    std::vector<uint16_t> x16;
    std::vector<float> x;
    RandomBf16Rows(pairs, t.k, static_cast<uint32_t>(t.k), &x16, &x);
    std::vector<float> want(pairs * t.n);
    for (int64_t e = 0; e < n_experts; ++e) {
      if (t.counts[e] == 0) continue;
      Linear(x.data() + offsets[e] * t.k, t.counts[e], w.experts[e]->host, nullptr,
             want.data() + offsets[e] * t.n);
    }
    const std::vector<float> got = RunExpertGemmTc(w, offsets, x16);
    ASSERT_EQ(got.size(), want.size()) << name;
    double worst = 0;
    int64_t worst_row = -1, beyond = 0;
    for (int64_t r = 0; r < pairs; ++r) {
      const double err = RelativeError(got.data() + r * t.n, want.data() + r * t.n, t.n);
      beyond += err < 1e-5 ? 0 : 1;
      if (err > worst) {
        worst = err;
        worst_row = r;
      }
    }
    std::printf("%s, %lld rows: worst row error %.2e\n", name.c_str(),
                static_cast<long long>(pairs), worst);
    EXPECT_EQ(beyond, 0) << name << ": rows beyond 1e-5, the worst " << worst_row << " at "
                         << worst;
  }
}

// A row's result is its own: the same rows of each expert computed among other rows (at other
// positions in the 64-row tiles, other experts busier) give the same bits.
TEST(Fp8CudaTest, ExpertGemmTcRowsAreBatchInvariant) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const int64_t bc : {int64_t{128}, int64_t{260}}) {
    const int64_t n = 70, k = 260, br = bc == 128 ? 128 : 1;
    const std::vector<int32_t> counts = {5, 70, 0, 33};
    const std::vector<int32_t> before = {1, 30, 4, 64}, after = {2, 0, 9, 1};
    StackedExperts w(static_cast<int64_t>(counts.size()), n, k, br, bc, 4000);
    std::vector<uint16_t> x16, others;
    std::vector<float> unused;
    RandomBf16Rows(OffsetsOf(counts).back(), k, 41, &x16, &unused);
    RandomBf16Rows(200, k, 42, &others, &unused);
    // The second batch: expert e's rows behind before[e] other rows and ahead of after[e].
    std::vector<uint16_t> mixed;
    std::vector<int32_t> mixed_counts, own_row;  // own_row: where each first-batch row went
    int64_t next_other = 0, next_own = 0;
    const auto append_others = [&](int32_t rows) {
      mixed.insert(mixed.end(), others.begin() + next_other * k,
                   others.begin() + (next_other + rows) * k);
      next_other += rows;
    };
    for (size_t e = 0; e < counts.size(); ++e) {
      append_others(before[e]);
      for (int32_t i = 0; i < counts[e]; ++i, ++next_own) {
        own_row.push_back(static_cast<int32_t>(mixed.size() / k));
        mixed.insert(mixed.end(), x16.begin() + next_own * k, x16.begin() + (next_own + 1) * k);
      }
      append_others(after[e]);
      mixed_counts.push_back(before[e] + counts[e] + after[e]);
    }
    const std::vector<float> alone = RunExpertGemmTc(w, OffsetsOf(counts), x16);
    const std::vector<float> among = RunExpertGemmTc(w, OffsetsOf(mixed_counts), mixed);
    for (size_t r = 0; r < own_row.size(); ++r) {
      EXPECT_EQ(0,
                std::memcmp(alone.data() + r * n, among.data() + own_row[r] * n, sizeof(float) * n))
          << "row " << r << " block cols " << bc;
    }
  }
}

// Scale blocks the grouped GEMM does not serve: cudaErrorNotSupported, nothing launched (the
// runner keeps its per-expert FP8 GEMMs for them).
TEST(Fp8CudaTest, ExpertGemmTcRefusesOtherBlockShapes) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const auto& [br, bc] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {32, 128}, {128, 16}, {128, 1}}) {
    StackedExperts w(2, 70, 300, br, bc, 5000);
    EXPECT_FALSE(Fp8ExpertGemmTcSupported(w.expert0)) << br << "x" << bc;
    const std::vector<int32_t> offsets = {0, 3, 5};
    DeviceBuffer d_off = Upload(offsets);
    DeviceBuffer dx = Upload(std::vector<uint16_t>(5 * 300, 0x3f80));
    DeviceBuffer dy = Poisoned<float>(5 * 70);
    EXPECT_EQ(LaunchFp8ExpertGemmTc(w.expert0, 2, static_cast<const int32_t*>(d_off.get()), 5,
                                    static_cast<const uint16_t*>(dx.get()),
                                    static_cast<float*>(dy.get()), 70, nullptr),
              cudaErrorNotSupported)
        << br << "x" << bc;
    for (float v : Download<float>(dy, 5 * 70)) ASSERT_TRUE(std::isnan(v)) << "wrote output";
  }
}

// Quantized activation rows as fp8_quant.cu leaves them: e4m3 codes [rows, k] and one scale
// per row and 128-wide group, here row-major [rows, G] (Upload transposes to [G, scale_ld]).
struct QuantRows {
  int64_t k = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t rows() const { return static_cast<int64_t>(codes.size()) / k; }
  int64_t groups() const { return Fp8ActGroups(k); }
  void Append(const QuantRows& from, int64_t row) {
    codes.insert(codes.end(), from.codes.begin() + row * k, from.codes.begin() + (row + 1) * k);
    scales.insert(scales.end(), from.scales.begin() + row * groups(),
                  from.scales.begin() + (row + 1) * groups());
  }
};

// Random codes (of N(0, 100) values, some subnormal) and scales |N(0, 1)| / 448 + 1e-3.
QuantRows RandomQuantRows(int64_t rows, int64_t k, uint32_t seed) {
  QuantRows q;
  q.k = k;
  for (float v : RandomVector(rows * k, seed, 100.0f)) q.codes.push_back(FloatToE4m3(v));
  for (int64_t i = 0; i < rows * k; i += 13) q.codes[i] = static_cast<uint8_t>(i % 8);
  for (float v : RandomVector(rows * q.groups(), seed + 7, 1.0f)) {
    q.scales.push_back(std::fabs(v) / 448 + 1e-3f);
  }
  return q;
}

// The quantized arithmetic in double, per element: sum over c of x_scale[i, c / 128] x
// w_scale[n / br, c / bc] x e4m3(W[n, c]) x e4m3(x[i, c]) (the per-channel form is the case
// bc >= k), with S = the sum of the terms' magnitudes, which bounds fp32 summation errors.
void QuantizedReference(const Fp8Pair& w, const QuantRows& x, int64_t first, int64_t rows,
                        double* out, double* magnitude) {
  const int64_t n = w.host.rows, k = w.host.cols;
  const int64_t br = w.host.scale_block_rows, bc = w.host.scale_block_cols;
  const int64_t scale_cols = (k + bc - 1) / bc;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = static_cast<double>(x.scales[(first + i) * x.groups() + c / 128]) *
                         w.scales[(r / br) * scale_cols + c / bc] *
                         E4m3ToFloat(w.codes[r * k + c]) *
                         E4m3ToFloat(x.codes[(first + i) * k + c]);
        sum += t;
        mag += std::fabs(t);
      }
      out[i * n + r] = sum;
      magnitude[i * n + r] = mag;
    }
  }
}

// LaunchFp8ExpertGemmTcQ (or, gemv true, LaunchFp8ExpertGemvVecQ) on the quantized rows x
// (scales at scale_ld = pairs + kScalePad), as RunExpertGemmTc does: columns [kCol, kCol + n)
// of NaN-poisoned rows plus guard rows, nothing outside written. Returns out [pairs, n].
constexpr int64_t kScalePad = 3;
std::vector<float> RunExpertGemmTcQ(const StackedExperts& w, const std::vector<int32_t>& offsets,
                                    const QuantRows& x, bool gemv = false) {
  const int64_t n = w.expert0.rows, ld = n + kPad, pairs = offsets.back();
  const int64_t n_experts = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t scale_ld = pairs + kScalePad;
  std::vector<float> scales(x.groups() * scale_ld, std::nanf(""));
  for (int64_t i = 0; i < pairs; ++i) {
    for (int64_t g = 0; g < x.groups(); ++g)
      scales[g * scale_ld + i] = x.scales[i * x.groups() + g];
  }
  DeviceBuffer d_off = Upload(offsets), d_codes = Upload(x.codes), d_scales = Upload(scales);
  DeviceBuffer dy = Poisoned<float>((pairs + kGuardRows) * ld);
  const auto* off = static_cast<const int32_t*>(d_off.get());
  const auto* codes = static_cast<const uint8_t*>(d_codes.get());
  const auto* sc = static_cast<const float*>(d_scales.get());
  float* y = static_cast<float*>(dy.get()) + kCol;
  EXPECT_EQ(
      gemv ? LaunchFp8ExpertGemvVecQ(w.expert0, n_experts, off, codes, sc, scale_ld, y, ld, nullptr)
           : LaunchFp8ExpertGemmTcQ(w.expert0, n_experts, off, pairs, codes, sc, scale_ld, y, ld,
                                    nullptr),
      cudaSuccess);
  const std::vector<float> all = Download<float>(dy, (pairs + kGuardRows) * ld);
  std::vector<float> got;
  int64_t outside_written = 0, inside_unwritten = 0;
  for (int64_t r = 0; r < pairs + kGuardRows; ++r) {
    for (int64_t c = 0; c < ld; ++c) {
      const float v = all[r * ld + c];
      if (r < pairs && c >= kCol && c < kCol + n) {
        inside_unwritten += std::isfinite(v) ? 0 : 1;
        got.push_back(v);
      } else {
        outside_written += std::isnan(v) ? 0 : 1;
      }
    }
  }
  EXPECT_EQ(inside_unwritten, 0) << "unwritten outputs";
  EXPECT_EQ(outside_written, 0) << "wrote outside its columns or past `pairs`";
  return got;
}

// The quantized-activation form of the grouped GEMM (FP8 tensor cores on) against the
// quantized arithmetic in double on ExpertGemmTcMatchesTheCpu's shapes (one row in all; 0, 1,
// 63, 64, 65, 129 and 130 rows per expert; n, k off the tiles; 128x128 blocks cut short at both
// edges; per-channel scales; k off the 128-wide activation groups), and, where it applies
// (k and block_cols multiples of 16), against LaunchFp8ExpertGemvVecQ, the small-step path.
// Bound, per element: both kernels form exact products (codes widen exactly; the scales
// multiply partial sums) and sum at most k + 3 fp32 terms, so each lies within about
// (k + 4) u S of the exact value (u = 2^-24, S = the sum of the terms' magnitudes); doubled
// for tensor cores whose fp32 accumulation need not round to nearest: (k + 4) 2^-23 S
// against the double reference, (k + 4) 2^-22 S between the two kernels.
TEST(Fp8CudaTest, ExpertGemmTcQMatchesTheQuantizedArithmetic) {
  GLM_REQUIRE_CUDA_DEVICE();
  struct Case {
    int64_t n, k, br, bc;
    std::vector<int32_t> counts;
  };
  const std::vector<int32_t> edges = {63, 0, 1, 130, 0, 64, 65, 0};
  const std::vector<int32_t> every = {3, 70, 17, 64, 2, 129};
  for (const Case& t : std::vector<Case>{{72, 300, 1, 300, edges},
                                         {200, 300, 128, 128, every},
                                         {130, 160, 128, 128, {0, 0, 1, 0, 0}},
                                         {40, 37, 128, 128, edges},
                                         {64, 96, 1, 96, every},
                                         {70, 256, 128, 128, {9, 0, 66}}}) {
    const std::string name = std::to_string(t.n) + "x" + std::to_string(t.k) + " blocks " +
                             std::to_string(t.br) + "x" + std::to_string(t.bc);
    const int64_t n_experts = static_cast<int64_t>(t.counts.size());
    StackedExperts w(n_experts, t.n, t.k, t.br, t.bc, static_cast<uint32_t>(6000 + t.n));
    const std::vector<int32_t> offsets = OffsetsOf(t.counts);
    const int64_t pairs = offsets.back();
    const QuantRows x = RandomQuantRows(pairs, t.k, static_cast<uint32_t>(t.k + 11));
    std::vector<double> want(pairs * t.n), mag(pairs * t.n);
    for (int64_t e = 0; e < n_experts; ++e) {
      QuantizedReference(*w.experts[e], x, offsets[e], t.counts[e], want.data() + offsets[e] * t.n,
                         mag.data() + offsets[e] * t.n);
    }
    const std::vector<float> got = RunExpertGemmTcQ(w, offsets, x);
    ASSERT_EQ(got.size(), want.size()) << name;
    const double u2 = std::ldexp(1.0, -23);
    int64_t beyond = 0;
    double worst = 0;  // |error| / S
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(got[i] - want[i]);
      beyond += err <= (t.k + 4) * u2 * mag[i] ? 0 : 1;
      worst = std::max(worst, err / mag[i]);
    }
    std::printf("%s, %lld rows: worst |error| / S %.2e (bound %.2e)\n", name.c_str(),
                static_cast<long long>(pairs), worst, (t.k + 4) * u2);
    EXPECT_EQ(beyond, 0) << name << ": elements beyond the bound, worst |error| / S " << worst;
    if (t.k % 16 == 0 && (t.bc >= t.k || t.bc % 16 == 0)) {
      const std::vector<float> gemv = RunExpertGemmTcQ(w, offsets, x, /*gemv=*/true);
      ASSERT_EQ(gemv.size(), got.size()) << name;
      int64_t apart = 0;
      double widest = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(got[i] - gemv[i]);
        apart += d <= (t.k + 4) * 2 * u2 * mag[i] ? 0 : 1;
        widest = std::max(widest, d / mag[i]);
      }
      std::printf("  against LaunchFp8ExpertGemvVecQ: widest |difference| / S %.2e\n", widest);
      EXPECT_EQ(apart, 0) << name << ": elements apart from LaunchFp8ExpertGemvVecQ's";
    }
  }
}

// The quantized form's rows are their own too (ExpertGemmTcRowsAreBatchInvariant's batches).
TEST(Fp8CudaTest, ExpertGemmTcQRowsAreBatchInvariant) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const int64_t bc : {int64_t{128}, int64_t{260}}) {
    const int64_t n = 70, k = 260, br = bc == 128 ? 128 : 1;
    const std::vector<int32_t> counts = {5, 70, 0, 33};
    const std::vector<int32_t> before = {1, 30, 4, 64}, after = {2, 0, 9, 1};
    StackedExperts w(static_cast<int64_t>(counts.size()), n, k, br, bc, 7000);
    const QuantRows own = RandomQuantRows(OffsetsOf(counts).back(), k, 51);
    const QuantRows others = RandomQuantRows(200, k, 52);
    QuantRows mixed;
    mixed.k = k;
    std::vector<int32_t> mixed_counts, own_row;
    int64_t next_other = 0, next_own = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      for (int32_t i = 0; i < before[e]; ++i) mixed.Append(others, next_other++);
      for (int32_t i = 0; i < counts[e]; ++i) {
        own_row.push_back(static_cast<int32_t>(mixed.rows()));
        mixed.Append(own, next_own++);
      }
      for (int32_t i = 0; i < after[e]; ++i) mixed.Append(others, next_other++);
      mixed_counts.push_back(before[e] + counts[e] + after[e]);
    }
    const std::vector<float> alone = RunExpertGemmTcQ(w, OffsetsOf(counts), own);
    const std::vector<float> among = RunExpertGemmTcQ(w, OffsetsOf(mixed_counts), mixed);
    for (size_t r = 0; r < own_row.size(); ++r) {
      EXPECT_EQ(0,
                std::memcmp(alone.data() + r * n, among.data() + own_row[r] * n, sizeof(float) * n))
          << "row " << r << " block cols " << bc;
    }
  }
}

// The quantized form refuses the same block shapes, writing nothing.
TEST(Fp8CudaTest, ExpertGemmTcQRefusesOtherBlockShapes) {
  GLM_REQUIRE_CUDA_DEVICE();
  for (const auto& [br, bc] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {32, 128}, {128, 16}, {128, 1}}) {
    StackedExperts w(2, 70, 300, br, bc, 8000);
    const std::vector<int32_t> offsets = {0, 3, 5};
    DeviceBuffer d_off = Upload(offsets);
    DeviceBuffer dx = Upload(std::vector<uint8_t>(5 * 300, 0x38));
    DeviceBuffer ds = Upload(std::vector<float>(5 * 3, 1.f));
    DeviceBuffer dy = Poisoned<float>(5 * 70);
    EXPECT_EQ(LaunchFp8ExpertGemmTcQ(w.expert0, 2, static_cast<const int32_t*>(d_off.get()), 5,
                                     static_cast<const uint8_t*>(dx.get()),
                                     static_cast<const float*>(ds.get()), 5,
                                     static_cast<float*>(dy.get()), 70, nullptr),
              cudaErrorNotSupported)
        << br << "x" << bc;
    for (float v : Download<float>(dy, 5 * 70)) ASSERT_TRUE(std::isnan(v)) << "wrote output";
  }
}

}  // namespace
}  // namespace glmserve::cuda
