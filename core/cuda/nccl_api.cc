#include "core/cuda/nccl_api.h"

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda/shared_library.h"

namespace glmserve::cuda {

#if GLM_HAVE_NCCL_H
namespace {

NcclApi api;
absl::Status load_status = absl::UnknownError("not loaded");
std::once_flag once;

void Load() {
  const std::string soname = absl::StrCat("libnccl.so.", NCCL_MAJOR);
  absl::StatusOr<void*> opened = OpenCudaLibrary(soname, GLM_CUDA_LIBRARY_DIR, "NCCL");
  if (!opened.ok()) {
    load_status = opened.status();
    return;
  }
  void* l = *opened;
  const bool ok =
      Resolve(l, "ncclGetVersion", &api.get_version) &&
      Resolve(l, "ncclGetUniqueId", &api.get_unique_id) &&
      Resolve(l, "ncclCommInitRank", &api.comm_init_rank) &&
      Resolve(l, "ncclCommInitAll", &api.comm_init_all) &&
      Resolve(l, "ncclCommDestroy", &api.comm_destroy) &&
      Resolve(l, "ncclCommAbort", &api.comm_abort) &&
      Resolve(l, "ncclCommGetAsyncError", &api.comm_get_async_error) &&
      Resolve(l, "ncclGetErrorString", &api.error_string) &&
      Resolve(l, "ncclAllGather", &api.all_gather) && Resolve(l, "ncclBroadcast", &api.broadcast) &&
      Resolve(l, "ncclSend", &api.send) && Resolve(l, "ncclRecv", &api.recv) &&
      Resolve(l, "ncclGroupStart", &api.group_start) && Resolve(l, "ncclGroupEnd", &api.group_end);
  load_status = ok ? absl::OkStatus()
                   : absl::FailedPreconditionError(
                         absl::StrCat(soname, " lacks a function this build needs"));
}

}  // namespace

absl::Status LoadNccl() {
  std::call_once(once, Load);
  return load_status;
}

const NcclApi& Nccl() { return api; }

#else  // a CUDA toolkit without nccl.h

absl::Status LoadNccl() {
  return absl::FailedPreconditionError("this build has no NCCL (nccl.h was not found)");
}

#endif

}  // namespace glmserve::cuda
