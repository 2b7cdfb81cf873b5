// The TCP communicator (core/model/socket_communicator.h). Frames (core/base/socket.h) carry
// a type that packs the message kind, a Gather's root and the collective's sequence number;
// a collective's payload is its float values (and, for gathers, every rank's counts first).
#include "core/model/socket_communicator.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

// Message kinds (the type's low 4 bits).
enum Kind : uint32_t {
  kAllReduceSum = 1,
  kAllGather = 2,
  kGather = 3,
  kHello = 8,    // worker -> rank 0: u32 rank, u32 size, the token
  kWelcome = 9,  // rank 0 -> worker: the whole group has joined
  kRefuse = 10,  // rank 0 -> worker: why it was refused
  kAbort = 11,   // either way: why the sender poisoned the group
};

constexpr int kMaxRanks = 1 << 12;              // the root's bits in the type
constexpr uint64_t kMaxControlBytes = 1 << 16;  // hello, refusal, abort reason
constexpr size_t kMaxTokenBytes = 1024;

uint32_t CollectiveType(Kind kind, int root, uint32_t seq) {
  return kind | static_cast<uint32_t>(root) << 4 | (seq & 0xffff) << 16;
}

std::string DescribeType(uint32_t type) {
  const char* names[] = {"?", "AllReduceSum", "AllGather", "Gather"};
  const uint32_t kind = type & 0xf;
  return absl::StrCat(kind <= kGather ? names[kind] : "message", " #", type >> 16,
                      kind == kGather ? absl::StrCat(" to root ", (type >> 4) & 0xfff) : "");
}

