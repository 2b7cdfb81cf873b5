#include "core/model/remote_ranks.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

// A frame's largest payload: a step of max_tokens rows with hidden states in is the largest
// thing a leader sends (StepLimits bounds it again when decoded).
constexpr size_t kMaxFrameBytes = size_t{1} << 31;
// Small frames (hello, welcome, reports, replies).
constexpr size_t kMaxSmallFrame = size_t{1} << 20;
// How long the leader waits for a worker's reply to one call: long (a CPU prefill of many
// tokens takes a while); a worker that hangs is caught by the collectives' timeout, after
// which the group aborts (closes) every channel and this wait ends.
constexpr absl::Duration kCallTimeout = absl::Hours(1);

}  // namespace

std::string RemoteBuildId() {
  // The compiler and the sources' date and time: both ends must run the same binary build.
  return absl::StrCat("glmserve ", __DATE__, " ", __TIME__, " ", __VERSION__);
}

absl::StatusOr<std::string> RemoteChannel::Call(uint32_t type, const std::string& payload,
                                                absl::Time deadline) {
  RETURN_IF_ERROR(health());
  std::lock_guard<std::mutex> io(io_mu_);
  absl::Status s = SendFrame(socket_, type, payload, deadline);
  if (s.ok()) {
    absl::StatusOr<Frame> reply = RecvFrame(socket_, kMaxSmallFrame, deadline);
    if (reply.ok() && reply->type != kFrameReply) {
      s = absl::InternalError(absl::StrCat("unexpected frame ", reply->type, " from node ", node_));
    } else if (reply.ok()) {
      return std::move(reply->payload);
    } else {
      s = reply.status();
    }
  }
  return Failed(s);
}

absl::Status RemoteChannel::Failed(const absl::Status& transport) {
  Abort(absl::UnavailableError(absl::StrCat(
      node_ == 0 ? "the step channel to the leader failed: " : "the step channel to node ",
      node_ == 0 ? "" : absl::StrCat(node_, " failed: "), transport.ToString())));
  return health();
}

absl::StatusOr<Frame> RemoteChannel::Next(size_t max_payload) {
  RETURN_IF_ERROR(health());
  std::lock_guard<std::mutex> io(io_mu_);
  absl::StatusOr<Frame> frame = RecvFrame(socket_, max_payload, absl::InfiniteFuture());
  if (!frame.ok()) return Failed(frame.status());
  return frame;
}

absl::Status RemoteChannel::Send(uint32_t type, const std::string& payload) {
  RETURN_IF_ERROR(health());
  std::lock_guard<std::mutex> io(io_mu_);
  const absl::Status s = SendFrame(socket_, type, payload, absl::Now() + kCallTimeout);
  return s.ok() ? s : Failed(s);
}

absl::StatusOr<std::string> RemoteChannel::Receive(uint32_t want_type, absl::Time deadline) {
  RETURN_IF_ERROR(health());
  std::lock_guard<std::mutex> io(io_mu_);
  absl::StatusOr<Frame> frame = RecvFrame(socket_, kMaxSmallFrame, deadline);
  if (frame.ok() && frame->type == want_type) return std::move(frame->payload);
  return Failed(frame.ok() ? absl::InternalError(absl::StrCat("unexpected frame ", frame->type))
                           : frame.status());
}

void RemoteChannel::Abort(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return;
    failure_ = why;
  }
  socket_.Shutdown();  // wakes a call blocked on the socket; the peer sees the channel close
}

absl::Status RemoteChannel::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

absl::StatusOr<std::vector<std::shared_ptr<RemoteChannel>>> AcceptWorkers(
    Socket& listener, int workers, const std::string& token, const std::string& welcome,
    absl::Time deadline) {
  std::map<int64_t, std::shared_ptr<RemoteChannel>> joined;
  while (static_cast<int>(joined.size()) < workers) {
    absl::StatusOr<Socket> peer = listener.Accept(deadline);
    if (!peer.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat(joined.size(), " of ", workers,
                       " worker processes joined before the deadline: ", peer.status().ToString()));
    }
    // A peer that says nothing useful within a few seconds is dropped; the leader waits on.
    absl::StatusOr<Frame> hello_frame =
        RecvFrame(*peer, kMaxSmallFrame, std::min(deadline, absl::Now() + absl::Seconds(10)));
    WorkerHello hello;
    absl::Status refused;
    if (!hello_frame.ok() || hello_frame->type != kFrameHello) {
      refused = absl::InvalidArgumentError("no hello");
    } else if (!DecodeHello(hello_frame->payload, &hello).ok()) {
      refused = absl::InvalidArgumentError("a malformed hello");
    } else if (hello.build != RemoteBuildId()) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("another build (worker: ", hello.build, "; leader: ", RemoteBuildId(), ")"));
    } else if (hello.token != token) {
      refused = absl::PermissionDeniedError("another group's token");
    } else if (hello.node < 1 || hello.node > workers || joined.count(hello.node) > 0) {
      refused = absl::InvalidArgumentError(
          absl::StrCat("node ", hello.node, " (expected 1..", workers, ", each once)"));
    }
    if (!refused.ok()) {
      std::fprintf(stderr, "glmserve: refused a worker process: %s\n", refused.ToString().c_str());
      (void)SendFrame(*peer, kFrameReply, EncodeReply(refused), absl::Now() + absl::Seconds(1));
      continue;
    }
    RETURN_IF_ERROR(SendFrame(*peer, kFrameWelcome, welcome, deadline));
    joined[hello.node] = std::make_shared<RemoteChannel>(*std::move(peer), hello.node);
  }
  std::vector<std::shared_ptr<RemoteChannel>> out;
  for (auto& [node, channel] : joined) out.push_back(std::move(channel));
  return out;
}

