// Tensor-core FP8 GEMM for prefill through cuBLASLt's block-scaled FP8 matmul (Hopper, CUDA
// 12.9+; docs/cuda.md "FP8 on tensor cores"):
//
//   x_codes [m, k], x_scales [G, m] = e4m3 quantization of x [m, k] bf16 per token and 1x128
//                                     group, G = ceil(k / 128) (fp8_quant.cu)
//   y^T [n, m] = sum_g sA[g] sB[g] W_codes[:, g] . x_codes[:, g]^T
//                cublasLtMatmul, E4M3 x E4M3, fp32 compute and output, "TN": A = W (n x k,
//                transposed), B = x; A scale mode BLK128x128_32F (one scale per 128x128 block
//                of W), B scale mode VEC128_32F (one per token and 128-wide group)
//   128x128 block weights (quant_method fp8): sA = their block scales (weight_scale_inv), k-block
//                stride padded to a multiple of 4 when it is not one already;
//   per-channel weights (compressed-tensors): sA = 1 and y[i, c] *= w_scales[c] afterwards
//                (the epilogue kernel).
//
// Declined (Run reports false, the caller keeps quantized activations on CUDA cores): shapes
// the documentation excludes (k not a multiple of 16, m or n not a multiple of 4), blocks other
// than 128x128, unaligned operands, dimensions beyond 65536 (the scale buffers' bound) and
// anything cuBLASLt's heuristic finds no algorithm for (the block-scaled modes exist on compute
// capability 9.0 only). Accuracy: the activations' e4m3 rounding (3 mantissa bits, one scale
// per 128 values) is the error against the CPU FP8 path, which keeps fp32 activations;
// tests/core/cuda/fp8_gemm_cuda_test.cc.
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
  // (Compute capability 8.9 passes: its heuristic then declines the block-scaled modes per
  // shape, which the caller logs.)
  static absl::StatusOr<std::unique_ptr<Fp8TensorCoreGemm>> Create(int device);
  ~Fp8TensorCoreGemm();
  Fp8TensorCoreGemm(const Fp8TensorCoreGemm&) = delete;
  Fp8TensorCoreGemm& operator=(const Fp8TensorCoreGemm&) = delete;

  // Whether w is in a form this GEMM serves: per output channel, or 128x128 blocks.
  static bool PerChannel(const Fp8DeviceMatrix& w) {
    return w.block_rows == 1 && w.block_cols >= w.cols;
  }
  static bool Serves(const Fp8DeviceMatrix& w) {
    return PerChannel(w) || (w.block_rows == 128 && w.block_cols == 128);
  }

  // y[i * y_ld + c] = x[i, :] . W[c, :] for i < m, c < w.rows (fp32, y_ld >= w.rows), through
  // x_codes [m, w.cols] and x_scales [G * m] (scratch, 256-byte aligned; the quantizer's
  // layout with scale_ld = m). Sets *ran to false, enqueuing nothing, when this shape or these
  // addresses are declined (*why says which); errors are launch or cuBLASLt failures.
  // Host-side only besides the enqueued work: capturable.
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
  float* ones_ = nullptr;      // kMaxScaleFloats ones: the per-channel form's A block scales
  float* padded_ = nullptr;    // kMaxScaleFloats: block scales with a k stride padded to 4
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace glmserve::cuda
