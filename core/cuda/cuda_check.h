// CUDA runtime and cuBLAS results turned into absl::Status: the backend never aborts on a
// device error, it reports it to the caller (allocation failures as RESOURCE_EXHAUSTED,
// everything else as INTERNAL), with the failing call and its source location.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "core/base/status_macros.h"

namespace glmserve::cuda {

absl::Status CudaError(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasError(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace glmserve::cuda

#define GLM_CUDA_RETURN_IF_ERROR(call)                                                \
  do {                                                                                \
    const cudaError_t glm_cuda_error_ = (call);                                       \
    if (glm_cuda_error_ != cudaSuccess) {                                             \
      return ::glmserve::cuda::CudaError(glm_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (false)

#define GLM_CUBLAS_RETURN_IF_ERROR(call)                                                   \
  do {                                                                                     \
    const cublasStatus_t glm_cublas_status_ = (call);                                      \
    if (glm_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
      return ::glmserve::cuda::CublasError(glm_cublas_status_, #call, __FILE__, __LINE__); \
    }                                                                                      \
  } while (false)
