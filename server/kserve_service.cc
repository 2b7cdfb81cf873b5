#include "server/kserve_service.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/convert.h"
#include "server/forward_call.h"
#include "server/raw_call.h"
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
                    grpc::ByteBuffer* raw_response)
      : ForwardCallReactor(service->glm_, &service->encoder_, Rpc::kModelInfer, context),
        raw_response_(raw_response) {}

  void Start(const grpc::ByteBuffer& raw) {
    // As GlmService's raw methods: decoded first (for the log's id), reported after admission.
    const absl::Status decoded = ParseRawRequest(raw, &request_);
    if (decoded.ok()) request_id_ = request_.id();
    const inference::ModelInferRequest& request = request_;
    grpc::Status status;
    const Backend* backend = glm_->Admit(context_, &status);
    if (backend == nullptr) return Reply(status);
    if (!decoded.ok()) return Reply(ToGrpcStatus(decoded));
    model_ = KServeModelOf(*backend);
    if (absl::Status s = CheckKServeModel(request.model_name(), request.model_version(), model_);
        !s.ok()) {
      return Reply(ToGrpcStatus(s));
    }
    absl::StatusOr<KServeForward> call =
        ToKServeForward(request, model_, backend->limits.max_prompt_tokens);
    if (!call.ok()) return Reply(ToGrpcStatus(call.status()));
    call_ = *std::move(call);
    if (absl::Status s = CheckForwardRequest(call_.body, call_.output_dtype,
                                             backend->engine->model().config(), backend->limits);
        !s.ok()) {
      return Reply(ToGrpcStatus(s));
    }
    glmserve::ForwardRequest body = std::move(call_.body);
    call_.body = glmserve::ForwardRequest();  // the tensors travel on in `body`
    Submit(*backend, std::move(body), call_.output_dtype, request.id());
  }

 private:
  absl::Status Encode(glmserve::ForwardOutput& output, const glmserve::FinishEvent&,
                      const ModelConfig&) override {
    inference::ModelInferResponse response;
    FillKServeInferResponse(output, call_, request_, model_, &response);
    output = glmserve::ForwardOutput();  // the floats are encoded: free them now
    return SerializeRawReply(response, raw_response_);
  }

  grpc::ByteBuffer* const raw_response_;
  inference::ModelInferRequest request_;  // parsed in Start
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
  response->set_ready(glm_->backend() != nullptr && !glm_->draining() &&
                      glm_->backend()->engine->health().ok());
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelReady(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* raw_request,
                                                        grpc::ByteBuffer* raw_response) {
  glm_->CallStarted();
  inference::ModelReadyRequest request;
  const absl::Status decoded = ParseRawRequest(*raw_request, &request);
  grpc::Status status;
  const Backend* backend = glm_->Admit(context, &status);
  // Unauthenticated callers get the error whatever they sent.
  if (backend == nullptr && status.error_code() != grpc::StatusCode::UNAVAILABLE) {
    return Reply(context, status);
  }
  if (!decoded.ok()) return Reply(context, ToGrpcStatus(decoded));
  inference::ModelReadyResponse response;
  if (backend == nullptr) {
    // Authenticated callers learn "not ready" while loading or draining, as the protocol
    // expects of a readiness check.
    status = grpc::Status::OK;
    response.set_ready(false);
  } else {
    status =
        ToGrpcStatus(CheckKServeModel(request.name(), request.version(), KServeModelOf(*backend)));
    response.set_ready(status.ok() && backend->engine->health().ok());
  }
  // An error status sends no reply message: only an OK one is serialized.
  if (status.ok()) status = ToGrpcStatus(SerializeRawReply(response, raw_response));
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

grpc::ServerUnaryReactor* KServeServiceImpl::ModelMetadata(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* raw_request,
                                                           grpc::ByteBuffer* raw_response) {
  glm_->CallStarted();
  inference::ModelMetadataRequest request;
  const absl::Status decoded = ParseRawRequest(*raw_request, &request);  // reported after Admit
  grpc::Status status;
  if (const Backend* backend = glm_->Admit(context, &status)) {
    const KServeModel model = KServeModelOf(*backend);
    status = ToGrpcStatus([&]() -> absl::Status {
      RETURN_IF_ERROR(decoded);
      RETURN_IF_ERROR(CheckKServeModel(request.name(), request.version(), model));
      inference::ModelMetadataResponse response;
      FillKServeModelMetadata(model, &response);
      return SerializeRawReply(response, raw_response);
    }());
  }
  return Reply(context, status);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelInfer(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  glm_->CallStarted();
  auto* reactor = new ModelInferReactor(this, context, response);
  reactor->Start(*request);
  return reactor;
}

}  // namespace glmserve
