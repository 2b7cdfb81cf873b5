// Device selection, in every build: with or without the CUDA backend and with or without a
// GPU, --device=cuda either gives a GPU runner or a clear FAILED_PRECONDITION, and auto falls
// back to the CPU.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"

namespace glmserve {
namespace {

ModelWeights Tiny() {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ModelWeights> w = RandomWeights(*config);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

TEST(CudaRunner, DescriptionSaysWhy) {
  const std::string d = CudaDeviceDescription();
  EXPECT_FALSE(d.empty());
  if (!CudaDeviceAvailable()) {
    EXPECT_TRUE(absl::StartsWith(d, "no CUDA device: ") ||
                absl::StartsWith(d, "built without the CUDA backend"))
        << d;
  } else {
    EXPECT_TRUE(absl::StartsWith(d, "cuda:")) << d;
  }
}

TEST(CudaRunner, ExplicitCudaNeedsADevice) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(Tiny(), DeviceKind::kCuda);
  if (CudaDeviceAvailable()) {
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_TRUE(absl::StartsWith((*runner)->device_name(), "cuda:")) << (*runner)->device_name();
    return;
  }
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_TRUE(absl::StrContains(runner.status().message(), "--device=cuda")) << runner.status();
  EXPECT_TRUE(absl::StrContains(runner.status().message(), "CUDA")) << runner.status();
}

TEST(CudaRunner, AutoUsesTheGpuOnlyWhenPresent) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(Tiny(), DeviceKind::kAuto);
  ASSERT_TRUE(runner.ok()) << runner.status();
  if (CudaDeviceAvailable()) {
    EXPECT_TRUE(absl::StartsWith((*runner)->device_name(), "cuda:"));
  } else {
    EXPECT_EQ((*runner)->device_name(), "cpu");
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> cpu = CreateModelRunner(Tiny(), DeviceKind::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device_name(), "cpu");
}

TEST(CudaRunner, ParsesDeviceNames) {
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_EQ(*ParseDeviceKind("auto"), DeviceKind::kAuto);
  EXPECT_FALSE(ParseDeviceKind("gpu").ok());
}

TEST(CudaRunner, ParsesFp8TensorCoreModes) {
  EXPECT_EQ(*ParseFp8TensorCores("auto"), Fp8TensorCores::kAuto);
  EXPECT_EQ(*ParseFp8TensorCores("on"), Fp8TensorCores::kOn);
  EXPECT_EQ(*ParseFp8TensorCores("off"), Fp8TensorCores::kOff);
  const absl::StatusOr<Fp8TensorCores> bad = ParseFp8TensorCores("true");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, on, off"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace glmserve