absl::Span<const char> Bytes(const void* data, int64_t bytes) {
  return {static_cast<const char*>(data), static_cast<size_t>(bytes)};
}
absl::Span<char> MutableBytes(void* data, int64_t bytes) {
  return {static_cast<char*>(data), static_cast<size_t>(bytes)};
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// One connection, to rank 0 (on a worker) or to one worker (on rank 0).
struct Peer {
  Socket socket;
  int rank = 0;
  // Held while a frame is being sent, so that Abort, from another thread, sends its notice only
  // between two frames; `intact` turns false once a send failed part-way (the stream is cut).
  std::mutex send_mu;
  bool intact = true;
};

// Whether the connection has been closed by its peer (readable with nothing to read), without
// consuming anything.
bool PeerClosed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(const SocketGroupOptions& options, std::vector<std::unique_ptr<Peer>> peers)
      : rank_(options.rank),
        size_(options.size),
        timeout_(options.collective_timeout),
        peers_(std::move(peers)) {}

  ~SocketCommunicator() override {
    for (auto& peer : peers_) {
      if (peer) peer->socket.Shutdown();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    if (count < 0) return absl::InvalidArgumentError("AllReduceSum of a negative count");
    if (size_ == 1 || failed_.load(std::memory_order_acquire)) return health();
    const absl::Time deadline = absl::Now() + timeout_;
    const uint32_t type = CollectiveType(kAllReduceSum, 0, seq_++);
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    if (rank_ != 0) {
      RETURN_IF_ERROR(Guard(0, Send(*peers_[0], type, {Bytes(data, bytes)}, deadline)));
      return Guard(0, ReceiveReply(type, MutableBytes(data, bytes), deadline));
    }
    // Rank 0's values are the running sum: ((v0 + v1) + v2) + ..., CreateThreadGroup's order.
    scratch_.resize(static_cast<size_t>(count));
    for (int r = 1; r < size_; ++r) {
      RETURN_IF_ERROR(Guard(r, ReceiveFrom(r, type, bytes, deadline)));
      RETURN_IF_ERROR(Guard(r, Recv(r, MutableBytes(scratch_.data(), bytes), deadline)));
      for (int64_t i = 0; i < count; ++i) data[i] += scratch_[i];
    }
    for (int r = 1; r < size_; ++r) {
      RETURN_IF_ERROR(Guard(r, Send(*peers_[r], type, {Bytes(data, bytes)}, deadline)));
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, absl::Span<const int64_t> counts, float* out) override {
    RETURN_IF_ERROR(CheckCounts(counts, 0));
    if (failed_.load(std::memory_order_acquire)) return health();
    return Collect(kAllGather, in, counts, out, 0);
  }

  absl::Status Gather(const float* in, absl::Span<const int64_t> counts, float* out,
                      int root) override {
    RETURN_IF_ERROR(CheckCounts(counts, root));
    if (failed_.load(std::memory_order_acquire)) return health();
    return Collect(kGather, in, counts, out, root);
  }

  void Abort(const absl::Status& why) override { Fail(why); }

  absl::Status health() const override {
    if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
    return Failure();
  }

 private:
  absl::Status CheckCounts(absl::Span<const int64_t> counts, int root) const {
    if (static_cast<int>(counts.size()) != size_ || root < 0 || root >= size_) {
      return absl::InvalidArgumentError("a gather needs one count per rank and a rank as root");
    }
    for (const int64_t c : counts) {
      if (c < 0) return absl::InvalidArgumentError("a gather count is negative");
    }
    return absl::OkStatus();
  }

  // AllGather (every rank receives) and Gather (only `root` does), both through rank 0. The
  // frames of a gather start with the sender's counts, which rank 0 checks against its own.
  absl::Status Collect(Kind kind, const float* in, absl::Span<const int64_t> counts, float* out,
                       int root) {
    if (size_ == 1) {
      std::copy_n(in, counts[0], out);
      return health();
    }
    const absl::Time deadline = absl::Now() + timeout_;
    const uint32_t type = CollectiveType(kind, root, seq_++);
    const bool everyone = kind == kAllGather;
    int64_t total = 0;
    for (const int64_t c : counts) total += c;
    const int64_t total_bytes = total * static_cast<int64_t>(sizeof(float));
    const int64_t counts_bytes = size_ * static_cast<int64_t>(sizeof(int64_t));
    if (rank_ != 0) {
      RETURN_IF_ERROR(
          Guard(0, Send(*peers_[0], type,
                        {Bytes(counts.data(), counts_bytes),
                         Bytes(in, counts[rank_] * static_cast<int64_t>(sizeof(float)))},
                        deadline)));
      if (!everyone && rank_ != root) return absl::OkStatus();
      return Guard(0, ReceiveReply(type, MutableBytes(out, total_bytes), deadline));
    }
    // Rank 0 assembles the result in `out` when it receives it, in scratch otherwise.
    float* result = out;
    if (!everyone && root != 0) {
      scratch_.resize(static_cast<size_t>(total));
      result = scratch_.data();
    }
    std::copy_n(in, counts[0], result);
    int64_t at = counts[0];
    for (int r = 1; r < size_; ++r) {
      const int64_t block_bytes = counts[r] * static_cast<int64_t>(sizeof(float));
      RETURN_IF_ERROR(Guard(r, ReceiveFrom(r, type, counts_bytes + block_bytes, deadline)));
      peer_counts_.resize(static_cast<size_t>(size_));
      RETURN_IF_ERROR(Guard(r, Recv(r, MutableBytes(peer_counts_.data(), counts_bytes), deadline)));
      if (!std::equal(counts.begin(), counts.end(), peer_counts_.begin())) {
        return Poison(absl::FailedPreconditionError(
            absl::StrCat("rank ", r, " passed counts {", absl::StrJoin(peer_counts_, ", "), "} to ",
                         DescribeType(type), ", rank 0 {", absl::StrJoin(counts, ", "),
                         "}: the ranks run different steps")));
      }
      RETURN_IF_ERROR(Guard(r, Recv(r, MutableBytes(result + at, block_bytes), deadline)));
      at += counts[r];
    }
    for (int r = 1; r < size_; ++r) {
      if (!everyone && r != root) continue;
      RETURN_IF_ERROR(Guard(r, Send(*peers_[r], type, {Bytes(result, total_bytes)}, deadline)));
    }
    return absl::OkStatus();
  }

  // ---- Transport. Errors come back raw; Guard() names the peer and poisons the group.

  absl::Status Send(Peer& peer, uint32_t type, std::initializer_list<absl::Span<const char>> parts,
                    absl::Time deadline) {
    std::lock_guard<std::mutex> lock(peer.send_mu);
    if (!peer.intact) return absl::UnavailableError("the connection was cut");
    absl::Status s =
        SendFrame(peer.socket, type, absl::MakeConstSpan(parts.begin(), parts.size()), deadline);
    if (!s.ok()) peer.intact = false;
    return s;
  }

  absl::Status Recv(int peer_rank, absl::Span<char> data, absl::Time deadline) {
    return PeerOf(peer_rank).socket.RecvAll(data, deadline);
  }

  Peer& PeerOf(int peer_rank) { return rank_ == 0 ? *peers_[peer_rank] : *peers_[0]; }

  // A worker: rank 0's reply header, checked against what this rank asked for (or rank 0's
  // notice that the group failed), then the payload into `out`.
  absl::Status ReceiveReply(uint32_t type, absl::Span<char> out, absl::Time deadline) {
    RETURN_IF_ERROR(ReceiveHeader(0, type, out.size(), deadline));
    return Recv(0, out, deadline);
  }

  // Rank 0: rank r's header for collective `type`. While it waits, it watches the other
  // workers' connections too, so that a rank that died fails the collective at once even when
  // rank r is merely slow.
  absl::Status ReceiveFrom(int r, uint32_t type, int64_t bytes, absl::Time deadline) {
    RETURN_IF_ERROR(AwaitReadable(r, deadline));
    return ReceiveHeader(r, type, static_cast<uint64_t>(bytes), deadline);
  }

  absl::Status ReceiveHeader(int peer_rank, uint32_t type, uint64_t bytes, absl::Time deadline) {
    Peer& peer = PeerOf(peer_rank);
    ASSIGN_OR_RETURN(const FrameHeader header,
                     RecvFrameHeader(peer.socket, std::max(bytes, kMaxControlBytes), deadline));
    if ((header.type & 0xf) == kAbort) {
      std::string why(header.length, '\0');
      RETURN_IF_ERROR(peer.socket.RecvAll(absl::MakeSpan(why), deadline));
      return absl::UnavailableError(absl::StrCat("rank ", peer_rank, " ended the group: ", why));
    }
    if (header.type != type || header.length != bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", peer_rank, " sent ", DescribeType(header.type), " of ",
                       header.length, " bytes where rank ", rank_, " is at ", DescribeType(type),
                       " of ", bytes, " bytes: the ranks run different steps"));
    }
    return absl::OkStatus();
  }

  absl::Status AwaitReadable(int r, absl::Time deadline) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    fds.push_back({peers_[r]->socket.fd(), POLLIN, 0});
    ranks.push_back(r);
    for (int other = 1; other < size_; ++other) {
      if (other == r) continue;
      fds.push_back({peers_[other]->socket.fd(), POLLIN, 0});
      ranks.push_back(other);
    }
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("timed out");
      const int ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
      const int n = poll(fds.data(), fds.size(), ms);
      if (n < 0 && errno != EINTR) {
        return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
      }
      if (n <= 0) continue;
      if (fds[0].revents != 0) return absl::OkStatus();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (PeerClosed(fds[i].fd)) {
          return PeerGone(ranks[i], absl::UnavailableError("connection closed"));
        }
        fds[i].fd = -1;  // data ahead of its turn (a later frame): read when its turn comes
      }
    }
  }

  // A peer's connection failure, named (Guard passes statuses that name a rank through).
  absl::Status PeerGone(int peer_rank, const absl::Status& s) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", peer_rank, " (", PeerOf(peer_rank).socket.peer(), ") went away: ", s.message()));
  }

  // Names the peer a transport error came from and poisons the group with it.
  absl::Status Guard(int peer_rank, absl::Status s) {
    if (s.ok()) return s;
    if (failed_.load(std::memory_order_acquire)) return Failure();  // Abort woke us
    if (absl::IsDeadlineExceeded(s)) {
      return Poison(absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " waited ", absl::FormatDuration(timeout_), " for rank ",
                       peer_rank, " at a collective")));
    }
    if (absl::IsUnavailable(s) && !absl::StartsWith(s.message(), "rank ")) {
      return Poison(PeerGone(peer_rank, s));
    }
    return Poison(s);
  }

  // The status a collective returns after poisoning the group with `why`: `why` itself when it
  // is the group's first failure, the group's failure otherwise.
  absl::Status Poison(const absl::Status& why) { return Fail(why) ? why : Failure(); }

  // Records the first failure, tells every peer whose stream is whole (best effort, briefly),
  // and shuts every connection down. True when `why` is the first failure.
  bool Fail(const absl::Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.ok()) return false;
      failure_ = why;
      failed_.store(true, std::memory_order_release);
    }
    const std::string text = why.ToString();
    for (auto& peer : peers_) {
      if (!peer) continue;
      if (peer->send_mu.try_lock()) {
        if (peer->intact) {
          (void)SendFrame(peer->socket, kAbort,
                          Bytes(text.data(), std::min<int64_t>(text.size(), kMaxControlBytes)),
                          absl::Now() + absl::Milliseconds(100));
        }
        peer->intact = false;
        peer->send_mu.unlock();
      }
      peer->socket.Shutdown();
    }
    return true;
  }

  absl::Status Failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::UnavailableError(
        absl::StrCat("the tensor-parallel group failed: ", failure_.ToString()));
  }

  const int rank_, size_;
  const absl::Duration timeout_;
  // Rank 0: peers_[r] is rank r's connection (peers_[0] null); a worker: peers_[0] is rank 0.
  std::vector<std::unique_ptr<Peer>> peers_;
  uint32_t seq_ = 0;  // collectives so far (the caller's thread only)
  std::vector<float> scratch_;
  std::vector<int64_t> peer_counts_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  absl::Status failure_;  // guarded by mu_; the first failure
};

