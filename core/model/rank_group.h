// A tensor-parallel group as one ModelRunner (docs/parallel.md): the engine schedules and
// samples once; every step runs on all ranks at once, each a thread with its own runner (its
// slice of the weights, core/model/weight_shard.h), its own thread pool (pinned to its CPUs,
// a NUMA node's when the ranks are nodes) and its own KV cache, combining partial outputs
// through a Communicator. Rank 0's result is the step's.
//
// Failure: a rank whose step fails while the others succeed, or that does not finish (within
// RankGroupOptions::step_timeout), poisons the group: the step and every later one fail with
// UNAVAILABLE naming the first failure, and health() says so (glm-server then reports not ready:
// the instance restarts as a unit). A step every rank refuses alike (a malformed batch, checked
// before any collective) is just that step's error.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/model/communicator.h"
#include "core/model/model_runner.h"
#include "core/model/parallel_layout.h"

namespace glmserve {

struct RankGroupOptions {
  int threads_per_rank = 1;
  // rank_cpus[r]: the CPUs rank r's threads are pinned to; empty: no pinning.
  std::vector<std::vector<int>> rank_cpus;
  // How long a rank waits for the others at a collective, and how long the group waits for the
  // other ranks once one has failed, before declaring the group dead.
  absl::Duration collective_timeout = absl::Seconds(60);
  absl::Duration failure_grace = absl::Seconds(2);
  // The longest one step (or CreateCache, ...) may take on all members: past it the group is
  // declared dead (DEADLINE_EXCEEDED, every communicator aborted), so a rank that hangs where
  // no collective timeout reaches it (a GPU waiting in NCCL for a dead peer) takes the
  // instance out of readiness instead of stalling it. Generous: a long prefill is not a hang.
  absl::Duration step_timeout = absl::Minutes(15);
};

class RankGroup final : public ModelRunner {
 public:
  // Builds rank r's runner on rank r's thread (its pool and pinning in place, so what it
  // copies is first-touched there), given its communicator.
  using RankFactory =
      std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(int rank, Communicator* comm)>;

  // `communicators`: one per member (CreateThreadGroup, NCCL's, the socket communicator's; or
  // a worker process's channel handle, core/model/remote_ranks.h); `whole`: the model's config
  // (each rank's runner has its own). A member is one rank, or (RemoteRanks) all the ranks of
  // a worker process: there are at most parallel.tensor_parallel members; `make` gets the
  // member's index.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Create(
      const ModelConfig& whole, const ParallelConfig& parallel, const RankGroupOptions& options,
      std::vector<std::unique_ptr<Communicator>> communicators, const RankFactory& make);
  ~RankGroup() override;

  int size() const { return static_cast<int>(ranks_.size()); }
  ModelRunner& rank_runner(int r);
  // Rank r's communicator (tests abort one, as a dead peer would leave it).
  Communicator& communicator(int r);

  const ModelConfig& config() const override { return whole_; }
  int64_t layer_begin() const override;
  int64_t layer_end() const override;
  bool supports_sub_spans() const override;
  // Rank 0's: a group of CUDA ranks samples on rank 0's device (its head holds the gathered
  // logits; the other ranks return nothing).
  bool samples_tokens() const override;
  std::string device_name() const override;
  std::string compute_description() const override;
  int64_t weight_bytes() const override;
  int64_t kv_bytes_per_token() const override;
  absl::Status SetKvCacheDType(KvCacheDType dtype) override;
  bool has_mtp() const override;
  absl::Status EnableMtp() override;
  bool mtp_enabled() const override;
  // Rank 0's cache, owning the others' (KvCache::AdoptRankCaches).
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override;
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;
  absl::Status health() const override;

 private:
  struct Rank;
  RankGroup(const ModelConfig& whole, const ParallelConfig& parallel);
  // Runs job(r) on every rank's thread and waits; the group's failure rule (above) applies.
  // After a step timeout a hung member's job may outlive the call: a job captures what it
  // reads by value (pointers to objects that outlive the group's steps), never the caller's
  // frame.
  absl::Status RunOnAll(const std::function<absl::Status(int rank)>& job);

  ModelConfig whole_;
  ParallelConfig parallel_;
  absl::Duration failure_grace_;
  absl::Duration step_timeout_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<ForwardResult> others_;  // ranks 1..N-1's step results (rank 0's is the caller's)
};

}  // namespace glmserve
