#include "core/cuda/cublaslt_api.h"

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/shared_library.h"

namespace glmserve::cuda {
namespace {

CublasLtApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

void Load() {
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  absl::StatusOr<void*> opened = OpenCudaLibrary(soname, GLM_CUDA_LIBRARY_DIR, "cuBLASLt");
  if (!opened.ok()) {
    load_status = opened.status();
    return;
  }
  void* library = *opened;
  const bool ok = Resolve(library, "cublasLtCreate", &api.create) &&
                  Resolve(library, "cublasLtDestroy", &api.destroy) &&
                  Resolve(library, "cublasLtMatmulDescCreate", &api.desc_create) &&
                  Resolve(library, "cublasLtMatmulDescDestroy", &api.desc_destroy) &&
                  Resolve(library, "cublasLtMatmulDescSetAttribute", &api.desc_set) &&
                  Resolve(library, "cublasLtMatrixLayoutCreate", &api.layout_create) &&
                  Resolve(library, "cublasLtMatrixLayoutDestroy", &api.layout_destroy) &&
                  Resolve(library, "cublasLtMatmulPreferenceCreate", &api.pref_create) &&
                  Resolve(library, "cublasLtMatmulPreferenceDestroy", &api.pref_destroy) &&
                  Resolve(library, "cublasLtMatmulPreferenceSetAttribute", &api.pref_set) &&
                  Resolve(library, "cublasLtMatmulAlgoGetHeuristic", &api.heuristic) &&
                  Resolve(library, "cublasLtMatmul", &api.matmul);
  load_status = ok ? absl::OkStatus()
                   : absl::FailedPreconditionError(
                         absl::StrCat(soname, " lacks a function this build needs"));
}

}  // namespace

absl::Status LoadCublasLt() {
  std::call_once(once, Load);
  return load_status;
}

const CublasLtApi& CublasLt() { return api; }

}  // namespace glmserve::cuda
