#include "server/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <limits>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/dtype.h"
#include "core/base/file_io.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"
#include "core/engine/mtp_policy.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/kserve_service.h"
#include "server/reflection.h"
#include "server/text_convert.h"

#ifndef GLMSERVE_VERSION
#define GLMSERVE_VERSION "dev"
#endif

namespace glmserve {
namespace {

constexpr char kServiceName[] = "glmserve.v1.GlmService";

// Certificates, keys and token files: small regular files (a FIFO or a huge file given by
// mistake is an error, not a hang).
absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  constexpr uint64_t kMaxBytes = 4 << 20;
  absl::StatusOr<std::string> text = glmserve::ReadRegularFile(path, kMaxBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  return text;
}

// "host:port", bracketing a bare IPv6 address.
std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(const TlsOptions& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError("a client CA (mutual TLS) needs a certificate and key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a private key");
  }
  ASSIGN_OR_RETURN(std::string cert, ReadFile(tls.cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(std::string key, ReadFile(tls.key_file, "TLS private key"));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(std::string ca, ReadFile(tls.client_ca_file, "TLS client CA"));
    ssl.pem_root_certs = ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

v1::DataType WireDType(glmserve::DType dtype) {
  switch (dtype) {
    case glmserve::DType::kF32:
      return v1::DATA_TYPE_FP32;
    case glmserve::DType::kBF16:
      return v1::DATA_TYPE_BF16;
    case glmserve::DType::kF16:
      return v1::DATA_TYPE_FP16;
    case glmserve::DType::kF8E4M3:  // no wire enumerator yet: ModelInfo.compute names FP8
    case glmserve::DType::kF8E8M0:
      return v1::DATA_TYPE_UNSPECIFIED;
  }
  return v1::DATA_TYPE_UNSPECIFIED;
}

}  // namespace

const char* ServerVersion() { return GLMSERVE_VERSION; }

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "token file"));
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds no token"));
  }
  return tokens;
}