absl::Status CheckOptions(const SocketGroupOptions& o) {
  if (o.size < 1 || o.size > kMaxRanks || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " of ", o.size, ": want 0 <= rank < size <= ", kMaxRanks));
  }
  if (o.token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError("the group token is longer than 1024 bytes");
  }
  if (o.connect_timeout <= absl::ZeroDuration() || o.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the group's timeouts must be positive");
  }
  return ParseHostPort(o.leader_address).status();
}

std::string HelloPayload(const SocketGroupOptions& o) {
  std::string out;
  PutU32(out, static_cast<uint32_t>(o.rank));
  PutU32(out, static_cast<uint32_t>(o.size));
  return out + o.token;
}

// Rank 0's verdict on a hello: the rank it may take, or why not.
absl::StatusOr<int> CheckHello(const Frame& hello, const SocketGroupOptions& o,
                               const std::vector<std::unique_ptr<Peer>>& peers) {
  if (hello.type != kHello || hello.payload.size() < 8) {
    return absl::InvalidArgumentError("not a hello of this protocol");
  }
  const uint32_t rank = GetU32(hello.payload.data()), size = GetU32(hello.payload.data() + 4);
  if (hello.payload.compare(8, std::string::npos, o.token) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " has another group's token (a different deployment?)"));
  }
  if (size != static_cast<uint32_t>(o.size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " expects a group of ", size, " ranks, rank 0 of ", o.size));
  }
  if (rank == 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range 1..", size - 1));
  }
  const auto& taken = peers[rank];
  if (taken && !PeerClosed(taken->socket.fd())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " has already joined"));
  }
  return static_cast<int>(rank);  // new, or replacing a connection that has gone away
}

