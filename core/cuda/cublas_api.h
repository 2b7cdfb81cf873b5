// cuBLAS, loaded at run time with dlopen instead of linked.
//
// Why: libcublasLt carries about 92 KiB of static thread-local storage. A library linked at
// startup has its TLS reserved in every thread's stack, so any library that starts threads
// with small fixed stacks fails (civetweb, behind prometheus-cpp's /metrics exposer, gets
// EINVAL from pthread_create and the server cannot serve metrics). A dlopen'ed library's TLS
// is allocated per thread on first use instead. Loading late also keeps a CPU-only run of the
// CUDA build from touching cuBLAS at all.
#pragma once

#include <cublas_v2.h>

#include "absl/status/status.h"

namespace glmserve::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  // cublasGemmEx is overloaded in C++ (a compatibility inline): spell out the C entry point.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas once (thread-safe); FAILED_PRECONDITION naming the library if it cannot.
absl::Status LoadCublas();
// The loaded functions; only valid after LoadCublas() succeeded.
const CublasApi& Cublas();

}  // namespace glmserve::cuda
