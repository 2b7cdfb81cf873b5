// NCCL behind the Communicator interface (core/model/communicator.h): the ranks of a group of
// GPUs, in one process (a thread per device) or one process per GPU across nodes. NCCL is
// loaded at run time like cuBLAS (core/cuda/shared_library.h): a build runs without it, and
// a host without it is told so when a group is created.
//
// The fixed reduction order: NCCL's own all-reduce adds in an order set by its algorithm (ring
// or tree), its channels and the message size, so one row's sum could change with the batch
// it travels in. Here a sum is an all-gather of the ranks' partials ([N, count] on every rank)
// and one kernel that adds them in rank order (LaunchRankOrderSum): N times the bytes of a
// ring reduce-scatter, which at decode sizes (a few rows of hidden) is latency-bound anyway,
// and the same bits as the CPU group's. A gather of uneven blocks (the head's vocabulary
// slices) is one broadcast per rank inside a group call.
//
// Pointers are device pointers on the communicator's device; every collective is enqueued on
// its stream and returns without waiting. health() asks NCCL for asynchronous errors; Abort
// aborts the NCCL communicator, from any thread (pending collectives of every rank fail; the
// group is dead).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/communicator.h"

namespace glmserve::cuda {

// ncclUniqueId's bytes: made by rank 0 (NcclNewGroupId) and handed to every rank out of
// band (the leader's environment or its step-plan channel).
struct NcclGroupId {
  char bytes[128];
};

// FAILED_PRECONDITION when NCCL cannot be loaded (naming the library) or this build has no
// nccl.h (core/cuda/nccl_api.h).
absl::Status LoadNccl();
absl::StatusOr<NcclGroupId> NcclNewGroupId();
// NCCL's version as "2.27.3", or the reason it cannot be loaded.
std::string NcclVersion();

// Rank `rank` of `size` on CUDA device `device`, collectives on `stream`. Blocks until every
// rank has joined (NCCL's init).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclGroupId& id,
                                                                     int rank, int size, int device,
                                                                     cudaStream_t stream);

// One process driving several GPUs: a group of devices.size() ranks, rank r on devices[r]
// (ncclCommInitAll, from this one thread), each meant for its own thread afterwards. Their
// streams are the legacy stream until SetStream gives each its own.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    absl::Span<const int> devices);

}  // namespace glmserve::cuda
