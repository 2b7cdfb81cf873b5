// Linear layers on the GPU through cuBLAS: y[m, n] = x[m, k] W[n, k]^T, row-major, fp32
// accumulation (CUBLAS_COMPUTE_32F; bf16 inputs run on tensor cores, fp32 inputs stay full
// fp32: TF32 is never enabled).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "absl/status/status.h"

namespace glmserve::cuda {

struct GemmOperand {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_16BF;
  int64_t ld = 0;  // elements between consecutive rows
};

// y[m, n] (row stride y_ld, type y_type) = x[m, k] . w[n, k]^T (+ y when accumulate).
// m == 0 is a no-op. The handle's stream and workspace are the caller's.
absl::Status Gemm(cublasHandle_t handle, const GemmOperand& w, int64_t n, int64_t k,
                  const GemmOperand& x, int64_t m, void* y, cudaDataType y_type, int64_t y_ld,
                  bool accumulate = false);

}  // namespace glmserve::cuda
