#include "server/kserve_service.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/status.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(glmserve::SteadyTime from, glmserve::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

// A unary reply given at once, reported like GlmService's own (metrics, access log, drain).
class ImmediateReactor final : public grpc::ServerUnaryReactor {
 public:
  ImmediateReactor(GlmServiceImpl* glm, grpc::CallbackServerContext* context, grpc::Status status)
      : glm_(glm), context_(context), arrival_(Clock::now()), status_(status) {
    Finish(std::move(status));
  }
  void OnDone() override {
    glm_->CallDone(Rpc::kKServeMetadata, status_, context_, arrival_, "", nullptr);
    delete this;
  }

 private:
  GlmServiceImpl* const glm_;
  grpc::CallbackServerContext* const context_;
  const glmserve::SteadyTime arrival_;
  const grpc::Status status_;
};

}  // namespace

KServeModel KServeModelOf(const Backend& backend) {
  KServeModel m;
  m.name = backend.info.model();
  m.hidden_size = backend.info.config().hidden_size();
  m.vocab_size = backend.info.config().vocab_size();
  m.layer_begin = backend.info.layer_begin();
  m.layer_end = backend.info.layer_end();
  m.num_layers = backend.info.config().num_hidden_layers();
  return m;
}

// ModelInfer: GlmService's Forward path (ForwardReactor) with KServe's messages around it.
class ModelInferReactor final : public grpc::ServerUnaryReactor {
 public:
  ModelInferReactor(KServeServiceImpl* service, grpc::CallbackServerContext* context,
                    inference::ModelInferResponse* response)
      : service_(service),
        glm_(service->glm_),
        context_(context),
        response_(response),
        arrival_(Clock::now()) {}

  void Start(const inference::ModelInferRequest& request) {
    request_id_ = request.id();
    grpc::Status status;
    const Backend* backend = glm_->Admit(context_, &status);
    if (backend == nullptr) return Reply(status);
    model_ = KServeModelOf(*backend);
    if (absl::Status s = CheckKServeModel(request.model_name(), request.model_version(), model_);
        !s.ok()) {
      return Reply(ToGrpcStatus(s));
    }
    absl::StatusOr<KServeForward> call =
        ToKServeForward(request, model_, backend->limits.max_prompt_tokens);
    if (!call.ok()) return Reply(ToGrpcStatus(call.status()));
    call_ = *std::move(call);
    absl::StatusOr<glmserve::ForwardRequest> body =
        ToEngineForward(call_.forward, backend->engine->model(), backend->limits);
    if (!body.ok()) return Reply(ToGrpcStatus(body.status()));
    // The tensors are in `body` now; the wire copy is no longer needed.
    call_.forward.clear_token_ids();
    call_.forward.clear_hidden_states();
    const ForwardOutputSize size =
        ForwardOutputBytes(*body, backend->engine->model().config(), call_.forward.output_dtype());
    if (!glm_->ReserveOutput(size.engine_bytes + size.reply_bytes)) {
      return Reply(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("the outputs of Forward calls in flight would pass the server's limit of ",
                       glm_->options().max_output_bytes_in_flight, " bytes (this call needs ",
                       size.engine_bytes + size.reply_bytes, "); retry later"))));
    }
    reserved_bytes_ = size.engine_bytes + size.reply_bytes;
    body->session_owner = glm_->CallerIdentity(context_);
    engine_ = backend->engine;
    request_ = &request;  // valid until Finish
    glmserve::Request engine_request(*std::move(body));
    engine_request.deadline = glm_->EngineDeadline(context_);
    engine_request.client_request_id = request.id();
    absl::StatusOr<glmserve::RequestId> id = engine_->Submit(
        std::move(engine_request), [this](glmserve::Event&& event) { OnEvent(std::move(event)); });
    if (!id.ok()) return Reply(ToGrpcStatus(id.status()));
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id_ = *id;
      cancelled = cancelled_;
    }
    if (cancelled) engine_->Cancel(*id);
  }

  void OnCancel() override {
    glmserve::RequestId id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) engine_->Cancel(id);
  }

  void OnDone() override {
    glm_->ReleaseOutput(reserved_bytes_);
    glm_->CallDone(Rpc::kModelInfer, status_, context_, arrival_, request_id_,
                   finished_ ? &finish_ : nullptr);
    delete this;
  }

 private:
  void Reply(grpc::Status status) {
    status_ = status;
    Finish(std::move(status));
  }

  // Engine thread: keep the output, hand the encoding to the encoder pool.
  void OnEvent(glmserve::Event&& event) {
    if (auto* output = std::get_if<glmserve::ForwardOutput>(&event.body)) {
      output_ = std::move(*output);
      return;
    }
    auto* finish = std::get_if<glmserve::FinishEvent>(&event.body);
    if (finish == nullptr) return;
    Metrics* metrics = glm_->metrics();
    if (finish->times.first_scheduled) {
      metrics->RecordQueue(Rpc::kModelInfer, Seconds(arrival_, *finish->times.first_scheduled));
    }
    metrics->RecordTokens(finish->prompt_tokens, 0);
    finish_ = std::move(*finish);
    finished_ = true;
    service_->encoder_.Run([this] { Complete(); });
  }

  void Complete() {
    grpc::Status status = ToGrpcStatus(finish_.status);
    if (status.ok()) {
      v1::ForwardResponse forward;
      FillForwardResponse(output_, engine_->model().config(), call_.forward, &forward);
      output_ = glmserve::ForwardOutput();  // the floats are encoded: free them now
      FillKServeInferResponse(std::move(forward), call_, *request_, model_, response_);
    }
    Reply(std::move(status));  // last: OnDone may delete `this`
  }

  KServeServiceImpl* const service_;
  GlmServiceImpl* const glm_;
  grpc::CallbackServerContext* const context_;
  inference::ModelInferResponse* const response_;
  const glmserve::SteadyTime arrival_;
  glmserve::Engine* engine_ = nullptr;
  const inference::ModelInferRequest* request_ = nullptr;
  std::string request_id_;
  KServeModel model_;
  KServeForward call_;
  int64_t reserved_bytes_ = 0;
  // Written on the engine thread before the encoder task is queued (which orders them).
  glmserve::ForwardOutput output_;
  glmserve::FinishEvent finish_;
  bool finished_ = false;
  grpc::Status status_;

  std::mutex mu_;
  glmserve::RequestId id_ = 0;  // guarded by mu_
  bool cancelled_ = false;      // guarded by mu_
};

