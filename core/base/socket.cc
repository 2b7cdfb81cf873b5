#include "core/base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// "1.2.3.4:80" or "[::1]:80" of a socket address (numeric: no lookups in error paths).
std::string FormatAddress(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(addr, len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  if (addr->sa_family == AF_INET6) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

void SetNoDelay(int fd) {
  const int one = 1;
  // Best effort: a socket without it is slower, not wrong.
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits until `fd` is ready for `events` (or has an error or hangup, which the following call
// reports) or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& peer) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out waiting for ", peer.empty() ? "the peer" : peer));
    }
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll on ", peer, ": ", ErrnoText(errno)));
    }
  }
}

absl::Status PeerError(const std::string& peer, int err) {
  return absl::UnavailableError(absl::StrCat("connection to ", peer, " failed: ", ErrnoText(err)));
}

absl::Status PeerClosed(const std::string& peer) {
  return absl::UnavailableError(absl::StrCat("connection to ", peer, " closed"));
}

// Sends every byte of the buffers `iov` [count] (consumed as they go).
absl::Status SendIov(int fd, iovec* iov, int count, absl::Time deadline, const std::string& peer) {
  while (count > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --count;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, peer));
        continue;
      }
      return errno == EPIPE ? PeerClosed(peer) : PeerError(peer, errno);
    }
    size_t sent = static_cast<size_t>(n);
    while (count > 0 && sent >= iov->iov_len) {
      sent -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + sent;
      iov->iov_len -= sent;
    }
  }
  return absl::OkStatus();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo for TCP; `host` empty with `passive`: the wildcard addresses.
absl::StatusOr<AddrInfoList> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  return AddrInfoList(list);
}

// True when a connection reached its own source port (Linux lets a connect to a free local
// ephemeral port succeed against itself): not the listener we were looking for.
bool ConnectedToSelf(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof(a), lb = sizeof(b);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) {
    return false;
  }
  return la == lb && std::memcmp(&a, &b, la) == 0;
}

// One connection attempt to one address, waiting at most until `deadline`; the descriptor, or
// -1 with `error` set.
int ConnectOnce(const addrinfo& ai, absl::Time deadline, std::string& error) {
  const int fd =
      socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) {
    error = ErrnoText(errno);
    return -1;
  }
  int err = 0;
  if (connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      const std::string where = FormatAddress(ai.ai_addr, ai.ai_addrlen);
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline, where); !s.ok()) {
        error = std::string(s.message());
        close(fd);
        return -1;
      }
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  if (err == 0 && ConnectedToSelf(fd)) err = ECONNREFUSED;
  if (err != 0) {
    error = ErrnoText(err);
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_), peer_(std::move(other.peer_)) {
  other.fd_ = -1;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    peer_ = std::move(other.peer_);
    other.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() { Close(); }

void Socket::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Socket::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

int Socket::local_port() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

absl::StatusOr<Socket> Socket::Accept(absl::Time deadline) const {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd =
        accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SetNoDelay(fd);
      return Socket(fd, FormatAddress(reinterpret_cast<sockaddr*>(&addr), len));
    }
    // A connection reset before we took it is not the listener's failure: take the next.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("accept on ", peer_, ": ", ErrnoText(errno)));
    }
    RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline, absl::StrCat("a connection on ", peer_)));
  }
}

absl::Status Socket::SendAll(absl::Span<const char> data, absl::Time deadline) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  return SendIov(fd_, &iov, 1, deadline, peer_);
}

absl::Status Socket::RecvAll(absl::Span<char> data, absl::Time deadline) {
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = recv(fd_, data.data() + got, data.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return PeerClosed(peer_);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline, peer_));
    } else if (errno != EINTR) {
      return PeerError(peer_, errno);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad address \"", address, "\" (want host:port): ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = address.substr(0, colon), port_text = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 2 || host.back() != ']') return bad("unclosed [");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return bad("an IPv6 address needs brackets: [addr]:port");
  }
  if (host.empty()) return bad("empty host");
  int port = 0;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return bad("the port must be a number in 0..65535");
  }
  return HostPort{std::string(host), port};
}

