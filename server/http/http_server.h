// glm-server's HTTP/1.1 server (the OpenAI-compatible endpoint and /metrics): event-driven on
// Boost.Beast / Boost.Asio, so that a connection costs memory, not a thread.
//
// Threads: `io_threads` I/O threads own every socket (accept, read, parse, write); each
// connection's work runs on its own strand. A request is parsed and checked on an I/O thread
// (strict RFC 9112 framing, server/http/http_framing.h; deadlines for the headers, the whole
// body and an idle keep-alive connection; a bound on open connections), then either answered
// at once by the service's Route (cheap answers: errors, /v1/models, /metrics) or, with its
// body read into a bounded buffer, handed to a pool of `threads` handler threads
// (server/http/handler_pool.h) that run the blocking work: JSON, tokenizing, waiting on the
// engine. A handler writes through an HttpExchange, which queues bytes for the connection's
// strand (bounded: a handler whose client reads slowly waits, its client's problem only) and
// reports a peer that went away, so that the handler cancels its engine request.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/engine.h"

namespace glmserve {

struct HttpOptions {
  std::string address = "127.0.0.1";
  int port = -1;                        // < 0: no server; 0: an ephemeral port
  int threads = 32;                     // handler threads: requests doing blocking work at once
  int io_threads = 1;                   // threads owning the sockets (parsing and writing only)
  int max_connections = 4096;           // open connections; beyond: 503 and close
  int64_t max_body_bytes = 16 << 20;    // larger request bodies get 413 (before being read)
  int64_t max_header_bytes = 16 << 10;  // request line + header fields; beyond: 431
  int max_header_fields = 100;          // beyond: 431
  absl::Duration header_timeout = absl::Seconds(10);  // first byte to the end of the headers
  absl::Duration body_timeout = absl::Seconds(60);    // end of the headers to the end of the body
  absl::Duration idle_timeout = absl::Seconds(30);    // keep-alive wait; a stalled response write
  // Request bodies being read or served at once, in bytes (a body counts its Content-Length,
  // a chunked one max_body_bytes); a request that would pass it gets 429 before its body is
  // read, so that many slow 16 MiB uploads cannot take the memory.
  int64_t max_body_bytes_in_flight = int64_t{1} << 30;
};

// What a service sees of a request once its headers are parsed and checked.
struct HttpRequestHead {
  std::string method;  // as sent: GET, HEAD, POST, OPTIONS, ...
  std::string path;    // the target's path: origin-form without the query; absolute-form's path
  std::string authorization;  // the Authorization field, empty without one
  std::string peer;           // "ipv4:127.0.0.1:5555", as gRPC writes peers
  SteadyTime arrival;         // when the headers were complete
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra fields (Allow, ...)
};

// The JSON error response for `status` (OpenAI's error shape, server/http/openai_error.h).
HttpResponse ErrorResponse(const absl::Status& status);

// Makes glibc's malloc serve every allocation of kLargeAllocationBytes or more with its own
// mapping, returned to the system when freed. Without it glibc raises its mmap threshold
// (up to 32 MiB) after the first large free, and the copies of a 16 MiB request body (read
// buffer, JSON string, rendered prompt) stay resident in the heap top of every thread's
// arena that ever handled one: 50 refused 16 MiB bodies left +400 MB. glm-server calls it
// at start; a no-op on other C libraries.
inline constexpr size_t kLargeAllocationBytes = size_t{4} << 20;
void ReturnLargeAllocationsToTheSystem();

class Connection;

// One request/response exchange, handed to HttpService::Serve on a handler thread.
class HttpExchange {
 public:
  // `close`: the connection ends after this response (the client asked, or HTTP/1.0
  // without keep-alive).
  HttpExchange(std::shared_ptr<Connection> connection, bool head_only, bool http10, bool close);
  ~HttpExchange();
  void Send(const HttpResponse& response);
  void SendJson(int status, const std::string& body);
  void SendError(const absl::Status& status);
  // Server-sent events: the 200 header once, then one "data: ...\n\n" event per call (false
  // once the client is gone), then the end of the chunked body.
  bool StartEventStream();
  bool SendEvent(const std::string& data);
  void EndEventStream();
  // The client closed its side or the connection failed; never blocks.
  bool PeerClosed() const;
  std::string peer() const;
  int http_status() const { return status_; }
  // The response ends with the connection (an HTTP/1.0 event stream).
  bool must_close() const { return must_close_; }

 private:
  std::shared_ptr<Connection> connection_;
  const bool head_only_;
  const bool http10_;  // no chunked encoding: a stream ends by closing the connection
  const bool close_;
  int status_ = 0;
  bool must_close_ = false;
};

// A set of routes. Route runs on an I/O thread and must not block; Serve runs on a handler
// thread.
class HttpService {
 public:
  virtual ~HttpService() = default;
  // The answer to a request from its head alone, or nullopt: read the body and Serve it.
  virtual std::optional<HttpResponse> Route(const HttpRequestHead& head) = 0;
  virtual void Serve(const HttpRequestHead& head, std::string body, HttpExchange& exchange) = 0;
  // A request Route accepted that ended before Serve (body too large, incomplete at its
  // deadline, malformed, no handler free): `status` is what the client was told.
  virtual void Refused(const HttpRequestHead& head, const absl::Status& status) {}
};

class HttpServer {
 public:
  // Listens on options.address:options.port and serves `service` (which must outlive the
  // server).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpOptions& options,
                                                           HttpService* service);
  ~HttpServer();  // Stop()

  int port() const;
  int open_connections() const;
  // Stops accepting, closes connections between requests, waits for the handlers in flight
  // (the engine ends their requests on a drain, so this returns promptly; a handler whose
  // client reads nothing waits for it at most idle_timeout) and for their responses to be
  // written (at most 2 s more). Idempotent.
  void Stop();

  class Core;

 private:
  explicit HttpServer(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

}  // namespace glmserve
