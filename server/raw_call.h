// The two ends of a method registered as a raw callback (grpc::ByteBuffer in and out; see
// server/service.h): the request checked on its wire bytes and parsed (server/wire_utf8.h),
// and the reply serialized as gRPC's own proto codec would.
#pragma once

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace glmserve {

// The UTF-8 of every string field, then the parse: INVALID_ARGUMENT naming the field or the
// broken byte. The buffer is the whole received message (gRPC has already applied the receive
// size limit and any decompression).
absl::Status ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message);

// Replaces what `raw` held. INTERNAL if the message does not serialize (beyond 2 GiB; replies are
// bounded far below).
absl::Status SerializeRawReply(const google::protobuf::Message& reply, grpc::ByteBuffer* raw);

}  // namespace glmserve
