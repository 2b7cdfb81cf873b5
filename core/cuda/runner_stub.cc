// Built when GLMSERVE_CUDA is off: the CUDA entry points say so.
#include "absl/status/status.h"
#include "core/cuda/runner.h"

namespace glmserve {

bool CudaDeviceAvailable() { return false; }

std::string CudaDeviceDescription() { return "built without the CUDA backend"; }

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(ModelWeights) {
  return absl::FailedPreconditionError(
      "--device=cuda: this build has no CUDA backend (configure with nvcc present and "
      "-DGLMSERVE_CUDA=ON)");
}

}  // namespace glmserve