absl::StatusOr<std::pair<std::shared_ptr<RemoteChannel>, std::string>> ConnectToLeader(
    const std::string& address, int64_t node, const std::string& token, absl::Time deadline) {
  ASSIGN_OR_RETURN(Socket socket, Connect(address, deadline));
  WorkerHello hello{RemoteBuildId(), token, node};
  RETURN_IF_ERROR(SendFrame(socket, kFrameHello, EncodeHello(hello), deadline));
  ASSIGN_OR_RETURN(Frame welcome, RecvFrame(socket, kMaxSmallFrame, deadline));
  if (welcome.type == kFrameReply) {  // refused, and why
    absl::Status why;
    int64_t unused = 0;
    RETURN_IF_ERROR(DecodeReply(welcome.payload, &why, &unused));
    return absl::FailedPreconditionError(
        absl::StrCat("the leader at ", address, " refused node ", node, ": ", why.ToString()));
  }
  if (welcome.type != kFrameWelcome) {
    return absl::InternalError(absl::StrCat("unexpected frame ", welcome.type, " from the leader"));
  }
  return std::make_pair(std::make_shared<RemoteChannel>(std::move(socket), 0),
                        std::move(welcome.payload));
}

absl::StatusOr<std::unique_ptr<RemoteRanks>> RemoteRanks::Create(
    std::shared_ptr<RemoteChannel> channel, const ModelConfig& whole, absl::Time deadline) {
  std::unique_ptr<RemoteRanks> ranks(new RemoteRanks(std::move(channel), whole));
  ASSIGN_OR_RETURN(const std::string report, ranks->channel_->Receive(kFrameReady, deadline));
  RETURN_IF_ERROR(DecodeWorkerInfo(report, &ranks->info_));
  if (!ranks->info_.status.ok()) {
    return absl::Status(
        ranks->info_.status.code(),
        absl::StrCat("worker node ", ranks->channel_->node(),
                     " could not build its ranks: ", ranks->info_.status.message()));
  }
  return ranks;
}

std::string RemoteRanks::device_name() const {
  return absl::StrCat("node ", channel_->node(), ": ", info_.device_name);
}

absl::Status RemoteRanks::SetKvCacheDType(KvCacheDType dtype) {
  ASSIGN_OR_RETURN(
      const std::string reply,
      channel_->Call(static_cast<uint32_t>(StepCall::kSetKvDType),
                     EncodeInts({static_cast<int64_t>(dtype)}), absl::Now() + kCallTimeout));
  absl::Status status;
  RETURN_IF_ERROR(DecodeReply(reply, &status, &info_.kv_bytes_per_token));
  return status;
}

absl::Status RemoteRanks::EnableMtp() {
  ASSIGN_OR_RETURN(
      const std::string reply,
      channel_->Call(static_cast<uint32_t>(StepCall::kEnableMtp), "", absl::Now() + kCallTimeout));
  absl::Status status;
  RETURN_IF_ERROR(DecodeReply(reply, &status, &info_.kv_bytes_per_token));
  mtp_enabled_ = status.ok();
  return status;
}

absl::StatusOr<std::unique_ptr<KvCache>> RemoteRanks::CreateCache(int64_t num_blocks,
                                                                  int64_t block_size) {
  ASSIGN_OR_RETURN(
      const std::string reply,
      channel_->Call(static_cast<uint32_t>(StepCall::kCreateCache),
                     EncodeInts({num_blocks, block_size}), absl::Now() + kCallTimeout));
  absl::Status status;
  int64_t id = 0;
  RETURN_IF_ERROR(DecodeReply(reply, &status, &id));
  RETURN_IF_ERROR(status);
  // The stand-in: the worker's bytes per token as one 1-byte "latent" row, so the group's
  // byte counts (KvCache::group_bytes_per_token) include the worker's; no storage here. Going
  // away, it tells the worker to free its cache (unless the channel is gone already).
  KvCacheShape shape;
  shape.num_layers = 1;
  shape.kv_heads = 1;
  shape.head_dim = std::max<int64_t>(1, info_.kv_bytes_per_token);
  shape.latent = true;
  shape.block_size = block_size;
  shape.num_blocks = num_blocks;
  std::shared_ptr<RemoteChannel> channel = channel_;
  static char kNoStorage;
  auto cache = std::make_unique<KvCache>(shape, &kNoStorage, DType::kF8E4M3, [channel, id](void*) {
    if (channel->health().ok()) {
      (void)channel->Call(static_cast<uint32_t>(StepCall::kDestroyCache), EncodeInts({id}),
                          absl::Now() + absl::Seconds(30));
    }
  });
  remote_ids_[cache.get()] = id;
  return cache;
}

