// The collectives a tensor-parallel group needs, behind one interface for every backend: ranks
// as threads of one process (CreateThreadGroup, below: CPU ranks, NUMA nodes, tests) and NCCL
// between GPUs (core/cuda/nccl_communicator.h).
//
// The contract that keeps a group batch-invariant: every reduction adds the ranks' values in
// rank order 0, 1, ..., N - 1, element by element, whatever the element count, so an
// element's sum does not depend on how many other elements (rows, sequences) travel with
// it, and every rank receives the same bits.
//
// Failure: a collective that does not complete within the group's timeout (a rank that died
// or hangs) returns DEADLINE_EXCEEDED and poisons the group; so does Abort. Every later
// collective of every rank then fails at once with the first failure's status (UNAVAILABLE,
// naming it): no rank waits forever for one that will not come.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace glmserve {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data [count] on every rank becomes sum over ranks r = 0..N-1 of rank r's data, added in
  // that order (each rank calls with the same count).
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;

  // Rank r contributes in [counts[r]]; out [sum of counts] receives every rank's block in rank
  // order (each rank passes the same counts).
  virtual absl::Status AllGather(const float* in, absl::Span<const int64_t> counts, float* out) = 0;

  // AllGather's result on rank `root` only (out [sum of counts] there; ignored, may be null,
  // elsewhere): what a result only one rank reads needs (the head's logits, which the engine
  // takes from rank 0), without N - 1 copies of it.
  virtual absl::Status Gather(const float* in, absl::Span<const int64_t> counts, float* out,
                              int root) = 0;

  // Device communicators (NCCL): the stream every later collective is enqueued on, the model's
  // own, so that collectives are ordered with its kernels and captured into its CUDA graphs
  // (a cudaStream_t; null: the legacy default stream). Host communicators ignore it.
  virtual void SetStream(void* stream) { (void)stream; }

  // Sums of up to `max_count` elements allocate nothing from now on (a device communicator's
  // scratch, sized ahead: a CUDA graph captures collectives, and capture forbids allocation).
  virtual absl::Status Prepare(int64_t max_count) {
    (void)max_count;
    return absl::OkStatus();
  }

  // Fails every pending and later collective of the group with `why` (a rank that failed
  // outside a collective calls it so that the others stop waiting for it).
  virtual void Abort(const absl::Status& why) = 0;
  // OK, or the status that poisoned the group.
  virtual absl::Status health() const = 0;
};

// `size` communicators of one in-process group, one per rank (rank i at index i), meant to be
// used from `size` different threads. Reductions read the other ranks' buffers directly
// (shared memory; no copies beyond the result). `timeout`: the longest a rank waits for the
// others at one collective.
std::vector<std::unique_ptr<Communicator>> CreateThreadGroup(
    int size, absl::Duration timeout = absl::Seconds(60));

}  // namespace glmserve
