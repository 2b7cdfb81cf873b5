// Small POSIX TCP helpers for ranks in several processes (core/model/socket_communicator.h) and
// the step channel: every blocking operation takes an absl::Time deadline, so that no caller
// waits forever for a peer that died or hangs.
//
// Errors: DEADLINE_EXCEEDED when the deadline passes, UNAVAILABLE when the peer closed or
// reset the connection (the message names the peer's address), INVALID_ARGUMENT for a bad
// "host:port". After any error a socket's byte stream may be cut mid-message: close it.
//
// Sockets are non-blocking underneath (waits are poll()s bounded by the deadline), have
// TCP_NODELAY on (collectives and step messages are small and latency-bound) and never raise
// SIGPIPE (MSG_NOSIGNAL).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace glmserve {

// An owned socket descriptor, closed on destruction. Move-only. One thread at a time sends and
// one receives; Shutdown() may be called from any thread while they block.
class Socket {
 public:
  Socket() = default;
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // The peer's address ("10.0.0.7:41234", "[::1]:80"), or the bound one of a listener: what
  // error messages name.
  const std::string& peer() const { return peer_; }
  // A listener's bound port (the ephemeral one Listen(host, 0) chose); 0 when unknown.
  int local_port() const;

  // A listener's next connection.
  absl::StatusOr<Socket> Accept(absl::Time deadline) const;

  // Sends / receives exactly data.size() bytes.
  absl::Status SendAll(absl::Span<const char> data, absl::Time deadline);
  absl::Status RecvAll(absl::Span<char> data, absl::Time deadline);

  // Shuts both directions down without closing the descriptor: a Send/Recv/Accept blocked on
  // another thread wakes and fails, and so does the peer's (it sees the connection closed).
  // Safe from any thread, as long as the Socket is not moved or destroyed concurrently.
  void Shutdown();
  void Close();

 private:
  friend absl::StatusOr<Socket> Listen(absl::string_view, int);
  friend absl::StatusOr<Socket> Connect(absl::string_view, absl::Time);
  Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

  int fd_ = -1;
  std::string peer_;
};

// "host:port" or "[v6 address]:port" split; INVALID_ARGUMENT when malformed (no port, port
// beyond 65535, empty host).
struct HostPort {
  std::string host;
  int port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// A listener on `host` (a name or address; empty: every interface, IPv6 and IPv4 where the
// machine has IPv6) and `port` (0: an ephemeral port, see local_port()). SO_REUSEADDR is set so
// that a restarted leader can take its port back at once.
absl::StatusOr<Socket> Listen(absl::string_view host, int port);

// A connection to "host:port", retried (name resolution included) until `deadline`: the peer
// may not be listening yet, or its name may not resolve yet (pods start in any order).
absl::StatusOr<Socket> Connect(absl::string_view address, absl::Time deadline);

// ---- Framing: a 16-byte little-endian header, then the payload.
//   u32 magic (kFrameMagic), u32 type (the caller's), u64 payload length.
// A reader checks the magic and the length against its limit before reading (or allocating)
// anything of the payload, so bad input never allocates unbounded memory.
inline constexpr uint32_t kFrameMagic = 0x464d4c47;  // "GLMF" as little-endian bytes
inline constexpr size_t kFrameHeaderSize = 16;

struct FrameHeader {
  uint32_t type = 0;
  uint64_t length = 0;
};

// The header and the payload, sent as one message where the kernel allows it.
absl::Status SendFrame(Socket& socket, uint32_t type, absl::Span<const char> payload,
                       absl::Time deadline);
// The same with the payload in parts, sent back to back (no copy into one buffer): a message
// header struct followed by a tensor's bytes, say.
absl::Status SendFrame(Socket& socket, uint32_t type,
                       absl::Span<const absl::Span<const char>> parts, absl::Time deadline);

// A header only: DATA_LOSS on a wrong magic, RESOURCE_EXHAUSTED when its length exceeds
// `max_payload`. The caller then reads exactly `length` payload bytes with RecvAll (into its
// own buffer: large payloads need no copy).
absl::StatusOr<FrameHeader> RecvFrameHeader(Socket& socket, uint64_t max_payload,
                                            absl::Time deadline);

// A whole frame, its payload in a string of at most `max_payload` bytes.
struct Frame {
  uint32_t type = 0;
  std::string payload;
};
absl::StatusOr<Frame> RecvFrame(Socket& socket, uint64_t max_payload, absl::Time deadline);

}  // namespace glmserve
