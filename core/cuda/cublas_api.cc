#include "core/cuda/cublas_api.h"

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/shared_library.h"

namespace glmserve::cuda {
namespace {

CublasApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

void Load() {
  const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  absl::StatusOr<void*> opened = OpenCudaLibrary(soname, GLM_CUDA_LIBRARY_DIR, "cuBLAS");
  if (!opened.ok()) {
    load_status = opened.status();
    return;
  }
  void* library = *opened;
  const bool ok = Resolve(library, "cublasCreate_v2", &api.create) &&
                  Resolve(library, "cublasDestroy_v2", &api.destroy) &&
                  Resolve(library, "cublasSetStream_v2", &api.set_stream) &&
                  Resolve(library, "cublasSetWorkspace_v2", &api.set_workspace) &&
                  Resolve(library, "cublasGemmEx", &api.gemm_ex) &&
                  Resolve(library, "cublasGetStatusName", &api.status_name) &&
                  Resolve(library, "cublasGetStatusString", &api.status_string);
  load_status = ok ? absl::OkStatus()
                   : absl::FailedPreconditionError(
                         absl::StrCat(soname, " lacks a function this build needs"));
}

}  // namespace

absl::Status LoadCublas() {
  std::call_once(once, Load);
  return load_status;
}

const CublasApi& Cublas() { return api; }

}  // namespace glmserve::cuda
