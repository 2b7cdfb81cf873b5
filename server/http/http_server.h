// The OpenAI-compatible HTTP endpoint (its own port, --http_port), over the same engine and
// with the same rules as the gRPC APIs: bearer tokens, request limits, deadline caps, drain,
// metrics (api="openai") and access log. civetweb (Debian's libcivetweb, which prometheus-cpp
// already links for /metrics) parses HTTP; this file routes, authenticates, bounds and reads
// bodies and writes responses; server/http/openai_handler.h runs the completions.
//
// Threads: civetweb runs each request on one of `threads` workers. A handler only queues the
// request on the engine and waits for its own events, so the engine never waits on HTTP, and
// a slow client holds only its own worker (its writes block, nobody else's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/service.h"

struct mg_context;
struct mg_connection;

namespace glmserve {

struct HttpOptions {
  std::string address = "127.0.0.1";
  int port = -1;     // < 0: no HTTP endpoint; 0: an ephemeral port
  int threads = 32;  // concurrent HTTP requests (each waits on its own engine request)
  int64_t max_body_bytes = 16 << 20;  // larger request bodies get 413 before being read
};

// One request/response exchange on a civetweb connection.
class HttpExchange {
 public:
  explicit HttpExchange(mg_connection* conn);
  void SendJson(int status, const std::string& body);
  void SendError(const absl::Status& status);
  // Server-sent events: the 200 header once, then one "data: ...\n\n" event per call (false
  // once the client is gone), then the end of the chunked body.
  bool StartEventStream();
  bool SendEvent(const std::string& data);
  void EndEventStream();
  // The client closed its connection (see ConnectionWatch); never blocks.
  bool PeerClosed();
  std::string peer() const;
  int http_status() const { return status_; }

 private:
  mg_connection* conn_;
  int status_ = 0;
  bool watch_ready_ = false;
  std::unique_ptr<class ConnectionWatch> watch_;
};

class OpenAIHttpServer {
 public:
  // Listens and serves; `glm` (admission, limits, metrics, drain) must outlive the server.
  static absl::StatusOr<std::unique_ptr<OpenAIHttpServer>> Start(const HttpOptions& options,
                                                                 GlmServiceImpl* glm);
  ~OpenAIHttpServer();  // Stop()

  int port() const { return port_; }
  // Stops accepting and waits for the handlers in flight (the engine ends their requests on
  // a drain, so this returns promptly). Idempotent.
  void Stop();

 private:
  OpenAIHttpServer(const HttpOptions& options, GlmServiceImpl* glm)
      : options_(options), glm_(glm) {}
  static int Handle(mg_connection* conn, void* self);
  void Route(HttpExchange& exchange, mg_connection* conn);

  const HttpOptions options_;
  GlmServiceImpl* const glm_;
  mg_context* ctx_ = nullptr;
  int port_ = -1;
};

}  // namespace glmserve
