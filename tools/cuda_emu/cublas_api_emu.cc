// The emulator's cuBLAS table: the fake functions of fake/cublas_v2.h, no dlopen.
#include "core/cuda/cublas_api.h"

namespace glmserve::cuda {

absl::Status LoadCublas() { return absl::OkStatus(); }

const CublasApi& Cublas() {
  static const CublasApi api{cublasCreate,         cublasDestroy, cublasSetStream,
                             cublasSetWorkspace,   cublasGemmEx,  cublasGetStatusName,
                             cublasGetStatusString};
  return api;
}

}  // namespace glmserve::cuda