absl::Status ValidateServerOptions(const ServerOptions& o) {
  const struct {
    const char* flag;
    int64_t value, min, max;
  } ranges[] = {
      {"--port", o.port, 0, 65535},
      {"--metrics_port", o.metrics_port, -1, 65535},
      // gRPC takes an int; below a few KiB not even GetModelInfo's reply fits.
      {"--max_message_bytes", o.max_message_bytes, 4096, std::numeric_limits<int32_t>::max()},
      {"--max_concurrent_streams", o.service.max_concurrent_streams, 0, int64_t{1} << 20},
      {"--max_output_bytes_in_flight", o.service.max_output_bytes_in_flight, o.max_message_bytes,
       int64_t{1} << 48},
      {"--http_port", o.http.port, -1, 65535},
      {"--http_threads", o.http.threads, 1, 4096},
      {"--max_http_body_bytes", o.http.max_body_bytes, 4096, int64_t{1} << 30},
      {"--http_io_threads", o.http.io_threads, 1, 256},
      {"--http_max_connections", o.http.max_connections, 1, int64_t{1} << 20},
      // At least one largest body, or such a request could never be served.
      {"--http_max_body_bytes_in_flight", o.http.max_body_bytes_in_flight, o.http.max_body_bytes,
       int64_t{1} << 40},
      {"--mtp_draft_tokens", o.mtp_draft_tokens, -1, glmserve::kMaxMtpDraftTokens},
  };
  for (const auto& r : ranges) {
    if (r.value < r.min || r.value > r.max) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.flag, "=", r.value, " is outside [", r.min, ", ", r.max, "]"));
    }
  }
  if (o.service.default_deadline < absl::ZeroDuration() ||
      o.service.max_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--default_deadline and --max_deadline must be >= 0");
  }
  for (const auto& [flag, d] : {std::pair{"--http_header_timeout", o.http.header_timeout},
                                std::pair{"--http_body_timeout", o.http.body_timeout},
                                std::pair{"--http_idle_timeout", o.http.idle_timeout}}) {
    if (d <= absl::ZeroDuration() || d > absl::Hours(24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", absl::FormatDuration(d), " is outside (0, 24h]"));
    }
  }
  if (o.address.empty()) return absl::InvalidArgumentError("--address is empty");
  if (absl::Status s = glmserve::ValidateEngineOptions(o.engine); !s.ok()) {
    // The engine names its options as EngineOptions fields, which are the flags' names.
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GlmServer>> GlmServer::Start(const ServerOptions& options) {
  RETURN_IF_ERROR(ValidateServerOptions(options));
  std::unique_ptr<GlmServer> s(new GlmServer());
  s->options_ = options;
  ServiceOptions service_options = options.service;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokenFile(options.auth_token_file));
    service_options.auth_tokens = std::move(tokens);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeCredentials(options.tls));

  if (!options.access_log.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<AccessLog> log,
                     AccessLog::Open(options.access_log, options.log_format));
    s->access_log_ = std::move(log);
    service_options.access_log = s->access_log_.get();
  }
  s->metrics_ = std::make_unique<Metrics>();
  s->service_ = std::make_unique<GlmServiceImpl>(std::move(service_options), s->metrics_.get());
  s->kserve_ = std::make_unique<KServeServiceImpl>(s->service_.get(), ServerVersion());

  // Both are process-wide switches read by the next ServerBuilder.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's health service encodes its messages without the generated classes, so nothing
  // would pull health.pb.cc out of the static glm_proto library, and reflection (which reads
  // the generated pool) listed grpc.health.v1.Health without being able to describe it.
  // Naming a descriptor links the file and registers it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  s->reflection_v1_ = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
      kServiceName, "inference.GRPCInferenceService", "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
  grpc::ServerBuilder builder;
  const std::string address = HostPort(options.address, options.port);
  builder.AddListeningPort(address, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->kserve_.get());
  builder.RegisterService(s->reflection_v1_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(kLivenessService, true);
  s->SetReady(false);

  if (options.metrics_port >= 0) {
    const std::string metrics_address =
        HostPort(options.metrics_address.empty() ? options.address : options.metrics_address,
                 options.metrics_port);
    // /metrics: the same HTTP server and limits as the OpenAI endpoint, one handler thread
    // (a scrape is answered on the I/O thread).
    HttpOptions metrics_http = options.http;
    metrics_http.address =
        options.metrics_address.empty() ? options.address : options.metrics_address;
    metrics_http.port = options.metrics_port;
    metrics_http.threads = 1;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> exposer =
        MetricsHttpServer::Start(metrics_http, s->metrics_.get());
    if (!exposer.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", metrics_address, ": ",
                                                 exposer.status().message()));
    }
    s->metrics_http_ = *std::move(exposer);
    s->metrics_port_ = s->metrics_http_->port();
  }
  if (options.http.port >= 0) {
    HttpOptions http = options.http;
    http.address = options.address;
    ASSIGN_OR_RETURN(s->http_, OpenAIHttpServer::Start(http, s->service_.get()));
  }
  return s;
}

GlmServer::~GlmServer() { Shutdown(); }

std::string GlmServer::target() const {
  const std::string& a = options_.address;
  if (a == "0.0.0.0" || a.empty()) return HostPort("127.0.0.1", port_);
  if (a == "::" || a == "[::]") return HostPort("::1", port_);
  return HostPort(a, port_);
}

void GlmServer::SetReady(bool ready) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(kReadinessService, ready);
  health->SetServingStatus("", ready);
  health->SetServingStatus(kServiceName, ready);
  ready_ = ready;
}

