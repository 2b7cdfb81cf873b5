// Ranks in several processes (docs/parallel.md "Ranks in several processes"): the leader
// process (node 0: the engine, the front ends and its own ranks) and worker processes (nodes
// 1..M-1, each with its ranks), joined by one step channel per worker (a TCP connection,
// core/base/socket.h) besides the collectives' own links (NCCL, or the socket communicator
// for CPU ranks).
//
// The leader's RankGroup holds its local ranks and, for each worker, a RemoteRanks member:
// a ModelRunner whose Forward sends the step (core/model/step_codec.h) and waits for the
// worker's status while the leader's own ranks run it too; their collectives meet. The worker
// runs ServeLeader: every step the leader sends goes to its local runner (its ranks), until
// the leader closes the channel.
//
// Failure: a worker that dies or hangs fails its member's Forward (the channel closes, or the
// collectives of the leader's ranks time out and the group closes every channel), so the
// group is poisoned and glm-server reports not ready; a worker whose leader goes away exits,
// so an orchestrator (a LeaderWorkerSet) restarts the group as a unit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/socket.h"
#include "core/model/communicator.h"
#include "core/model/model_runner.h"
#include "core/model/step_codec.h"

namespace glmserve {

// This build's identity in the hello: leader and workers must run the same build.
std::string RemoteBuildId();

// One step channel: the socket and the first failure, shared by the member that uses it and
// the handle the RankGroup aborts (ChannelHandle).
class RemoteChannel {
 public:
  RemoteChannel(Socket socket, int64_t node) : socket_(std::move(socket)), node_(node) {}
  int64_t node() const { return node_; }
  // One call: sends (type, payload), waits for the reply frame; any transport failure poisons
  // the channel (later calls fail at once with it).
  absl::StatusOr<std::string> Call(uint32_t type, const std::string& payload, absl::Time deadline);
  // One frame of `want_type` (anything else poisons the channel).
  absl::StatusOr<std::string> Receive(uint32_t want_type, absl::Time deadline);
  // The worker's side: the next frame, however long the leader is idle, and replies.
  absl::StatusOr<Frame> Next(size_t max_payload);
  absl::Status Send(uint32_t type, const std::string& payload);
  void Abort(const absl::Status& why);
  absl::Status health() const;

 private:
  absl::Status Failed(const absl::Status& transport);

  Socket socket_;
  const int64_t node_;
  // std::mutex rather than absl::Mutex: the ThreadSanitizer stage sees its synchronisation
  // (the system Abseil is not instrumented).
  std::mutex io_mu_;  // one call on the socket at a time
  mutable std::mutex mu_;
  absl::Status failure_;  // guarded by mu_
};

// Frame types of the channel (besides StepCall's).
enum RemoteFrame : uint32_t {
  kFrameHello = 100,    // worker -> leader: WorkerHello
  kFrameWelcome = 101,  // leader -> worker: the group's setup (opaque to this layer)
  kFrameReady = 102,    // worker -> leader: WorkerInfo, once its ranks are built
  kFrameReply = 200,    // worker -> leader: EncodeReply
};

// Leader: accepts `workers` worker processes on `listener` (any order; each names its node,
// 1..workers, and the group's token; a wrong build, token, node or a duplicate is refused and
// the leader keeps waiting), sends each `welcome`, and returns the channels in node order.
absl::StatusOr<std::vector<std::shared_ptr<RemoteChannel>>> AcceptWorkers(
    Socket& listener, int workers, const std::string& token, const std::string& welcome,
    absl::Time deadline);

// Worker: connects to the leader at `address` ("host:port", retried until `deadline`: the
// leader may still be starting), says hello, and returns the channel and the welcome payload.
absl::StatusOr<std::pair<std::shared_ptr<RemoteChannel>, std::string>> ConnectToLeader(
    const std::string& address, int64_t node, const std::string& token, absl::Time deadline);

// The leader's stand-in for one worker's ranks, a member of its RankGroup.
class RemoteRanks final : public ModelRunner {
 public:
  // Waits (until `deadline`) for the worker's report that its ranks are built; its failure is
  // this call's.
  static absl::StatusOr<std::unique_ptr<RemoteRanks>> Create(std::shared_ptr<RemoteChannel> channel,
                                                             const ModelConfig& whole,
                                                             absl::Time deadline);

  const ModelConfig& config() const override { return whole_; }
  int64_t layer_begin() const override { return 0; }
  int64_t layer_end() const override { return whole_.num_hidden_layers; }
  bool supports_sub_spans() const override { return false; }
  std::string device_name() const override;
  int64_t weight_bytes() const override { return info_.weight_bytes; }
  int64_t kv_bytes_per_token() const override { return info_.kv_bytes_per_token; }
  absl::Status SetKvCacheDType(KvCacheDType dtype) override;
  // The worker loaded the same checkpoint: its ranks have the MTP layer when rank 0 does
  // (RankGroup asks rank 0); EnableMtp turns it on there.
  bool has_mtp() const override { return true; }
  absl::Status EnableMtp() override;
  bool mtp_enabled() const override { return mtp_enabled_; }
  // A stand-in cache (no storage here; its bytes per token are the worker's); the worker
  // creates its caches with the same blocks.
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t num_blocks,
                                                       int64_t block_size) override;
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override;
  absl::Status health() const override { return channel_->health(); }

 private:
  RemoteRanks(std::shared_ptr<RemoteChannel> channel, const ModelConfig& whole)
      : channel_(std::move(channel)), whole_(whole) {}

  std::shared_ptr<RemoteChannel> channel_;
  ModelConfig whole_;
  WorkerInfo info_;
  std::map<const KvCache*, int64_t> remote_ids_;  // stand-in cache -> the worker's cache id
  bool mtp_enabled_ = false;
};

// The RankGroup's handle on a worker's member (its "communicator"): Abort closes the channel
// (the worker sees its leader gone), health() is the channel's; it carries no collectives.
std::unique_ptr<Communicator> ChannelHandle(std::shared_ptr<RemoteChannel> channel, int rank,
                                            int size);

// Worker: reports `info` (its ranks built, or why not: then returns that status), then runs
// every call the leader sends on `local` (its ranks) until the leader closes the channel
// (UNAVAILABLE naming it) or sends a malformed frame. `local` may be null only when info.status is
// not OK.
absl::Status ServeLeader(RemoteChannel& channel, ModelRunner* local, const WorkerInfo& info,
                         const StepLimits& limits);

}  // namespace glmserve