absl::StatusOr<Socket> Listen(absl::string_view host_view, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port ", port));
  }
  const std::string host(host_view);
  auto list = Resolve(host, port, /*passive=*/true);
  if (!list.ok()) return absl::InvalidArgumentError(list.status().message());
  // Every interface: the IPv6 wildcard first, which takes IPv4 too (V6ONLY off).
  std::vector<const addrinfo*> order;
  for (const addrinfo* ai = list->get(); ai != nullptr; ai = ai->ai_next) order.push_back(ai);
  std::stable_sort(order.begin(), order.end(), [](const addrinfo* a, const addrinfo* b) {
    return a->ai_family == AF_INET6 && b->ai_family != AF_INET6;
  });
  std::string error = "no address";
  for (const addrinfo* ai : order) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = ErrnoText(errno);
      continue;
    }
    const int one = 1, zero = 0;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6 && host.empty()) {
      (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      Socket s(fd, "");
      s.peer_ = absl::StrCat(host.empty() ? "*" : host, ":", s.local_port());
      return s;
    }
    error = ErrnoText(errno);
    close(fd);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", host.empty() ? "*" : host, ":", port, ": ", error));
}

absl::StatusOr<Socket> Connect(absl::string_view address, absl::Time deadline) {
  ASSIGN_OR_RETURN(const HostPort target, ParseHostPort(address));
  std::string last_error = "no attempt before the deadline";
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    auto list = Resolve(target.host, target.port, /*passive=*/false);
    if (!list.ok()) {
      last_error = std::string(list.status().message());
    } else {
      for (const addrinfo* ai = list->get(); ai != nullptr; ai = ai->ai_next) {
        // One silent address (a SYN into the void) must not use up the whole deadline.
        const absl::Time attempt = std::min(deadline, absl::Now() + absl::Seconds(5));
        const int fd = ConnectOnce(*ai, attempt, last_error);
        if (fd >= 0) {
          SetNoDelay(fd);
          return Socket(fd, FormatAddress(ai->ai_addr, ai->ai_addrlen));
        }
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("could not connect to ", address, " before the deadline: ", last_error));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

namespace {

void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

}  // namespace

absl::Status SendFrame(Socket& socket, uint32_t type, absl::Span<const char> payload,
                       absl::Time deadline) {
  const absl::Span<const char> parts[] = {payload};
  return SendFrame(socket, type, parts, deadline);
}

absl::Status SendFrame(Socket& socket, uint32_t type,
                       absl::Span<const absl::Span<const char>> parts, absl::Time deadline) {
  uint64_t length = 0;
  for (const absl::Span<const char> part : parts) length += part.size();
  char header[kFrameHeaderSize];
  PutLe32(header, kFrameMagic);
  PutLe32(header + 4, type);
  PutLe64(header + 8, length);
  std::vector<iovec> iov = {{header, sizeof(header)}};
  for (const absl::Span<const char> part : parts) {
    iov.push_back({const_cast<char*>(part.data()), part.size()});
  }
  return SendIov(socket.fd(), iov.data(), static_cast<int>(iov.size()), deadline, socket.peer());
}

absl::StatusOr<FrameHeader> RecvFrameHeader(Socket& socket, uint64_t max_payload,
                                            absl::Time deadline) {
  char header[kFrameHeaderSize];
  RETURN_IF_ERROR(socket.RecvAll(header, deadline));
  if (GetLe(header, 4) != kFrameMagic) {
    return absl::DataLossError(
        absl::StrCat("not a frame from ", socket.peer(), " (wrong magic): another protocol?"));
  }
  FrameHeader h{static_cast<uint32_t>(GetLe(header + 4, 4)), GetLe(header + 8, 8)};
  if (h.length > max_payload) {
    return absl::ResourceExhaustedError(absl::StrCat("a frame of ", h.length, " bytes from ",
                                                     socket.peer(), " exceeds the limit of ",
                                                     max_payload));
  }
  return h;
}

absl::StatusOr<Frame> RecvFrame(Socket& socket, uint64_t max_payload, absl::Time deadline) {
  ASSIGN_OR_RETURN(const FrameHeader header, RecvFrameHeader(socket, max_payload, deadline));
  Frame frame{header.type, std::string(header.length, '\0')};
  RETURN_IF_ERROR(socket.RecvAll(absl::MakeSpan(frame.payload), deadline));
  return frame;
}

}  // namespace glmserve