KServeServiceImpl::KServeServiceImpl(GlmServiceImpl* glm, std::string server_version)
    : glm_(glm), server_version_(std::move(server_version)), encoder_(2) {}

KServeServiceImpl::~KServeServiceImpl() = default;

grpc::ServerUnaryReactor* KServeServiceImpl::Reply(grpc::CallbackServerContext* context,
                                                   grpc::Status status) {
  return new ImmediateReactor(glm_, context, std::move(status));
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerLive(grpc::CallbackServerContext* context,
                                                        const inference::ServerLiveRequest*,
                                                        inference::ServerLiveResponse* response) {
  glm_->CallStarted();
  response->set_live(true);  // answering at all is being live
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerReady(grpc::CallbackServerContext* context,
                                                         const inference::ServerReadyRequest*,
                                                         inference::ServerReadyResponse* response) {
  glm_->CallStarted();
  response->set_ready(glm_->backend() != nullptr && !glm_->draining());
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelReady(grpc::CallbackServerContext* context,
                                                        const inference::ModelReadyRequest* request,
                                                        inference::ModelReadyResponse* response) {
  glm_->CallStarted();
  grpc::Status status;
  const Backend* backend = glm_->Admit(context, &status);
  if (backend == nullptr) {
    // Authenticated callers learn "not ready" while loading or draining, as the protocol
    // expects of a readiness check; unauthenticated ones get the error.
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return Reply(context, status);
    response->set_ready(false);
    return Reply(context, grpc::Status::OK);
  }
  status =
      ToGrpcStatus(CheckKServeModel(request->name(), request->version(), KServeModelOf(*backend)));
  response->set_ready(status.ok());
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  glm_->CallStarted();
  grpc::Status status;
  if (glm_->Authorized(context)) {
    response->set_name("glmserve");
    response->set_version(server_version_);
  } else {
    status = ToGrpcStatus(absl::UnauthenticatedError(
        "missing or invalid bearer token (metadata 'authorization: Bearer <token>')"));
  }
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  glm_->CallStarted();
  grpc::Status status;
  const Backend* backend = glm_->Admit(context, &status);
  if (backend != nullptr) {
    const KServeModel model = KServeModelOf(*backend);
    status = ToGrpcStatus(CheckKServeModel(request->name(), request->version(), model));
    if (status.ok()) FillKServeModelMetadata(model, response);
  }
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelInfer(grpc::CallbackServerContext* context,
                                                        const inference::ModelInferRequest* request,
                                                        inference::ModelInferResponse* response) {
  glm_->CallStarted();
  auto* reactor = new ModelInferReactor(this, context, response);
  reactor->Start(*request);
  return reactor;
}

}  // namespace glmserve
