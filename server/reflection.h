// grpc.reflection.v1.ServerReflection, answered from the process's generated descriptor pool.
//
// Debian 12's libgrpc++_reflection serves only grpc.reflection.v1alpha; current grpcurl and
// grpc_cli ask for v1 first. This is v1 over the vendored proto/grpc/reflection/v1 (messages
// are wire-identical to v1alpha's), registered next to gRPC's v1alpha plugin.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace glmserve {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the full names this server serves; ListServices reports those whose
  // descriptor the pool holds (so every listed service can also be described).
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  // One request's answer (exposed for tests).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
};

}  // namespace glmserve
