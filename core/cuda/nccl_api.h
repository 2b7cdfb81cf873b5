// NCCL, loaded at run time with dlopen like cuBLAS (cublas_api.h says why): a build runs
// without it, and a host without it is told so when a group is created. The emulation
// (tools/cuda_emu) links the table of its in-process stand-in instead (nccl_api_emu.cc), so
// that nccl_communicator.cc runs unchanged on emulated devices.
#pragma once

#if __has_include(<nccl.h>)
#include <nccl.h>
#define GLM_HAVE_NCCL_H 1
#endif

#include "absl/status/status.h"

namespace glmserve::cuda {

// Loads libnccl once (thread-safe); FAILED_PRECONDITION naming the library if it cannot, or
// when this build has no nccl.h.
absl::Status LoadNccl();

#if GLM_HAVE_NCCL_H
struct NcclApi {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) comm_init_rank;
  decltype(&ncclCommInitAll) comm_init_all;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommGetAsyncError) comm_get_async_error;
  decltype(&ncclGetErrorString) error_string;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
};

// The loaded functions; only valid after LoadNccl() succeeded.
const NcclApi& Nccl();
#endif

}  // namespace glmserve::cuda
