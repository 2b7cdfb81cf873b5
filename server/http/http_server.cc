#include "server/http/http_server.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "civetweb.h"
#include "server/http/connection_watch.h"
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

// The same accepted tokens as the gRPC APIs, in the same header form.
bool Authorized(const ServiceOptions& options, const char* header) {
  if (options.auth_tokens.empty()) return true;
  if (header == nullptr) return false;
  const absl::string_view value(header);
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(value, kBearer)) return false;
  const absl::string_view token = value.substr(kBearer.size());
  bool ok = false;
  for (const std::string& accepted : options.auth_tokens) ok |= ConstantTimeEquals(token, accepted);
  return ok;
}

// The gRPC code a call's status counts as in glmserve_requests_total (same label values as
// the gRPC APIs: one dashboard for all three).
grpc::StatusCode MetricCode(const absl::Status& status) {
  return ToGrpcStatus(status).error_code();
}

// Reads the body: 413 before reading when the declared length is over the limit, or as soon
// as a chunked body passes it.
absl::StatusOr<std::string> ReadBody(mg_connection* conn, int64_t limit) {
  const mg_request_info* info = mg_get_request_info(conn);
  const auto too_large = [&](const std::string& size) {
    return WithHttpStatus(
        absl::ResourceExhaustedError(absl::StrCat(
            "the request body (", size, ") is over the server's limit of ", limit, " bytes")),
        413);
  };
  if (info->content_length > limit) return too_large(absl::StrCat(info->content_length, " bytes"));
  std::string body;
  if (info->content_length >= 0) body.reserve(static_cast<size_t>(info->content_length));
  char buffer[16384];
  for (;;) {
    const int n = mg_read(conn, buffer, sizeof buffer);
    if (n < 0) return absl::InvalidArgumentError("the request body could not be read");
    if (n == 0) break;
    body.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(body.size()) > limit) return too_large("chunked, longer");
  }
  return body;
}

}  // namespace

HttpExchange::HttpExchange(mg_connection* conn) : conn_(conn) {}

void HttpExchange::SendJson(int status, const std::string& body) {
  status_ = status;
  mg_response_header_start(conn_, status);
  mg_response_header_add(conn_, "Content-Type", "application/json", -1);
  const std::string length = std::to_string(body.size());
  mg_response_header_add(conn_, "Content-Length", length.c_str(), -1);
  if (status == 401) mg_response_header_add(conn_, "WWW-Authenticate", "Bearer", -1);
  mg_response_header_send(conn_);
  mg_write(conn_, body.data(), body.size());
}

void HttpExchange::SendError(const absl::Status& status) {
  const HttpError e = ToHttpError(status);
  SendJson(e.status, e.body);
}

bool HttpExchange::StartEventStream() {
  status_ = 200;
  return mg_send_http_ok(conn_, "text/event-stream", -1) >= 0;
}

bool HttpExchange::SendEvent(const std::string& data) {
  const std::string event = absl::StrCat("data: ", data, "\n\n");
  return mg_send_chunk(conn_, event.data(), static_cast<unsigned>(event.size())) > 0;
}

void HttpExchange::EndEventStream() { mg_send_chunk(conn_, "", 0); }

bool HttpExchange::PeerClosed() {
  if (!watch_ready_) {
    // Found once, on the first wait (most calls finish before they ever poll).
    const mg_request_info* info = mg_get_request_info(conn_);
    watch_ =
        std::make_unique<ConnectionWatch>(info->remote_addr, info->remote_port, info->server_port);
    watch_ready_ = true;
  }
  return watch_->PeerClosed();
}

std::string HttpExchange::peer() const {
  const mg_request_info* info = mg_get_request_info(conn_);
  // As gRPC writes peers in the access log.
  const absl::string_view addr = info->remote_addr;
  return addr.find(':') == absl::string_view::npos
             ? absl::StrCat("ipv4:", addr, ":", info->remote_port)
             : absl::StrCat("ipv6:[", addr, "]:", info->remote_port);
}

