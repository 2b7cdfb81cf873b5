// A tensor-parallel group over several processes, typically one per node (docs/parallel.md
// "Ranks in several processes"; deploy/overlays/lws-cpu runs it as a Kubernetes
// LeaderWorkerSet): node 0, the leader, runs the engine and the front ends and its share of
// the ranks; nodes 1..M-1, the workers, run theirs and follow the steps the leader sends
// (core/model/remote_ranks.h). The N ranks are split evenly: node k holds ranks
// [k N / M, (k + 1) N / M). CPU ranks sum through the socket communicator
// (core/model/socket_communicator.h), whose leader is rank 0; CUDA ranks through NCCL, the
// unique id handed out in the leader's welcome.
//
// Ports: the leader listens for workers' step channels on --leader_address's port P and, for
// CPU ranks, for the collectives on P + 1.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/cpu/ops/linear.h"
#include "core/model/communicator.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"
#include "core/model/weights.h"

namespace glmserve {

struct NodeGroupOptions {
  int nodes = 1;  // processes in the group (M)
  int node = 0;   // this process's index: 0 is the leader
  // "host:port" of the leader's step channel. The leader listens on its port (every
  // interface); a worker connects to it.
  std::string leader_address;
  // Only processes that present it join (another group's pods are refused).
  std::string token = "glmserve";
  // How long the leader waits for every worker to join and build its ranks (a worker loads its
  // slice of the checkpoint first), and a worker for the leader.
  absl::Duration join_timeout = absl::Minutes(30);
  // A collective that does not complete within this fails the group.
  absl::Duration collective_timeout = absl::Seconds(60);
  int threads_per_rank = 0;  // 0: this process's threads divided among its ranks
};

// INVALID_ARGUMENT naming the problem: nodes < 1, node outside [0, nodes), tensor_parallel not
// a multiple of nodes, no leader address with more than one node.
absl::Status CheckNodeGroup(const ParallelConfig& parallel, const NodeGroupOptions& options);

// Node `node`'s ranks: [first, first + count).
IndexRange NodeRanks(const ParallelConfig& parallel, const NodeGroupOptions& options, int node);

// How this process's ranks are made, per backend.
struct RankBackend {
  std::string name;  // "CPU" or "CUDA", for logs
  // The leader's setup for every worker, sent in its welcome before anyone joins the
  // collectives (CUDA: NCCL's unique id; CPU: none).
  std::function<absl::StatusOr<std::string>()> make_welcome;
  // The communicators of ranks `mine` (of `size`), made together: rank 0's waits for the
  // others. `welcome`: the leader's setup.
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>(
      const IndexRange& mine, int size, const std::string& welcome)>
      join;
  // Rank `rank`, this process's `local`-th, from the whole model's weights (its slice is taken
  // on the member's thread).
  std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const ModelWeights& whole, int rank,
                                                             int local, Communicator* comm)>
      make_rank;
};

// CPU ranks summing through the socket communicator (its leader: rank 0, on the leader
// address's port + 1, which the leader's backend binds here, before any worker is accepted:
// UNAVAILABLE at once when that port is taken).
absl::StatusOr<RankBackend> CpuRankBackend(const ParallelConfig& parallel, CpuMath cpu_math,
                                           const NodeGroupOptions& options);
// CUDA ranks, one per local GPU from `first_device` (tests place two "nodes" on one host),
// summing through NCCL with the leader's unique id (core/cuda/runner.h).
RankBackend CudaRankBackend(const ParallelConfig& parallel, Fp8TensorCores fp8_tensor_cores,
                            int first_device = 0);

// The leader (options.node 0): waits for the workers, builds its own ranks of `weights`, and
// returns the group as one ModelRunner for the engine.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateLeaderRunner(ModelWeights weights,
                                                                const ParallelConfig& parallel,
                                                                const RankBackend& backend,
                                                                const NodeGroupOptions& options,
                                                                std::string* how = nullptr);

// A worker (options.node >= 1): joins the leader, builds its ranks of `weights`, then runs the
// steps the leader sends until it goes away. Returns why it stopped (never OK): the caller
// exits non-zero, so the orchestrator restarts the group.
absl::Status RunWorker(ModelWeights weights, const ParallelConfig& parallel,
                       const RankBackend& backend, const NodeGroupOptions& options);

}  // namespace glmserve
