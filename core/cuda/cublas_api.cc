#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/cublas_api.h"

namespace glmserve::cuda {
namespace {

CublasApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

template <typename Fn>
bool Resolve(void* library, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, name));
  return *out != nullptr;
}

void Load() {
  const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  // The loader's search path first (LD_LIBRARY_PATH, ld.so.conf), then the toolkit this
  // binary was built against.
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    library =
        dlopen(absl::StrCat(GLM_CUDA_LIBRARY_DIR, "/", soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (library == nullptr) {
    load_status = absl::FailedPreconditionError(
        absl::StrCat("cannot load cuBLAS (", soname, "): ", dlerror()));
    return;
  }
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
