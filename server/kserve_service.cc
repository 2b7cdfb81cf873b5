#include "server/kserve_service.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/forward_call.h"
#include "server/status.h"

namespace glmserve {
namespace {

using Clock = std::chrono::steady_clock;

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
class ModelInferReactor final : public ForwardCallReactor {
 public:
  ModelInferReactor(KServeServiceImpl* service, grpc::CallbackServerContext* context,
                    inference::ModelInferResponse* response)
      : ForwardCallReactor(service->glm_, &service->encoder_, Rpc::kModelInfer, context),
        response_(response) {}

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
    request_ = &request;  // valid until Finish
    Submit(*backend, *std::move(body), call_.forward.output_dtype(), request.id());
  }

 private:
  absl::Status Encode(glmserve::ForwardOutput& output, const glmserve::FinishEvent&,
                      const ModelConfig& config) override {
    v1::ForwardResponse forward;
    FillForwardResponse(output, config, call_.forward, &forward);
    output = glmserve::ForwardOutput();  // the floats are encoded: free them now
    FillKServeInferResponse(std::move(forward), call_, *request_, model_, response_);
    return absl::OkStatus();
  }

  inference::ModelInferResponse* const response_;
  const inference::ModelInferRequest* request_ = nullptr;
  KServeModel model_;
  KServeForward call_;
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