absl::Status GlmServer::Serve(std::unique_ptr<glmserve::ModelRunner> model,
                              glmserve::DType weight_dtype, TextAssets text) {
  const glmserve::ModelConfig config = model->config();
  // Every id the tokenizer can produce must have an embedding row (a prompt's) and an lm_head
  // column (a generated one's): a tokenizer larger than the model is the wrong one.
  if (text.tokenizer != nullptr && text.tokenizer->id_limit() > config.vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokenizer in ", text.source, " has ids up to ",
                     text.tokenizer->id_limit() - 1, " but the model's vocabulary has ",
                     config.vocab_size, " rows: not this model's tokenizer (--tokenizer_dir)"));
  }
  const std::string device = model->device_name();
  const std::string compute = model->compute_description();
  const int64_t layer_begin = model->layer_begin();
  const int64_t layer_end = model->layer_end();
  const int64_t weight_bytes = model->weight_bytes();
  glmserve::EngineOptions engine_options = options_.engine;
  engine_options.mtp_draft_tokens = std::max(0, options_.mtp_draft_tokens);
  if (options_.mtp_draft_tokens < 0 && model->has_mtp() && model->EnableMtp().ok()) {
    // Auto: draft where it pays on this model and machine (core/engine/mtp_policy.h).
    ASSIGN_OR_RETURN(const glmserve::MtpStepCosts costs, glmserve::MeasureMtpStepCosts(*model));
    std::string why;
    engine_options.mtp_draft_tokens = glmserve::AutoMtpDraftTokens(costs, &why);
    mtp_choice_ = absl::StrCat("auto, ", why);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<glmserve::Engine> engine,
                   glmserve::Engine::Create(std::move(model), engine_options));
  engine_ = std::move(engine);
  kv_bytes_per_token_ = engine_->kv_bytes_per_token();  // in the cache's dtype
  ServingLimits limits;
  static_cast<glmserve::RequestLimits&>(limits) = engine_->limits();
  limits.max_reply_bytes = options_.max_message_bytes;
  Metrics* metrics = metrics_.get();
  std::atomic<int64_t>* observed = &steps_observed_;
  engine_->SetStepObserver([metrics, observed](const glmserve::StepReport& r) {
    metrics->ObserveStep(r);
    observed->fetch_add(1);
  });
  // A runner that can no longer run steps (a tensor-parallel rank died or hung) takes the
  // instance out of readiness, with the reason on stderr: the orchestrator restarts it whole.
  engine_->SetUnhealthyObserver([this](const absl::Status& why) {
    std::fprintf(stderr, "glm-server: not ready: %s\n", why.ToString().c_str());
    SetReady(false);
  });
  if (absl::Status s = Warmup(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("warm-up: ", s.message()));
  }
  metrics_->SetEngine(engine_.get());
  metrics_->SetBuildInfo(ServerVersion(), options_.model_name, device);

  auto backend = std::make_unique<Backend>();
  backend->engine = engine_.get();
  backend->limits = limits;
  backend->text = std::make_shared<const TextAssets>(std::move(text));
  v1::ModelInfo& info = backend->info;
  info.set_model(options_.model_name);
  info.set_architecture(config.is_mla() ? "GlmMoeDsaForCausalLM" : "Glm4MoeForCausalLM");
  FillModelConfig(config, info.mutable_config());
  info.set_layer_begin(layer_begin);
  info.set_layer_end(layer_end);
  info.set_weight_dtype(WireDType(weight_dtype));
  info.set_device(device);
  info.set_compute(compute);
  info.set_weight_bytes(weight_bytes);
  info.set_kv_capacity_tokens(engine_->kv_capacity_tokens());
  info.set_kv_block_size(engine_->options().block_size);
  info.set_kv_cache_dtype(
      glmserve::KvCacheDTypeName(glmserve::KvCacheDTypeOf(engine_->kv_cache_dtype())));
  info.set_kv_bytes_per_token(kv_bytes_per_token_);
  info.set_mtp_draft_tokens(engine_->options().mtp_draft_tokens);
  info.set_has_mtp_layer(engine_->model().has_mtp());
  v1::Limits* l = info.mutable_limits();
  l->set_max_prompt_tokens(limits.max_prompt_tokens);
  l->set_max_new_tokens(limits.max_new_tokens);
  l->set_default_max_new_tokens(limits.default_max_new_tokens);
  l->set_max_message_bytes(options_.max_message_bytes);
  l->set_max_concurrent_streams(options_.service.max_concurrent_streams);
  l->set_max_waiting(engine_->options().max_waiting);
  l->set_max_running(engine_->options().max_running);
  l->set_max_batch_tokens(engine_->options().max_batch_tokens);
  l->set_default_deadline_ms(absl::ToInt64Milliseconds(options_.service.default_deadline));
  l->set_max_deadline_ms(absl::ToInt64Milliseconds(options_.service.max_deadline));
  l->set_max_sessions(engine_->options().max_sessions);
  FillTextInfo(*backend->text, &info);
  info.set_server_version(ServerVersion());
  info_ = info;
  service_->Attach(std::move(backend));
  SetReady(true);
  return absl::OkStatus();
}

