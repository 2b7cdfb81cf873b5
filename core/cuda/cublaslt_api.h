// cuBLASLt, loaded at run time with dlopen like cuBLAS (core/cuda/cublas_api.h says why:
// libcublasLt's static TLS), for the tensor-core FP8 GEMM (core/cuda/fp8_gemm.h). Only the
// entry points that GEMM uses.
#pragma once

#include <cublasLt.h>

#include "absl/status/status.h"

namespace glmserve::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// Loads libcublasLt once (thread-safe); FAILED_PRECONDITION naming the library if it cannot.
absl::Status LoadCublasLt();
// The loaded functions; only valid after LoadCublasLt() succeeded.
const CublasLtApi& CublasLt();

}  // namespace glmserve::cuda
