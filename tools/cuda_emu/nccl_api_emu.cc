// The emulator's NCCL table: the in-process stand-in of fake/nccl.h (nccl_emu.cc), no dlopen.
#include "core/cuda/nccl_api.h"

namespace glmserve::cuda {

absl::Status LoadNccl() { return absl::OkStatus(); }

const NcclApi& Nccl() {
  static const NcclApi api{ncclGetVersion,        ncclGetUniqueId,    ncclCommInitRank,
                           ncclCommInitAll,       ncclCommDestroy,    ncclCommAbort,
                           ncclCommGetAsyncError, ncclGetErrorString, ncclAllGather,
                           ncclBroadcast,         ncclSend,           ncclRecv,
                           ncclGroupStart,        ncclGroupEnd};
  return api;
}

}  // namespace glmserve::cuda