absl::Status RemoteRanks::Forward(const ForwardBatch& batch, KvCache* cache,
                                  const ForwardOptions& options, ForwardResult* result) {
  const auto it = remote_ids_.find(cache);
  if (it == remote_ids_.end()) {
    return absl::InvalidArgumentError("KV cache was not created for this worker's ranks");
  }
  ASSIGN_OR_RETURN(
      const std::string reply,
      channel_->Call(static_cast<uint32_t>(StepCall::kForward),
                     EncodeForward(it->second, batch, options), absl::Now() + kCallTimeout));
  absl::Status status;
  int64_t unused = 0;
  RETURN_IF_ERROR(DecodeReply(reply, &status, &unused));
  *result = ForwardResult{};  // rank 0's result is the step's; the workers return none
  return status;
}

namespace {

// What the RankGroup holds for a worker's member: abort and health, no collectives.
class ChannelHandleImpl final : public Communicator {
 public:
  ChannelHandleImpl(std::shared_ptr<RemoteChannel> channel, int rank, int size)
      : channel_(std::move(channel)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float*, int64_t) override { return NoCollectives(); }
  absl::Status AllGather(const float*, absl::Span<const int64_t>, float*) override {
    return NoCollectives();
  }
  absl::Status Gather(const float*, absl::Span<const int64_t>, float*, int) override {
    return NoCollectives();
  }
  void Abort(const absl::Status& why) override { channel_->Abort(why); }
  absl::Status health() const override { return channel_->health(); }

 private:
  static absl::Status NoCollectives() {
    return absl::InternalError("a worker's channel handle carries no collectives");
  }
  std::shared_ptr<RemoteChannel> channel_;
  const int rank_, size_;
};

}  // namespace

std::unique_ptr<Communicator> ChannelHandle(std::shared_ptr<RemoteChannel> channel, int rank,
                                            int size) {
  return std::make_unique<ChannelHandleImpl>(std::move(channel), rank, size);
}

absl::Status ServeLeader(RemoteChannel& channel, ModelRunner* local_ranks, const WorkerInfo& info,
                         const StepLimits& limits) {
  RETURN_IF_ERROR(channel.Send(kFrameReady, EncodeWorkerInfo(info)));
  RETURN_IF_ERROR(info.status);
  ModelRunner& local = *local_ranks;
  std::map<int64_t, std::unique_ptr<KvCache>> caches;
  int64_t next_id = 1;
  DecodedStep step;
  ForwardResult result;
  for (;;) {
    // No deadline between steps: an idle server sends none for as long as it is idle.
    ASSIGN_OR_RETURN(Frame frame, channel.Next(kMaxFrameBytes));
    absl::Status status;
    int64_t value = 0;
    std::vector<int64_t> ints;
    switch (static_cast<StepCall>(frame.type)) {
      case StepCall::kCreateCache: {
        RETURN_IF_ERROR(DecodeInts(frame.payload, 2, &ints));
        absl::StatusOr<std::unique_ptr<KvCache>> cache = local.CreateCache(ints[0], ints[1]);
        status = cache.status();
        if (cache.ok()) {
          value = next_id++;
          caches[value] = *std::move(cache);
        }
        break;
      }
      case StepCall::kSetKvDType:
        RETURN_IF_ERROR(DecodeInts(frame.payload, 1, &ints));
        if (ints[0] < static_cast<int64_t>(KvCacheDType::kAuto) ||
            ints[0] > static_cast<int64_t>(KvCacheDType::kFp32)) {
          return absl::InvalidArgumentError("malformed step from the leader: KV cache dtype");
        }
        status = local.SetKvCacheDType(static_cast<KvCacheDType>(ints[0]));
        value = local.kv_bytes_per_token();
        break;
      case StepCall::kEnableMtp:
        if (!frame.payload.empty()) {
          return absl::InvalidArgumentError("malformed step from the leader: EnableMtp");
        }
        status = local.EnableMtp();
        value = local.kv_bytes_per_token();  // the MTP layer's cache layer counts now
        break;
      case StepCall::kDestroyCache:
        RETURN_IF_ERROR(DecodeInts(frame.payload, 1, &ints));
        caches.erase(ints[0]);
        break;
      case StepCall::kForward: {
        RETURN_IF_ERROR(DecodeForward(frame.payload, limits, &step));
        const auto it = caches.find(step.cache_id);
        status = it == caches.end()
                     ? absl::InvalidArgumentError("the step names a cache this worker has not")
                     : local.Forward(step.batch, it->second.get(), step.options, &result);
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("malformed step from the leader: call ", frame.type));
    }
    RETURN_IF_ERROR(channel.Send(kFrameReply, EncodeReply(status, value)));
  }
}

}  // namespace glmserve
