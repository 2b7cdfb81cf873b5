#include <limits>

#include "absl/strings/str_cat.h"
#include "core/cuda/cublas_api.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/gemm.h"

namespace glmserve::cuda {

absl::Status Gemm(cublasHandle_t handle, const GemmOperand& w, int64_t n, int64_t k,
                  const GemmOperand& x, int64_t m, void* y, cudaDataType y_type, int64_t y_ld,
                  bool accumulate) {
  if (m == 0 || n == 0) return absl::OkStatus();
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m < 0 || n < 0 || k <= 0 || m > kMax || n > kMax || k > kMax || w.ld > kMax || x.ld > kMax ||
      y_ld > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM shape out of range: m ", m, ", n ", n, ", k ", k));
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Row-major y = x W^T is column-major y^T = W x^T: W [n, k] row-major is the column-major
  // k x n matrix with ld k, used transposed; x [m, k] row-major is column-major k x m.
  GLM_CUBLAS_RETURN_IF_ERROR(
      Cublas().gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                       static_cast<int>(k), &alpha, w.data, w.type, static_cast<int>(w.ld), x.data,
                       x.type, static_cast<int>(x.ld), &beta, y, y_type, static_cast<int>(y_ld),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
