#include "core/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace glmserve::cuda {
namespace {

CublasLtApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

template <typename Fn>
bool Resolve(void* library, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, name));
  return *out != nullptr;
}

void Load() {
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  // The loader's search path first, then the toolkit this binary was built against.
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    library =
        dlopen(absl::StrCat(GLM_CUDA_LIBRARY_DIR, "/", soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (library == nullptr) {
    load_status = absl::FailedPreconditionError(
        absl::StrCat("cannot load cuBLASLt (", soname, "): ", dlerror()));
    return;
  }
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
