#include "server/http/openai_server.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/http/openai_error.h"
#include "server/http/openai_handler.h"
#include "server/status.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

// Token comparison whose time does not depend on where the strings differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

struct RouteInfo {
  Rpc rpc;
  bool post;
  std::string model_id;  // GET /v1/models/{id}
};

constexpr char kRoutes[] =
    "routes: GET /v1/models, GET /v1/models/{id}, POST /v1/completions, "
    "POST /v1/chat/completions";

std::optional<RouteInfo> FindRoute(const std::string& path) {
  if (path == "/v1/completions") return RouteInfo{Rpc::kOpenAICompletions, true, ""};
  if (path == "/v1/chat/completions") return RouteInfo{Rpc::kOpenAIChatCompletions, true, ""};
  if (path == "/v1/models") return RouteInfo{Rpc::kOpenAIModels, false, ""};
  constexpr absl::string_view kModel = "/v1/models/";
  if (absl::StartsWith(path, kModel) && path.size() > kModel.size()) {
    return RouteInfo{Rpc::kOpenAIModels, false, path.substr(kModel.size())};
  }
  return std::nullopt;
}

}  // namespace

bool BearerAuthorized(const std::vector<std::string>& tokens, absl::string_view header) {
  if (tokens.empty()) return true;
  header = absl::StripAsciiWhitespace(header);
  constexpr absl::string_view kBearer = "bearer";
  if (header.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(header.substr(0, kBearer.size()), kBearer) ||
      (header[kBearer.size()] != ' ' && header[kBearer.size()] != '\t')) {
    return false;
  }
  const absl::string_view token = absl::StripLeadingAsciiWhitespace(header.substr(kBearer.size()));
  bool ok = false;
  for (const std::string& accepted : tokens) ok |= ConstantTimeEquals(token, accepted);
  return ok;
}

class OpenAIHttpServer::Service : public HttpService {
 public:
  explicit Service(GlmServiceImpl* glm) : glm_(glm) {}

  std::optional<HttpResponse> Route(const HttpRequestHead& head) override {
    const std::optional<RouteInfo> route = FindRoute(head.path);
    if (!route) {
      // Not a call of the API: not counted.
      return ErrorResponse(absl::NotFoundError(
          absl::StrCat("no route ", head.path.substr(0, 128), " (", kRoutes, ")")));
    }
    const char* allow = route->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
    if (head.method == "OPTIONS") return HttpResponse{200, "", "", {{"Allow", allow}}};
    const bool allowed =
        route->post ? head.method == "POST" : head.method == "GET" || head.method == "HEAD";
    OpenAICallResult result;
    const Backend* backend = nullptr;
    if (!allowed) {
      result.status = WithHttpStatus(
          absl::InvalidArgumentError(absl::StrCat(head.path.substr(0, 128), " takes ",
                                                  route->post ? "POST" : "GET or HEAD")),
          405);
    } else if (!BearerAuthorized(glm_->options().auth_tokens, head.authorization)) {
      result.status = absl::UnauthenticatedError(
          "missing or invalid bearer token (header 'Authorization: Bearer <token>')");
    } else if (glm_->draining()) {
      result.status = absl::UnavailableError("server is draining for shutdown");
    } else if ((backend = glm_->backend()) == nullptr) {
      result.status = absl::UnavailableError("server is loading the model");
    } else if (route->post) {
      return std::nullopt;  // the body is read, then Serve runs on a handler thread
    }
    HttpResponse response;
    if (!result.status.ok()) {
      response = ErrorResponse(result.status);
      if (!allowed) response.headers.push_back({"Allow", allow});
    } else {
      absl::StatusOr<std::string> models =
          route->model_id.empty() ? ModelsJson(*backend) : ModelJson(*backend, route->model_id);
      result.status = models.status();
      response = models.ok() ? HttpResponse{200, "application/json", *std::move(models), {}}
                             : ErrorResponse(models.status());
    }
    glm_->CallStarted();
    Record(route->rpc, head, result);
    glm_->CallDone();
    return response;
  }

  void Serve(const HttpRequestHead& head, std::string body, HttpExchange& exchange) override {
    const Rpc rpc = FindRoute(head.path)->rpc;
    glm_->CallStarted();
    OpenAICallResult result;
    const Backend* backend = nullptr;
    if (glm_->draining()) {
      result.status = absl::UnavailableError("server is draining for shutdown");
    } else if ((backend = glm_->backend()) == nullptr) {
      result.status = absl::UnavailableError("server is loading the model");
    } else {
      result = ServeCompletion(*glm_, *backend, std::move(body), rpc == Rpc::kOpenAIChatCompletions,
                               exchange, head.arrival);
    }
    if (!result.status.ok() && exchange.http_status() == 0 &&
        result.status.code() != absl::StatusCode::kCancelled) {
      exchange.SendError(result.status);
    }
    Record(rpc, head, result);
    glm_->CallDone();
  }

  void Refused(const HttpRequestHead& head, const absl::Status& status) override {
    const std::optional<RouteInfo> route = FindRoute(head.path);
    if (!route) return;
    OpenAICallResult result;
    result.status = status;
    glm_->CallStarted();
    Record(route->rpc, head, result);
    glm_->CallDone();
  }

 private:
  // The call's record, as GlmServiceImpl::CallDone writes it for the gRPC APIs.
  void Record(Rpc rpc, const HttpRequestHead& head, const OpenAICallResult& result) {
    Metrics* metrics = glm_->metrics();
    const double total = std::chrono::duration<double>(Clock::now() - head.arrival).count();
    const grpc::StatusCode code = ToGrpcStatus(result.status).error_code();
    metrics->RecordRequest(rpc, code, total);
    if (code == grpc::StatusCode::OK && result.finish) metrics->RecordSuccess(rpc, *result.finish);
    AccessLog* log = glm_->options().access_log;
    if (log == nullptr) return;
    AccessRecord a;
    a.time = absl::Now();
    a.rpc = RpcName(rpc);
    a.code = GrpcCodeName(code);
    a.request_id = result.request_id;
    a.peer = head.peer;
    a.total_ms = total * 1e3;
    if (result.finish) {
      const FinishEvent& f = *result.finish;
      a.prompt_tokens = f.prompt_tokens;
      a.generated_tokens = f.generated_tokens;
      if (f.times.first_scheduled) {
        a.queue_ms =
            std::chrono::duration<double>(*f.times.first_scheduled - head.arrival).count() * 1e3;
      }
      if (f.times.first_token) {
        a.ttft_ms =
            std::chrono::duration<double>(*f.times.first_token - head.arrival).count() * 1e3;
      }
    }
    log->Record(std::move(a));
  }

  GlmServiceImpl* const glm_;
};

absl::StatusOr<std::unique_ptr<OpenAIHttpServer>> OpenAIHttpServer::Start(
    const HttpOptions& options, GlmServiceImpl* glm) {
  std::unique_ptr<OpenAIHttpServer> s(new OpenAIHttpServer());
  s->service_ = std::make_unique<Service>(glm);
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, s->service_.get());
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  return s;
}

OpenAIHttpServer::~OpenAIHttpServer() {
  if (server_ != nullptr) server_->Stop();
}

}  // namespace glmserve
