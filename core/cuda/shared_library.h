// The CUDA toolkit's shared libraries opened at run time (cublas_api.h says why cuBLAS and
// cuBLASLt are dlopen'ed): one search order and one error form for both. Used only by the
// real loaders (cublas_api.cc, cublaslt_api.cc, nccl_api.cc); the emulation links fakes
// instead.
#pragma once

#include <dlfcn.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace glmserve::cuda {

// `soname` from the loader's search path (LD_LIBRARY_PATH, ld.so.conf) first, then from
// `toolkit_dir`, the toolkit this binary was built against. `what` names it in the error.
inline absl::StatusOr<void*> OpenCudaLibrary(const std::string& soname, const char* toolkit_dir,
                                             const char* what) {
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    library = dlopen(absl::StrCat(toolkit_dir, "/", soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (library == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load ", what, " (", soname, "): ", dlerror()));
  }
  return library;
}

// Sets *out to `name`'s address in `library`; false if the library lacks it.
template <typename Fn>
bool Resolve(void* library, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, name));
  return *out != nullptr;
}

}  // namespace glmserve::cuda
