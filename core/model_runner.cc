#include "core/model_runner.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/runner.h"
#include "core/model.h"

namespace glmserve {

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  if (name == "auto") return DeviceKind::kAuto;
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("device '", name, "' is not one of auto, cpu, cuda"));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(ModelWeights weights,
                                                               DeviceKind device,
                                                               CpuMath cpu_math) {
  const bool quantized = weights.linear_format != WeightFormat::kDense;
  if (quantized && device == DeviceKind::kCuda) {
    return absl::FailedPreconditionError(
        "int8 weights (quantized at load) run on the CPU backend only: use --device=cpu");
  }
  if (device == DeviceKind::kCuda ||
      (device == DeviceKind::kAuto && !quantized && CudaDeviceAvailable())) {
    return CreateCudaRunner(std::move(weights));
  }
  return std::unique_ptr<ModelRunner>(std::make_unique<Model>(std::move(weights), cpu_math));
}

}  // namespace glmserve
