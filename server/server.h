// GlmServer: the gRPC server around one engine, with health, reflection, TLS, bearer-token
// auth, metrics on their own port, and a graceful drain.
//
// Lifecycle, in the order glm-server's main runs it:
//   Start()  listens at once (so that liveness probes pass while a large model loads);
//            readiness is NOT_SERVING and every GlmService call is UNAVAILABLE.
//   Serve()  takes the loaded model, creates the engine, runs one warm-up request through
//            it, then marks readiness SERVING.
//   Drain()  readiness NOT_SERVING, new calls UNAVAILABLE, waits up to a grace period for the
//            calls in flight, then shuts down (cancelling what is left).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/engine.h"
#include "core/model/model_runner.h"
#include "core/text/text_assets.h"
#include "grpcpp/server.h"
#include "server/access_log.h"
#include "server/http/http_server.h"
#include "server/http/metrics_server.h"
#include "server/http/openai_server.h"
#include "server/metrics.h"
#include "server/service.h"

namespace glmserve {

class ReflectionV1Service;
class KServeServiceImpl;

// Health service names (grpc.health.v1): liveness is SERVING while the process serves RPCs at
// all; readiness (and the overall "" service and glmserve.v1.GlmService) only while it can
// take requests.
inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "readiness";

// The server's version, as glmserve_build_info and ModelInfo report it.
const char* ServerVersion();

struct TlsOptions {
  std::string cert_file;       // PEM server certificate chain; empty: plaintext
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle: when set, clients must present a certificate
                               // it signed (mutual TLS)
};

struct ServerOptions {
  std::string address = "127.0.0.1";  // host or IP to listen on ("[::1]" or "::1" for IPv6)
  int port = 50051;                   // 0: an ephemeral port (see GlmServer::port())
  std::string metrics_address;        // empty: same as `address`
  int metrics_port = 9090;            // 0: ephemeral; < 0: no metrics endpoint
  TlsOptions tls;
  // The OpenAI-compatible HTTP endpoint (off unless http.port >= 0); its address is `address`.
  HttpOptions http;
  std::string auth_token_file;  // one accepted token per line ('#' comments); empty: no auth
  int64_t max_message_bytes = 64 << 20;
  ServiceOptions service;          // streams, deadlines (auth_tokens filled from the file)
  glmserve::EngineOptions engine;  // includes the request limits (engine.limits)
  // Speculative decoding (docs/mtp.md): engine.mtp_draft_tokens, or -1: 1 when the model has
  // an MTP layer that its backend runs, else 0 (resolved by Serve).
  int32_t mtp_draft_tokens = -1;
  std::string model_name;  // what ModelInfo and build_info call the model
  std::string access_log;  // file (appended) or "-" (stdout) for one line per call; empty: off
  LogFormat log_format = LogFormat::kText;
};

// The one check of every option (each flag of glm-server lands here): INVALID_ARGUMENT
// naming the flag and its allowed range. Start() runs it; glm-server exits 2 on it.
absl::Status ValidateServerOptions(const ServerOptions& options);

class GlmServer {
 public:
  // Binds and starts serving health, reflection and (UNAVAILABLE) GlmService calls.
  static absl::StatusOr<std::unique_ptr<GlmServer>> Start(const ServerOptions& options);
  ~GlmServer();  // Shutdown()

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_ != nullptr ? http_->port() : -1; }
  // "127.0.0.1:PORT" (or "[::1]:PORT"): what a client on this machine dials.
  std::string target() const;

  // Creates the engine over `model`, warms it up with one request, attaches it to the
  // service and marks readiness SERVING. `weight_dtype` (ModelWeights::weight_dtype) is
  // what GetModelInfo reports. `text`: the tokenizer and chat template (LoadTextAssets);
  // empty: token ids only, text requests FAILED_PRECONDITION. FAILED_PRECONDITION when the
  // tokenizer has ids beyond the model's vocabulary.
  absl::Status Serve(std::unique_ptr<glmserve::ModelRunner> model, glmserve::DType weight_dtype,
                     TextAssets text = {});
  // Before Serve: the KV cache's size in tokens (glm-server's --gpu_memory_fraction plan).
  void SetKvCapacityTokens(int64_t tokens) { options_.engine.kv_capacity_tokens = tokens; }

  // Graceful shutdown: readiness NOT_SERVING, new calls UNAVAILABLE, calls in flight get up
  // to `grace` to finish, then what is left is cancelled and the server stops. Idempotent.
  void Drain(absl::Duration grace);
  // Stops at once (calls in flight are cancelled). Idempotent.
  void Shutdown() { Drain(absl::ZeroDuration()); }

  bool ready() const { return ready_; }
  // After Serve: what an operator checks first, one "key  value" line each: model, layers,
  // device, weights, the memory plan (weights + KV cache), KV capacity, engine and request
  // limits, security and logging. glm-server prints it once ready.
  std::string StartupSummary() const;
  glmserve::Engine* engine() { return engine_.get(); }
  Metrics& metrics() { return *metrics_; }
  GlmServiceImpl& service() { return *service_; }
  // Null without ServerOptions::access_log.
  AccessLog* access_log() { return access_log_.get(); }

 private:
  GlmServer() = default;
  absl::Status Warmup();
  void SetReady(bool ready);

  ServerOptions options_;
  std::unique_ptr<AccessLog> access_log_;  // outlives the service that writes to it
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<GlmServiceImpl> service_;
  std::unique_ptr<KServeServiceImpl> kserve_;  // inference.GRPCInferenceService, same port
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // null without metrics_port
  std::unique_ptr<OpenAIHttpServer> http_;           // null without ServerOptions::http.port
  std::unique_ptr<glmserve::Engine> engine_;
  std::atomic<int64_t> steps_observed_{0};  // steps the metrics observer has seen
  v1::ModelInfo info_;                      // as GetModelInfo answers, set by Serve
  std::string mtp_choice_;          // why --mtp_draft_tokens=-1 chose what it did (startup summary)
  int64_t kv_bytes_per_token_ = 0;  // set by Serve
  int port_ = 0;
  int metrics_port_ = -1;
  std::atomic<bool> ready_{false};  // set by the engine thread too (an unhealthy runner)
  std::mutex drain_mu_;             // serialises Drain
  bool stopped_ = false;            // guarded by drain_mu_
};

// Reads a token file: one token per line, surrounding whitespace trimmed, blank lines and
// lines starting with '#' skipped. An error when unreadable or without any token.
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path);

}  // namespace glmserve
