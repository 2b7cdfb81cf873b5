// The OpenAI-compatible HTTP endpoint (its own port, --http_port), over the same engine and
// with the same rules as the gRPC APIs: bearer tokens, request limits, deadline caps, drain,
// metrics (api="openai") and access log. The HTTP server (server/http/http_server.h) parses
// and bounds requests; this file routes them, authenticates and records each call;
// server/http/openai_handler.h runs the completions on the server's handler threads.
//
// Routes: GET /v1/models, GET /v1/models/{id} (answered on the I/O thread: no model work),
// POST /v1/completions and /v1/chat/completions (handler threads). HEAD is GET without a
// body; a wrong method is 405 with Allow; OPTIONS answers Allow.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/http/http_server.h"
#include "server/service.h"

namespace glmserve {

class OpenAIHttpServer {
 public:
  // Listens and serves; `glm` (admission, limits, metrics, drain) must outlive the server.
  static absl::StatusOr<std::unique_ptr<OpenAIHttpServer>> Start(const HttpOptions& options,
                                                                 GlmServiceImpl* glm);
  ~OpenAIHttpServer();  // Stop()

  int port() const { return server_->port(); }
  int open_connections() const { return server_->open_connections(); }
  // Stops accepting and waits for the handlers in flight (the engine ends their requests on
  // a drain, so this returns promptly). Idempotent.
  void Stop() { server_->Stop(); }

 private:
  class Service;
  OpenAIHttpServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> server_;
};

// The Authorization field's bearer token is one of `tokens` (the scheme is case-insensitive,
// RFC 9110 11.1; tokens compared in constant time). True when `tokens` is empty.
bool BearerAuthorized(const std::vector<std::string>& tokens, absl::string_view header);

}  // namespace glmserve