absl::StatusOr<std::unique_ptr<OpenAIHttpServer>> OpenAIHttpServer::Start(
    const HttpOptions& options, GlmServiceImpl* glm) {
  std::unique_ptr<OpenAIHttpServer> s(new OpenAIHttpServer(options, glm));
  mg_init_library(0);
  const std::string host =
      options.address.find(':') != std::string::npos && options.address.front() != '['
          ? absl::StrCat("[", options.address, "]")
          : options.address;
  const std::string listen = absl::StrCat(host, ":", options.port);
  const std::string threads = std::to_string(options.threads);
  const char* civet_options[] = {"listening_ports", listen.c_str(), "num_threads", threads.c_str(),
                                 // A client that stops sending or reading for this
                                 // long loses its connection (and its generation) and
                                 // frees its worker.
                                 "request_timeout_ms", "30000", "enable_keep_alive", "yes",
                                 nullptr};
  mg_callbacks callbacks{};
  s->ctx_ = mg_start(&callbacks, nullptr, civet_options);
  if (s->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", listen));
  }
  mg_set_request_handler(s->ctx_, "/", &OpenAIHttpServer::Handle, s.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(s->ctx_, 4, ports);
  s->port_ = n > 0 ? ports[0].port : -1;
  return s;
}

OpenAIHttpServer::~OpenAIHttpServer() { Stop(); }

void OpenAIHttpServer::Stop() {
  if (ctx_ == nullptr) return;
  mg_stop(ctx_);  // joins the workers: every handler has returned
  ctx_ = nullptr;
}

int OpenAIHttpServer::Handle(mg_connection* conn, void* self) {
  HttpExchange exchange(conn);
  static_cast<OpenAIHttpServer*>(self)->Route(exchange, conn);
  return exchange.http_status() == 0 ? 500 : exchange.http_status();
}

void OpenAIHttpServer::Route(HttpExchange& exchange, mg_connection* conn) {
  const glmserve::SteadyTime arrival = Clock::now();
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string method = info->request_method;
  const std::string uri = info->local_uri;
  Rpc rpc;
  bool post = true;
  if (uri == "/v1/completions") {
    rpc = Rpc::kOpenAICompletions;
  } else if (uri == "/v1/chat/completions") {
    rpc = Rpc::kOpenAIChatCompletions;
  } else if (uri == "/v1/models") {
    rpc = Rpc::kOpenAIModels;
    post = false;
  } else {
    exchange.SendError(
        absl::NotFoundError(absl::StrCat("no route ", uri.substr(0, 128),
                                         " (routes: GET /v1/models, POST /v1/completions, "
                                         "POST /v1/chat/completions)")));
    return;  // not a call of the API: not counted
  }
  glm_->CallStarted();
  OpenAICallResult result;
  const Backend* backend = nullptr;
  if (method != (post ? "POST" : "GET")) {
    result.status = WithHttpStatus(
        absl::InvalidArgumentError(absl::StrCat(uri, " takes ", post ? "POST" : "GET")), 405);
  } else if (!Authorized(glm_->options(), mg_get_header(conn, "Authorization"))) {
    result.status = absl::UnauthenticatedError(
        "missing or invalid bearer token (header 'Authorization: Bearer <token>')");
  } else if (glm_->draining()) {
    result.status = absl::UnavailableError("server is draining for shutdown");
  } else if ((backend = glm_->backend()) == nullptr) {
    result.status = absl::UnavailableError("server is loading the model");
  } else if (!post) {
    ServeModels(*backend, exchange);
  } else {
    absl::StatusOr<std::string> body = ReadBody(conn, options_.max_body_bytes);
    if (!body.ok()) {
      result.status = body.status();
    } else {
      result = ServeCompletion(*glm_, *backend, *body, rpc == Rpc::kOpenAIChatCompletions, exchange,
                               arrival);
    }
  }
  if (!result.status.ok() && exchange.http_status() == 0 &&
      result.status.code() != absl::StatusCode::kCancelled) {
    exchange.SendError(result.status);
  }
  // The call's record, as GlmServiceImpl::CallDone writes it for the gRPC APIs.
  Metrics* metrics = glm_->metrics();
  const double total = std::chrono::duration<double>(Clock::now() - arrival).count();
  const grpc::StatusCode code = MetricCode(result.status);
  metrics->RecordRequest(rpc, code, total);
  if (code == grpc::StatusCode::OK && result.finish) metrics->RecordSuccess(rpc, *result.finish);
  if (AccessLog* log = glm_->options().access_log) {
    AccessRecord a;
    a.time = absl::Now();
    a.rpc = RpcName(rpc);
    a.code = GrpcCodeName(code);
    a.request_id = result.request_id;
    a.peer = exchange.peer();
    a.total_ms = total * 1e3;
    if (result.finish) {
      const glmserve::FinishEvent& f = *result.finish;
      a.prompt_tokens = f.prompt_tokens;
      a.generated_tokens = f.generated_tokens;
      if (f.times.first_scheduled) {
        a.queue_ms =
            std::chrono::duration<double>(*f.times.first_scheduled - arrival).count() * 1e3;
      }
      if (f.times.first_token) {
        a.ttft_ms = std::chrono::duration<double>(*f.times.first_token - arrival).count() * 1e3;
      }
    }
    log->Record(std::move(a));
  }
  glm_->CallDone();
}

}  // namespace glmserve
