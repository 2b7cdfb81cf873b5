#include "core/cuda/fp8_gemm.h"

#include <limits>
#include <vector>

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

// Dimensions up to this bound have their block-scale grids fit the two scale buffers:
// ceil(65536 / 128) = 512 blocks per side, each buffer 512 x 512 floats (1 MiB).
constexpr int64_t kMaxDim = int64_t{1} << 16;
constexpr int64_t kMaxScaleFloats = (kMaxDim / 128) * (kMaxDim / 128);

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
  // The weights (A) scaled per 128x128 block, the activations (B) per token and 128-wide group:
  // one of the combinations the documentation lists for Hopper (both BLK128x128 is not).
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(g->desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(g->desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
  GLM_CUBLAS_RETURN_IF_ERROR(lt.pref_create(&g->pref_));
  const uint64_t workspace = kWorkspaceBytes;
  GLM_CUBLAS_RETURN_IF_ERROR(lt.pref_set(g->pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace, sizeof workspace));
  GLM_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, kWorkspaceBytes));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&g->ones_), kMaxScaleFloats * sizeof(float)));
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&g->padded_), kMaxScaleFloats * sizeof(float)));
  const std::vector<float> ones(kMaxScaleFloats, 1.f);
  GLM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(g->ones_, ones.data(), kMaxScaleFloats * sizeof(float), cudaMemcpyHostToDevice));
  return g;
}

Fp8TensorCoreGemm::~Fp8TensorCoreGemm() {
  const CublasLtApi& lt = CublasLt();
  if (pref_ != nullptr) lt.pref_destroy(pref_);
  if (desc_ != nullptr) lt.desc_destroy(desc_);
  if (handle_ != nullptr) lt.destroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (ones_ != nullptr) cudaFree(ones_);
  if (padded_ != nullptr) cudaFree(padded_);
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
    *why = absl::StrCat("FP8 blocks of ", w.block_rows, "x", w.block_cols,
                        " (the block-scaled matmul takes 128x128 blocks)");
    return absl::OkStatus();
  }
  if (k <= 0 || k % 16 != 0 || m % 4 != 0 || n % 4 != 0 ||
      m > std::numeric_limits<int32_t>::max() || n > kMaxDim || k > kMaxDim || y_ld < n) {
    *why = absl::StrCat("shape m ", m, ", n ", n, ", k ", k,
                        " (k must be a multiple of 16, m and n of 4, n and k at most 65536)");
    return absl::OkStatus();
  }
  if (!Aligned(w.codes) || !Aligned(x_codes) || !Aligned(x_scales) || !Aligned(y) ||
      (y_ld * 4) % 16 != 0 || (!PerChannel(w) && reinterpret_cast<uintptr_t>(w.scales) % 16 != 0)) {
    *why = "operands not 256-byte aligned";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const Plan* plan, PlanFor(m, n, k, y_ld));
  if (!plan->found) {
    *why = absl::StrCat("cuBLASLt has no FP8 algorithm for m ", m, ", n ", n, ", k ", k);
    return absl::OkStatus();
  }
  GLM_CUDA_RETURN_IF_ERROR(LaunchQuantizeFp8Groups(x, m, k, x_codes, x_scales, m, stream));
  // A's scales: K-major [ceil(n / 128)][L4], L4 = ceil(k / 128) rounded up to a multiple of 4.
  const int64_t kb = Fp8ActGroups(k), kb4 = (kb + 3) / 4 * 4;
  const float* a_scales = ones_;
  if (!PerChannel(w)) {
    a_scales = w.scales;
    if (kb4 != kb) {
      GLM_CUDA_RETURN_IF_ERROR(
          LaunchPadBlockScales(w.scales, (n + 127) / 128, kb, padded_, kb4, stream));
      a_scales = padded_;
    }
  }
  const CublasLtApi& lt = CublasLt();
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof a_scales));
  GLM_CUBLAS_RETURN_IF_ERROR(
      lt.desc_set(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales));
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
  if (PerChannel(w)) GLM_CUDA_RETURN_IF_ERROR(LaunchScaleCols(y, m, n, y_ld, w.scales, stream));
  *ran = true;
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