std::string GlmServer::StartupSummary() const {
  const v1::ModelInfo& i = info_;
  const v1::Limits& l = i.limits();
  // GB (1e9) as docs/operations.md sizes models; MB below one GB.
  const auto size = [](double bytes) {
    return bytes >= 1e9 ? absl::StrFormat("%.2f GB", bytes / 1e9)
                        : absl::StrFormat("%.1f MB", bytes / 1e6);
  };
  const double kv_bytes = static_cast<double>(kv_bytes_per_token_) * i.kv_capacity_tokens();
  const auto duration = [](int64_t ms) {
    return ms > 0 ? absl::FormatDuration(absl::Milliseconds(ms)) : std::string("none");
  };
  std::string out;
  absl::StrAppend(&out, "model       ", i.model(), " (", i.config().num_hidden_layers(),
                  " layers, hidden ", i.config().hidden_size(), ", ", i.config().n_routed_experts(),
                  " experts, vocab ", i.config().vocab_size(), ")\n");
  absl::StrAppend(&out, "layers      ", i.layer_begin(), ":", i.layer_end(), "\n");
  absl::StrAppend(
      &out, "text        ",
      i.has_tokenizer()
          ? absl::StrCat("tokenizer ", i.tokenizer_source(), " (", i.tokenizer_vocab_size(),
                         " ids), chat template ", i.has_chat_template() ? "GLM-4.5" : "none")
          : std::string("none (token ids only)"),
      "\n");
  absl::StrAppend(&out, "device      ", i.device(), ", ", glmserve::NumThreads(), " CPU threads\n");
  if (!i.compute().empty()) absl::StrAppend(&out, "compute     ", i.compute(), "\n");
  absl::StrAppend(&out, "memory      ", size(i.weight_bytes()), " weights (",
                  v1::DataType_Name(i.weight_dtype()).substr(10), ") + ", size(kv_bytes),
                  " KV cache = ", size(i.weight_bytes() + kv_bytes), "\n");
  absl::StrAppend(&out, "kv cache    ", i.kv_capacity_tokens(), " tokens in blocks of ",
                  i.kv_block_size(), " (", kv_bytes_per_token_, " bytes per token, ",
                  i.kv_cache_dtype(), "), prefix caching ",
                  options_.engine.prefix_caching ? "on" : "off", "\n");
  absl::StrAppend(&out, "speculation ",
                  i.mtp_draft_tokens() > 0
                      ? absl::StrCat("MTP layer, ", i.mtp_draft_tokens(), " draft token",
                                     i.mtp_draft_tokens() == 1 ? "" : "s", " per step")
                      : std::string(i.has_mtp_layer() ? "off (the model has an MTP layer)"
                                                      : "off (no MTP layer)"),
                  mtp_choice_.empty() ? "" : absl::StrCat(" (", mtp_choice_, ")"), "\n");
  absl::StrAppend(&out, "engine      max_batch_tokens ", l.max_batch_tokens(), ", max_running ",
                  l.max_running(), ", max_waiting ", l.max_waiting(), ", max_sessions ",
                  l.max_sessions(), "\n");
  absl::StrAppend(&out, "requests    max_prompt_tokens ", l.max_prompt_tokens(),
                  ", max_new_tokens ", l.max_new_tokens(), " (default ", l.default_max_new_tokens(),
                  "), max_concurrent_streams ", l.max_concurrent_streams(), ", max_message_bytes ",
                  l.max_message_bytes(), ", default_deadline ", duration(l.default_deadline_ms()),
                  ", max_deadline ", duration(l.max_deadline_ms()), "\n");
  const bool tls = !options_.tls.cert_file.empty();
  absl::StrAppend(&out, "security    TLS ",
                  tls ? (options_.tls.client_ca_file.empty() ? "on" : "on, mutual") : "off",
                  ", bearer tokens ", options_.auth_token_file.empty() ? "off" : "on", "\n");
  absl::StrAppend(
      &out, "logging     access log ",
      options_.access_log.empty()
          ? std::string("off")
          : absl::StrCat(options_.access_log == "-" ? "stdout" : options_.access_log, " (",
                         options_.log_format == LogFormat::kJson ? "json" : "text", ")"),
      "\n");
  return out;
}

