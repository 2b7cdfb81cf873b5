// The emulator's cuBLASLt (fake/cublasLt.h): the subset core/cuda/fp8_gemm.cc uses, with the
// documented semantics in plain C++ (double accumulation), so the host orchestration (layouts,
// transposes, scale pointers and modes, the heuristic query and the fallback when it finds
// nothing) and our quantize / epilogue kernels are tested on the CPU:
//   D[i, j] = alpha * sa * sb * sum_l op(A)[i, l] op(B)[l, j] (+ beta * C[i, j]), column-major,
//   op(A) m x k, op(B) k x n; sa, sb the A / B scale pointers (1 when unset) as scalars
//   (SCALAR_32F) or as vectors of m and n values (OUTER_VEC_32F: element (i, j) times sa[i] sb[j]).
// FP8 (CUDA_R_8F_E4M3) operands are accepted as cuBLASLt accepts them on Ada / Hopper: both A
// and B FP8, the "TN" form (A transposed, B not), leading dimensions and k multiples of 16,
// 16-byte aligned pointers, fp32 compute and scale type, D (= C) fp32 or bf16; anything else
// finds no algorithm (heuristic) or is CUBLAS_STATUS_NOT_SUPPORTED (matmul).
// The Hopper block-scaled modes (cuBLAS documentation, "128-element 1D and 128x128 2D Block
// Scaling For FP8 Data Types"): A and B scale modes VEC128_32F or BLK128x128_32F in the three
// listed combinations (not both BLK128x128), FP8 operands only, the device of compute capability
// 9.0, M and N multiples of 4, scale pointers 16-byte aligned;
//   D[i, j] = alpha * sum_b sa(i, b) sb(j, b) sum_{l in block b} op(A)[i, l] op(B)[l, j],
//   b < L = ceil(K / 128) (the last block cut short), with
//   VEC128_32F:     sa(i, b) = a_scale[b * M + i] (M-major M x L), sb(j, b) = b_scale[b * N + j];
//   BLK128x128_32F: sa(i, b) = a_scale[(i / 128) * L4 + b] (K-major, L4 = L rounded up to a
//                   multiple of 4), sb likewise with j.
// EMU_CUBLASLT_FP8=0 makes the heuristic find nothing for FP8, as a device without FP8 tensor
// cores does; EMU_CUBLASLT_BLOCK=0 nothing for the block-scaled modes only (a library before
// 12.9, or a device other than 9.0): both test the fallbacks.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/base/dtype.h"
#include "core/cuda/cublaslt_api.h"

struct EmuCublasLt {
  int unused = 0;
};
struct EmuLtDesc {
  cublasComputeType_t compute;
  cudaDataType scale_type;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};
struct EmuLtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct EmuLtPref {
  uint64_t max_workspace = 0;
};

namespace {

size_t ElementBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_8F_E4M3 ? 1 : 2; }
float LoadAt(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_8F_E4M3) return glmserve::E4m3ToFloat(static_cast<const uint8_t*>(p)[i]);
  return glmserve::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
}
void StoreAt(void* p, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = glmserve::FloatToBf16(v);
  }
}
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
bool ScaleModeOk(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
}
bool BlockMode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}
bool BlockModes(const EmuLtDesc& d) { return BlockMode(d.a_mode) || BlockMode(d.b_mode); }
// The documented combinations: both block modes, not both BLK128x128.
bool BlockModesOk(const EmuLtDesc& d) {
  return BlockMode(d.a_mode) && BlockMode(d.b_mode) &&
         !(d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
           d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
}
bool DeviceIs90() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}
// Floats a block-mode scale tensor spans for an outer dimension `outer` (M or N) and k.
size_t BlockScaleFloats(int32_t mode, int64_t outer, int64_t k) {
  const int64_t l = (k + 127) / 128, l4 = (l + 3) / 4 * 4;
  return static_cast<size_t>(
      mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? outer * l : ((outer + 127) / 128) * l4);
}
float BlockScale(const float* s, int32_t mode, int64_t outer_dim, int64_t i, int64_t b, int64_t k) {
  const int64_t l = (k + 127) / 128, l4 = (l + 3) / 4 * 4;
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? s[b * outer_dim + i]
                                                         : s[(i / 128) * l4 + b];
}

