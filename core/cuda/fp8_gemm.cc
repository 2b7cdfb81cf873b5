#include "core/cuda/fp8_gemm.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "core/cuda/cublaslt_api.h"
#include "core/cuda/cuda_check.h"

namespace glmserve::cuda {
namespace {

// cuBLASLt's FP8 kernels may use a workspace (split-K); 32 MiB covers Hopper's recommendation.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// The heuristic assumes operands aligned to 256 bytes unless told otherwise: only such
// addresses are sent to it (the model's FP8 matrices, its scratch and its output slices are).
constexpr uintptr_t kAlignment = 256;

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kAlignment) == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<Fp8TensorCoreGemm>> Fp8TensorCoreGemm::Create(int device) {
  cudaDeviceProp prop{};
  GLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  if (prop.major * 10 + prop.minor < 89) {
    return absl::FailedPreconditionError(absl::StrCat(
        "compute capability ", prop.major, ".", prop.minor, " has no FP8 tensor cores (8.9+)"));
  }
  RETURN_IF_ERROR(LoadCublasLt());
  std::unique_ptr<Fp8TensorCoreGemm> g(new Fp8TensorCoreGemm);
  const CublasLtApi& lt = CublasLt();
  GLM_CUBLAS_RETURN_IF_ERROR(lt.create(&g->handle_));
  GLM_CUBLAS_RETURN_IF_ERROR(lt.desc_create(&g->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Row-major y = x W^T is column-major y^T = W x^T: A = W [n, k] row-major, i.e. the
  // column-major k x n matrix, transposed; B = x codes [m, k] row-major = column-major k x m.
  const int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(g->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(g->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  GLM_CUBLAS_RETURN_IF_ERROR(lt.pref_create(&g->pref_));
  const uint64_t workspace = kWorkspaceBytes;
  GLM_CUBLAS_RETURN_IF_ERROR(lt.pref_set(g->pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace, sizeof workspace));
  GLM_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, kWorkspaceBytes));
  return g;
}

Fp8TensorCoreGemm::~Fp8TensorCoreGemm() {
  const CublasLtApi& lt = CublasLt();
  if (pref_ != nullptr) lt.pref_destroy(pref_);
  if (desc_ != nullptr) lt.desc_destroy(desc_);
  if (handle_ != nullptr) lt.destroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

absl::StatusOr<const Fp8TensorCoreGemm::Plan*> Fp8TensorCoreGemm::PlanFor(int64_t m, int64_t n,
                                                                          int64_t k, int64_t y_ld) {
  const auto key = std::make_tuple(m, n, k, y_ld);
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  Plan plan;
  const CublasLtApi& lt = CublasLt();
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasStatus_t s = lt.layout_create(&a, CUDA_R_8F_E4M3, k, n, k);  // W: k x n, ld k
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_create(&b, CUDA_R_8F_E4M3, k, m, k);  // x codes
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_create(&d, CUDA_R_32F, n, m, y_ld);   // y^T
  if (s == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // NOT_SUPPORTED (or no result) is an answer: no FP8 algorithm for this shape here.
    const cublasStatus_t h = lt.heuristic(handle_, desc_, a, b, d, d, pref_, 1, &result, &found);
    if (h == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
        result.workspaceSize <= kWorkspaceBytes) {
      plan.found = true;
      plan.algo = result.algo;
      plan.workspace = result.workspaceSize;
    }
  }
  if (a != nullptr) lt.layout_destroy(a);
  if (b != nullptr) lt.layout_destroy(b);
  if (d != nullptr) lt.layout_destroy(d);
  GLM_CUBLAS_RETURN_IF_ERROR(s);
  return &plans_.emplace(key, plan).first->second;
}

absl::Status Fp8TensorCoreGemm::Run(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w,
                                    float* y, int64_t y_ld, uint8_t* x_codes, float* x_scales,
                                    cudaStream_t stream, bool* ran, std::string* why) {
  *ran = false;
  const int64_t n = w.rows, k = w.cols;
  if (m <= 0 || n <= 0) {
    *ran = true;
    return absl::OkStatus();
  }
  if (!Serves(w)) {
    *why = "128x128 block-scaled weights (per-block scales vary along k)";
    return absl::OkStatus();
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (k <= 0 || k % 16 != 0 || m > kMax || n > kMax || k > kMax || y_ld < n) {
    *why = absl::StrCat("shape m ", m, ", n ", n, ", k ", k, " (k must be a multiple of 16)");
    return absl::OkStatus();
  }
  if (!Aligned(w.codes) || !Aligned(x_codes) || !Aligned(y) || (y_ld * 4) % 16 != 0) {
    *why = "operands not 256-byte aligned";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const Plan* plan, PlanFor(m, n, k, y_ld));
  if (!plan->found) {
    *why = absl::StrCat("cuBLASLt has no FP8 algorithm for m ", m, ", n ", n, ", k ", k);
    return absl::OkStatus();
  }
  GLM_CUDA_RETURN_IF_ERROR(LaunchQuantizeRowsFp8(x, m, k, x_codes, x_scales, stream));
  const CublasLtApi& lt = CublasLt();
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasStatus_t s = lt.layout_create(&a, CUDA_R_8F_E4M3, k, n, k);
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_create(&b, CUDA_R_8F_E4M3, k, m, k);
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_create(&d, CUDA_R_32F, n, m, y_ld);
  const float alpha = 1.f, beta = 0.f;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = lt.matmul(handle_, desc_, &alpha, w.codes, a, x_codes, b, &beta, y, d, y, d, &plan->algo,
                  workspace_, plan->workspace, stream);
  }
  if (a != nullptr) lt.layout_destroy(a);
  if (b != nullptr) lt.layout_destroy(b);
  if (d != nullptr) lt.layout_destroy(d);
  GLM_CUBLAS_RETURN_IF_ERROR(s);
  // Per output channel: w.scales holds one fp32 scale per row of W (scale_cols 1).
  GLM_CUDA_RETURN_IF_ERROR(LaunchScaleRowsCols(y, m, n, y_ld, x_scales, w.scales, stream));
  *ran = true;
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
