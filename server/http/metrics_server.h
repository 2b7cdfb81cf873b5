// The Prometheus endpoint (--metrics_port): GET /metrics, the text exposition format of the
// registry Metrics builds (prometheus-cpp's TextSerializer), on the same event-driven HTTP
// server as the OpenAI endpoint, so that idle or slow scrapers cost memory, not threads, and
// never block a scrape. HEAD is GET without a body; other methods get 405 with Allow.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/http/http_server.h"
#include "server/metrics.h"

namespace glmserve {

class MetricsHttpServer {
 public:
  // `metrics` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const HttpOptions& options,
                                                                  const Metrics* metrics);
  ~MetricsHttpServer();  // Stop()
  int port() const { return server_->port(); }
  void Stop() { server_->Stop(); }

 private:
  class Service;
  MetricsHttpServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace glmserve
