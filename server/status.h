// The one place where internal errors (absl::Status, from validation and the engine) become
// gRPC statuses, so that every RPC reports the same condition with the same code.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace glmserve {

// Maps an absl::Status onto the gRPC status with the same canonical code and message
// (absl and gRPC share the canonical code numbering; the mapping is still written out so
// that a code the API does not promise (e.g. DATA_LOSS from a bug) becomes INTERNAL).
grpc::Status ToGrpcStatus(const absl::Status& status);

// "OK", "INVALID_ARGUMENT", ...: the label value of glmserve_requests_total{code}.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace glmserve