absl::StatusOr<std::unique_ptr<Communicator>> AssembleAsLeader(const SocketGroupOptions& o,
                                                               Socket listener) {
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  std::vector<std::unique_ptr<Peer>> peers(o.size);
  std::string last_refusal;
  const auto missing = [&] {
    std::vector<int> ranks;
    for (int r = 1; r < o.size; ++r) {
      if (!peers[r]) ranks.push_back(r);
    }
    return ranks;
  };
  while (!missing().empty()) {
    absl::StatusOr<Socket> conn = listener.Accept(deadline);
    if (!conn.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank 0 waited ", absl::FormatDuration(o.connect_timeout), " at ", listener.peer(),
          " for ranks ", absl::StrJoin(missing(), ", "), " to join: ", conn.status().message(),
          last_refusal.empty() ? "" : absl::StrCat(" (last refused: ", last_refusal, ")")));
    }
    // A connection that says nothing (a probe, a port scan) holds the leader up briefly only.
    absl::StatusOr<Frame> hello =
        RecvFrame(*conn, kMaxControlBytes, std::min(deadline, absl::Now() + absl::Seconds(10)));
    if (!hello.ok()) continue;
    absl::StatusOr<int> rank = CheckHello(*hello, o, peers);
    if (!rank.ok()) {
      last_refusal = absl::StrCat(conn->peer(), ": ", rank.status().message());
      (void)SendFrame(*conn, kRefuse, rank.status().message(), absl::Now() + absl::Seconds(1));
      continue;
    }
    peers[*rank] = std::make_unique<Peer>();
    peers[*rank]->socket = *std::move(conn);
    peers[*rank]->rank = *rank;
  }
  for (int r = 1; r < o.size; ++r) {
    if (absl::Status s = SendFrame(peers[r]->socket, kWelcome, absl::Span<const char>(), deadline);
        !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r, " left before the group assembled: ", s.message()));
    }
  }
  return std::make_unique<SocketCommunicator>(o, std::move(peers));
}

