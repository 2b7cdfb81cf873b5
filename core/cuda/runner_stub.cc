// Built when GLMSERVE_CUDA is off: the CUDA entry points say so.
#include <utility>

#include "absl/status/status.h"
#include "core/cuda/runner.h"

namespace glmserve {

bool CudaDeviceAvailable() { return false; }

std::string CudaDeviceDescription() { return "built without the CUDA backend"; }

absl::StatusOr<GpuMemoryInfo> CudaMemoryInfo() {
  return absl::FailedPreconditionError("built without the CUDA backend");
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    ModelWeights weights, const LoadProgressCallback& /*upload_progress*/,
    Fp8TensorCores /*fp8_tensor_cores*/) {
  if (std::string why = CudaUnsupportedReason(weights.config); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  return absl::FailedPreconditionError(
      "--device=cuda: this build has no CUDA backend (configure with nvcc present and "
      "-DGLMSERVE_CUDA=ON)");
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaTensorParallelRunner(
    ModelWeights weights, const ParallelConfig& /*parallel*/,
    const LoadProgressCallback& upload_progress, Fp8TensorCores fp8_tensor_cores,
    std::string* /*how*/) {
  return CreateCudaRunner(std::move(weights), upload_progress, fp8_tensor_cores);
}

absl::StatusOr<std::string> NewCudaGroupId() {
  return absl::FailedPreconditionError("CUDA ranks: this build has no CUDA backend");
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinCudaGroup(const std::string&, int,
                                                                         int, int, int) {
  return absl::FailedPreconditionError("CUDA ranks: this build has no CUDA backend");
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRank(const ModelWeights&,
                                                            const ParallelConfig&, int, int,
                                                            Communicator*, Fp8TensorCores) {
  return absl::FailedPreconditionError("CUDA ranks: this build has no CUDA backend");
}

}  // namespace glmserve
