#include "server/http/metrics_server.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/http/openai_error.h"

namespace glmserve {

class MetricsHttpServer::Service : public HttpService {
 public:
  explicit Service(const Metrics* metrics) : metrics_(metrics) {}

  // A scrape is answered on the I/O thread: it reads counters, it never waits on the engine.
  std::optional<HttpResponse> Route(const HttpRequestHead& head) override {
    if (head.path != "/metrics") {
      return ErrorResponse(absl::NotFoundError(
          absl::StrCat("no route ", head.path.substr(0, 128), " (routes: GET /metrics)")));
    }
    if (head.method == "OPTIONS") return HttpResponse{200, "", "", {{"Allow", kAllow}}};
    if (head.method != "GET" && head.method != "HEAD") {
      HttpResponse r = ErrorResponse(
          WithHttpStatus(absl::InvalidArgumentError("/metrics takes GET or HEAD"), 405));
      r.headers.push_back({"Allow", kAllow});
      return r;
    }
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics_->Scrape(), {}};
  }

  void Serve(const HttpRequestHead&, std::string, HttpExchange& exchange) override {
    exchange.SendError(absl::InternalError("no route reads a body"));  // Route answers all
  }

 private:
  static constexpr char kAllow[] = "GET, HEAD, OPTIONS";
  const Metrics* const metrics_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const HttpOptions& options, const Metrics* metrics) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->service_ = std::make_unique<Service>(metrics);
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, s->service_.get());
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->Stop();
}

}  // namespace glmserve