// Whether the operation is one the emulated library runs (see the top of the file); m, n, k
// from the layouts.
bool Supported(const EmuLtDesc& d, const EmuLtLayout& a, const EmuLtLayout& b, const EmuLtLayout& c,
               const EmuLtLayout& dl, int64_t* m, int64_t* n, int64_t* k) {
  *m = static_cast<int64_t>(d.transa == CUBLAS_OP_T ? a.cols : a.rows);
  *k = static_cast<int64_t>(d.transa == CUBLAS_OP_T ? a.rows : a.cols);
  const int64_t kb = static_cast<int64_t>(d.transb == CUBLAS_OP_T ? b.cols : b.rows);
  *n = static_cast<int64_t>(d.transb == CUBLAS_OP_T ? b.rows : b.cols);
  if (*m <= 0 || *n <= 0 || *k <= 0 || kb != *k) return false;
  if (static_cast<int64_t>(dl.rows) != *m || static_cast<int64_t>(dl.cols) != *n) return false;
  if (c.rows != dl.rows || c.cols != dl.cols || c.type != dl.type || c.ld != dl.ld) return false;
  if (a.ld < static_cast<int64_t>(a.rows) || b.ld < static_cast<int64_t>(b.rows) ||
      dl.ld < static_cast<int64_t>(dl.rows)) {
    return false;
  }
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F) return false;
  if (dl.type != CUDA_R_32F && dl.type != CUDA_R_16BF) return false;
  const bool fp8 = a.type == CUDA_R_8F_E4M3 || b.type == CUDA_R_8F_E4M3;
  if (BlockModes(d)) {
    const char* env = std::getenv("EMU_CUBLASLT_BLOCK");
    if (env != nullptr && env[0] == '0') return false;
    if (!BlockModesOk(d) || !fp8 || !DeviceIs90() || *m % 4 != 0 || *n % 4 != 0) return false;
  } else if (!ScaleModeOk(d.a_mode) || !ScaleModeOk(d.b_mode)) {
    return false;
  }
  if (fp8) {
    if (a.type != CUDA_R_8F_E4M3 || b.type != CUDA_R_8F_E4M3) return false;
    if (d.transa != CUBLAS_OP_T || d.transb != CUBLAS_OP_N) return false;
    if (*k % 16 != 0 || a.ld % 16 != 0 || b.ld % 16 != 0) return false;
  }
  return true;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new EmuCublasLt;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  *d = new EmuLtDesc{compute, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: {
      if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      int32_t v;
      std::memcpy(&v, buf, sizeof v);
      if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->transa = v;
      if (attr == CUBLASLT_MATMUL_DESC_TRANSB) d->transb = v;
      if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE) d->a_mode = v;
      if (attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) d->b_mode = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: {
      if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      const float* p;
      std::memcpy(&p, buf, sizeof p);
      (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? d->a_scale : d->b_scale) = p;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *l = new EmuLtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new EmuLtPref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != sizeof(uint64_t) ||
      buf == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memcpy(&p->max_workspace, buf, sizeof(uint64_t));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (requested <= 0 || results == nullptr || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  int64_t m, n, k;
  const char* env = std::getenv("EMU_CUBLASLT_FP8");
  const bool fp8_off = env != nullptr && env[0] == '0' && a->type == CUDA_R_8F_E4M3;
  *returned = 0;
  if (fp8_off || !Supported(*d, *a, *b, *c, *dl, &m, &n, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t al, const void* B,
                              cublasLtMatrixLayout_t bl, const void* beta, const void* C,
                              cublasLtMatrixLayout_t cl, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  int64_t m, n, k;
  if (algo == nullptr || !Supported(*desc, *al, *bl, *cl, *dl, &m, &n, &k)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (al->type == CUDA_R_8F_E4M3 && (!Aligned16(A) || !Aligned16(B) || !Aligned16(D))) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool block = BlockModes(*desc);
  if (block && (desc->a_scale == nullptr || desc->b_scale == nullptr || !Aligned16(desc->a_scale) ||
                !Aligned16(desc->b_scale))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const auto span = [](const EmuLtLayout& l) {
    return (static_cast<size_t>(l.cols - 1) * l.ld + l.rows) * ElementBytes(l.type);
  };
  emu::CheckDeviceRange(A, span(*al), "cublasLtMatmul A");
  emu::CheckDeviceRange(B, span(*bl), "cublasLtMatmul B");
  emu::CheckDeviceRange(D, span(*dl), "cublasLtMatmul D");
  if (workspace_bytes > 0) emu::CheckDeviceRange(workspace, workspace_bytes, "workspace");
  const EmuLtDesc d = *desc;
  const EmuLtLayout a = *al, b = *bl, dd = *dl;
  const float alpha_v = *static_cast<const float*>(alpha);
  const float beta_v = *static_cast<const float*>(beta);
  if (beta_v != 0.f) emu::CheckDeviceRange(C, span(*cl), "cublasLtMatmul C");
  const auto check_scale = [](const float* s, int32_t mode, int64_t len, const char* what) {
    if (s != nullptr) {
      emu::CheckDeviceRange(
          s, sizeof(float) * (mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ? len : 1), what);
    }
  };
  if (block) {
    emu::CheckDeviceRange(d.a_scale, sizeof(float) * BlockScaleFloats(d.a_mode, m, k),
                          "A block scales");
    emu::CheckDeviceRange(d.b_scale, sizeof(float) * BlockScaleFloats(d.b_mode, n, k),
                          "B block scales");
  } else {
    check_scale(d.a_scale, d.a_mode, m, "A scale");
    check_scale(d.b_scale, d.b_mode, n, "B scale");
  }
  const cudaError_t e = emu::EnqueueHostOp(stream, [=] {
    if (block) {
      // Per 128-wide k block: the block's double sum times both scales, summed over blocks.
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t b0 = 0; b0 < k; b0 += 128) {
            double part = 0;
            for (int64_t l = b0; l < std::min(k, b0 + 128); ++l) {
              part += static_cast<double>(LoadAt(A, a.type, static_cast<size_t>(i * a.ld + l))) *
                      LoadAt(B, b.type, static_cast<size_t>(j * b.ld + l));
            }
            sum += part * BlockScale(d.a_scale, d.a_mode, m, i, b0 / 128, k) *
                   BlockScale(d.b_scale, d.b_mode, n, j, b0 / 128, k);
          }
          const size_t di = static_cast<size_t>(j * dd.ld + i);
          const float old = beta_v != 0.f ? LoadAt(C, dd.type, di) : 0.f;
          StoreAt(D, dd.type, di, static_cast<float>(alpha_v * sum + beta_v * old));
        }
      }
      return;
    }
    std::vector<float> arow(k);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t l = 0; l < k; ++l) {
        arow[l] = LoadAt(A, a.type,
                         d.transa == CUBLAS_OP_T ? static_cast<size_t>(i * a.ld + l)
                                                 : static_cast<size_t>(l * a.ld + i));
      }
      const float sa = d.a_scale == nullptr                                     ? 1.f
                       : d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ? d.a_scale[i]
                                                                                : d.a_scale[0];
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          sum += static_cast<double>(arow[l]) * LoadAt(B, b.type,
                                                       d.transb == CUBLAS_OP_N
                                                           ? static_cast<size_t>(j * b.ld + l)
                                                           : static_cast<size_t>(l * b.ld + j));
        }
        const float sb = d.b_scale == nullptr                                     ? 1.f
                         : d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F ? d.b_scale[j]
                                                                                  : d.b_scale[0];
        const size_t di = static_cast<size_t>(j * dd.ld + i);
        const float old = beta_v != 0.f ? LoadAt(C, dd.type, di) : 0.f;
        StoreAt(D, dd.type, di, static_cast<float>(alpha_v * sa * sb * sum + beta_v * old));
      }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// The table core/cuda/cublaslt_api.h gives: the functions above, no dlopen.
namespace glmserve::cuda {

absl::Status LoadCublasLt() { return absl::OkStatus(); }

const CublasLtApi& CublasLt() {
  static const CublasLtApi api{cublasLtCreate,
                               cublasLtDestroy,
                               cublasLtMatmulDescCreate,
                               cublasLtMatmulDescDestroy,
                               cublasLtMatmulDescSetAttribute,
                               cublasLtMatrixLayoutCreate,
                               cublasLtMatrixLayoutDestroy,
                               cublasLtMatmulPreferenceCreate,
                               cublasLtMatmulPreferenceDestroy,
                               cublasLtMatmulPreferenceSetAttribute,
                               cublasLtMatmulAlgoGetHeuristic,
                               cublasLtMatmul};
  return api;
}

}  // namespace glmserve::cuda
