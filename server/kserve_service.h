// inference.GRPCInferenceService (KServe v2 / Open Inference Protocol) on the same gRPC port
// as glmserve.v1, over the same engine: ModelInfer is a Forward call (server/kserve_convert.h
// says how tensors and parameters map). Calls are admitted, limited, counted (api="kserve")
// and drained by GlmServiceImpl's rules, so both APIs behave the same: bearer tokens, the
// deadline caps, the output-memory budget, UNAVAILABLE while loading or draining.
// ServerLive and ServerReady need no token (they are probes, like grpc.health.v1).
#pragma once

#include <memory>
#include <string>

#include "inference/grpc_service.grpc.pb.h"
#include "server/executor.h"
#include "server/kserve_convert.h"
#include "server/service.h"

namespace glmserve {

// ModelReady, ModelMetadata and ModelInfer take `string` fields (model names, tensor names,
// datatypes, parameters): raw methods, as GlmService's (server/service.h), so that invalid
// UTF-8 in them is INVALID_ARGUMENT naming the field rather than gRPC's generic refusal.
using KServeServiceBase = inference::GRPCInferenceService::WithRawCallbackMethod_ModelReady<
    inference::GRPCInferenceService::WithRawCallbackMethod_ModelMetadata<
        inference::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
            inference::GRPCInferenceService::CallbackService>>>;

class KServeServiceImpl final : public KServeServiceBase {
 public:
  // `glm` must outlive this service; `server_version` is what ServerMetadata reports.
  KServeServiceImpl(GlmServiceImpl* glm, std::string server_version);
  ~KServeServiceImpl() override;

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  friend class ModelInferReactor;
  // Answers a call on the spot with `status` (counted as KServeMetadata).
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, grpc::Status status);

  GlmServiceImpl* const glm_;
  const std::string server_version_;
  Executor encoder_;  // response encoding off the engine thread (see Executor)
};

// The served model as KServe describes it.
KServeModel KServeModelOf(const Backend& backend);

}  // namespace glmserve
