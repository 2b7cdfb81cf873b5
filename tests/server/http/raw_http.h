// A raw HTTP/1.1 client for the HTTP servers' tests: bytes exactly as a test writes them
// (malformed framing, partial headers, one byte at a time) over a loopback socket, and a
// small response reader (status, fields, a Content-Length or chunked body, or a body up to
// the end of the connection).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace glmserve::testing {

struct RawResponse {
  int status = 0;                             // 0: no complete response in time
  std::map<std::string, std::string> fields;  // names lowercased
  std::string body;
  std::string field(const std::string& name) const {
    auto it = fields.find(name);
    return it == fields.end() ? "" : it->second;
  }
};

class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool ok() const { return fd_ >= 0; }

  bool Send(absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One response; `head`: the request was HEAD (no body follows the fields).
  RawResponse Read(absl::Duration timeout = absl::Seconds(10), bool head = false) {
    const absl::Time deadline = absl::Now() + timeout;
    RawResponse r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Receive(deadline)) return r;
    }
    const std::string head_text = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    bool first = true;
    for (absl::string_view line : absl::StrSplit(head_text, "\r\n")) {
      if (first) {
        first = false;
        const std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
        if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &r.status)) return RawResponse{};
        continue;
      }
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      r.fields[absl::AsciiStrToLower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    if (head || r.status < 200 || r.status == 204 || r.status == 304) return r;
    size_t length = 0;
    if (absl::SimpleAtoi(r.field("content-length"), &length)) {
      while (buf_.size() < length) {
        if (!Receive(deadline)) return RawResponse{};
      }
      r.body = buf_.substr(0, length);
      buf_.erase(0, length);
    } else if (absl::AsciiStrToLower(r.field("transfer-encoding")) == "chunked") {
      for (;;) {
        size_t line_end;
        while ((line_end = buf_.find("\r\n")) == std::string::npos) {
          if (!Receive(deadline)) return RawResponse{};
        }
        size_t size = 0;
        if (!absl::SimpleHexAtoi(buf_.substr(0, line_end), &size)) return RawResponse{};
        while (buf_.size() < line_end + 2 + size + 2) {
          if (!Receive(deadline)) return RawResponse{};
        }
        r.body += buf_.substr(line_end + 2, size);
        buf_.erase(0, line_end + 2 + size + 2);
        if (size == 0) break;
      }
    } else {
      while (Receive(deadline)) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

  // True once the server closed the connection (end of stream or reset) within `timeout`;
  // bytes that arrive meanwhile are kept in extra().
  bool ClosedWithin(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (!Receive(deadline)) return closed_;
    }
    return closed_;
  }
  const std::string& extra() const { return buf_; }

 private:
  // Appends what arrives before `deadline`; false on end of stream, error or timeout.
  bool Receive(absl::Time deadline) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ms)) <= 0) return false;
    char chunk[65536];
    const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    buf_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buf_;
  bool closed_ = false;
};

}  // namespace glmserve::testing
