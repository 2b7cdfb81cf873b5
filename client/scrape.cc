#include "client/scrape.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

absl::Status SplitHostPort(const std::string& host_port, std::string* host, std::string* port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not host:port"));
  }
  *host = host_port.substr(0, colon);
  *port = host_port.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

// Waits until `fd` is ready for `events` or the deadline passes.
bool WaitFor(int fd, short events, absl::Time deadline) {
  pollfd p{fd, events, 0};
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return ms > 0 && poll(&p, 1, static_cast<int>(ms)) == 1;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string host, port;
  RETURN_IF_ERROR(SplitHostPort(host_port, &host, &port));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses); rc != 0) {
    return absl::UnavailableError(absl::StrCat(host_port, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(addresses);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to ", host_port));

  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("send to ", host_port, " failed"));
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[16384];
  for (;;) {
    if (!WaitFor(fd, POLLIN, deadline)) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat("GET ", host_port, path, " timed out"));
    }
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("recv from ", host_port, " failed"));
    }
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("GET ", host_port, path, ": no HTTP header"));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200")) {
    return absl::UnavailableError(absl::StrCat("GET ", host_port, path, ": ", status_line));
  }
  return response.substr(header_end + 4);
}

double SumSamples(const std::string& page, const std::string& name) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, name)) continue;
    // The name must end here: followed by labels or the value.
    if (line.empty() || (line.front() != '{' && line.front() != ' ')) continue;
    const size_t space = line.rfind(' ');
    double value;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      sum += value;
    }
  }
  return sum;
}

absl::StatusOr<double> SampleValue(const std::string& page, const std::string& name,
                                   const std::string& labels) {
  const std::string prefix = absl::StrCat(name, labels, " ");
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    double value;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample ", name, labels));
}

}  // namespace glmserve
