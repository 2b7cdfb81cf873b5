// Tensor-core FP8 GEMM for prefill through cuBLASLt (docs/cuda.md "FP8 on tensor cores"):
//
//   x_codes[m, k], x_scales[m] = per-token e4m3 quantization of x [m, k] bf16 (fp8_quant.cu)
//   y^T [n, m] = W_codes [n, k] . x_codes^T       cublasLtMatmul, E4M3 x E4M3, fp32 compute
//                                                 and output ("TN": A = W transposed, B = x)
//   y[i, c] *= x_scales[i] * w_scales[c]          the epilogue kernel (per token x per channel)
//
// for FP8 weights in the per-output-channel form (compressed-tensors: block_rows 1,
// block_cols = cols). The 128x128 block form, shapes cuBLASLt's heuristic finds no FP8
// algorithm for (pre-Ada devices, k not a multiple of 16, unaligned operands) and a missing
// libcublasLt are not run here: Run reports false and the caller takes the CUDA-core kernel.
// Accuracy: the activations' e4m3 rounding (3 mantissa bits, per-token scale) is the new error
// against the CPU FP8 path (which keeps fp32 activations); tests/core/cuda/fp8_gemm_cuda_test.cc.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {

class Fp8TensorCoreGemm {
 public:
  // FAILED_PRECONDITION with the reason when FP8 tensor cores cannot be used at all: the
  // device is below compute capability 8.9, or libcublasLt cannot be loaded.
  static absl::StatusOr<std::unique_ptr<Fp8TensorCoreGemm>> Create(int device);
  ~Fp8TensorCoreGemm();
  Fp8TensorCoreGemm(const Fp8TensorCoreGemm&) = delete;
  Fp8TensorCoreGemm& operator=(const Fp8TensorCoreGemm&) = delete;

  // Whether w is in the form this GEMM serves (per output channel).
  static bool Serves(const Fp8DeviceMatrix& w) {
    return w.block_rows == 1 && w.block_cols >= w.cols;
  }

  // y[i * y_ld + c] = x[i, :] . W[c, :] for i < m, c < w.rows (fp32, y_ld >= w.rows), through
  // x_codes [m, w.cols] and x_scales [m] (scratch). Sets *ran to false, enqueuing nothing, when
  // this shape or these addresses have no cuBLASLt FP8 algorithm (*why says which); errors
  // are launch or cuBLASLt failures. Host-side only besides the enqueued work: capturable.
  absl::Status Run(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w, float* y, int64_t y_ld,
                   uint8_t* x_codes, float* x_scales, cudaStream_t stream, bool* ran,
                   std::string* why);

 private:
  Fp8TensorCoreGemm() = default;
  // A heuristic result per (m, n, k, y_ld); found false: no algorithm.
  struct Plan {
    bool found = false;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
  };
  absl::StatusOr<const Plan*> PlanFor(int64_t m, int64_t n, int64_t k, int64_t y_ld);

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  void* workspace_ = nullptr;  // device memory, kWorkspaceBytes
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace glmserve::cuda