absl::StatusOr<std::unique_ptr<Communicator>> JoinAsWorker(const SocketGroupOptions& o) {
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  auto leader = std::make_unique<Peer>();
  ASSIGN_OR_RETURN(leader->socket, Connect(o.leader_address, deadline));
  const std::string hello = HelloPayload(o);
  RETURN_IF_ERROR(SendFrame(leader->socket, kHello, hello, deadline));
  absl::StatusOr<Frame> answer = RecvFrame(leader->socket, kMaxControlBytes, deadline);
  if (!answer.ok()) {
    return absl::Status(answer.status().code(),
                        absl::StrCat("rank ", o.rank, " waiting for the group at ",
                                     o.leader_address, ": ", answer.status().message()));
  }
  if (answer->type == kRefuse) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank 0 at ", o.leader_address, " refused rank ", o.rank, ": ", answer->payload));
  }
  if (answer->type != kWelcome) {
    return absl::DataLossError(absl::StrCat("unexpected answer from ", o.leader_address));
  }
  std::vector<std::unique_ptr<Peer>> peers;
  peers.push_back(std::move(leader));
  return std::make_unique<SocketCommunicator>(o, std::move(peers));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    const SocketGroupOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.size == 1)
    return std::make_unique<SocketCommunicator>(options, std::vector<std::unique_ptr<Peer>>{});
  if (options.rank != 0) return JoinAsWorker(options);
  ASSIGN_OR_RETURN(const HostPort leader, ParseHostPort(options.leader_address));
  ASSIGN_OR_RETURN(Socket listener, Listen(options.listen_host, leader.port));
  return AssembleAsLeader(options, std::move(listener));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    const SocketGroupOptions& options, Socket listener) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.rank != 0 || !listener.valid()) {
    return absl::InvalidArgumentError("only rank 0 takes a listener, and a valid one");
  }
  if (options.size == 1)
    return std::make_unique<SocketCommunicator>(options, std::vector<std::unique_ptr<Peer>>{});
  return AssembleAsLeader(options, std::move(listener));
}

}  // namespace glmserve