absl::Status GlmServer::Warmup() {
  const glmserve::ModelRunner& model = engine_->model();
  std::optional<glmserve::Request> request;
  if (model.has_embedding() && model.has_head()) {
    glmserve::GenerateRequest body;
    body.prompt = {0};
    body.stop.max_new_tokens = 1;
    body.stop.ignore_eos = true;
    request.emplace(std::move(body));
  } else {
    glmserve::ForwardRequest body;
    if (model.has_embedding()) {
      body.token_ids = {0};
    } else {
      body.hidden.assign(static_cast<size_t>(model.config().hidden_size), 0.0f);
      body.num_tokens = 1;
    }
    body.return_hidden = true;  // a call must ask for some output
    request.emplace(std::move(body));
  }
  // Shared with the callback: the engine may still be inside it when Pop returns.
  auto queue = std::make_shared<glmserve::EventQueue>();
  absl::StatusOr<glmserve::RequestId> id = engine_->Submit(
      *std::move(request), [queue](glmserve::Event&& e) { queue->Callback()(std::move(e)); });
  if (!id.ok()) return id.status();
  for (;;) {
    std::optional<glmserve::Event> event = queue->Pop(absl::Minutes(30));
    if (!event) return absl::DeadlineExceededError("no answer within 30 minutes");
    auto* finish = std::get_if<glmserve::FinishEvent>(&event->body);
    if (finish == nullptr) continue;
    if (!finish->status.ok()) return finish->status;
    break;
  }
  // The engine delivers a step's events only after publishing its stats and calling the
  // step observer, so the server is quiescent (and its metrics final) here.
  if (!engine_->Idle() || steps_observed_.load() < engine_->Stats().steps) {
    return absl::InternalError("the engine was not quiescent after the warm-up request");
  }
  return absl::OkStatus();
}

void GlmServer::Drain(absl::Duration grace) {
  std::lock_guard<std::mutex> lock(drain_mu_);
  if (stopped_ || server_ == nullptr) return;
  stopped_ = true;
  SetReady(false);
  service_->StartDraining();
  if (engine_ != nullptr) engine_->StartDraining();
  service_->WaitIdle(absl::Now() + grace);
  if (engine_ != nullptr) {
    // What is still running ends with UNAVAILABLE, a code clients retry elsewhere, and gets a
    // moment to reach them before the transport goes down.
    engine_->AbortAll(absl::UnavailableError(
        "the server shut down before this call finished (drain grace passed); retry"));
    service_->WaitIdle(absl::Now() + absl::Seconds(2));
  }
  // Cancels what is still in flight (OnCancel -> engine Cancel -> the reactor finishes) and
  // waits for every call to end, health watches included.
  server_->Shutdown(std::chrono::system_clock::now());
  // HTTP handlers still waiting got their engine request's end from AbortAll; new ones are
  // refused (draining). Stopping joins every handler.
  if (http_ != nullptr) http_->Stop();
  service_->WaitIdle(absl::InfiniteFuture());
  // No call can reach the engine any more: detach it from the metrics, then stop it.
  metrics_->SetEngine(nullptr);
  engine_.reset();
  if (metrics_http_ != nullptr) metrics_http_->Stop();
}

}  // namespace glmserve
