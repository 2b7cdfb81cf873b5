#include "server/raw_call.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/slice.h"
#include "server/wire_utf8.h"

namespace glmserve {

absl::Status ParseRawRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message) {
  // One contiguous view for the walk and the parse: a copy when gRPC received the message in
  // several slices (a large one does), small next to the work a request asks for (even a
  // Forward's 64 MiB tensor: a memcpy beside the parse's own, docs/api.md).
  grpc::Slice slice;
  if (raw.Valid() && !raw.DumpToSingleSlice(&slice).ok()) {
    return absl::InternalError("the request's bytes could not be read");
  }
  const std::string_view wire(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return ParseCheckedMessage(wire, message);
}

absl::Status SerializeRawReply(const google::protobuf::Message& reply, grpc::ByteBuffer* raw) {
  raw->Clear();  // gRPC's writer fills an empty buffer only (Generate reuses its buffer)
  bool own_buffer;
  const grpc::Status s =
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(reply, raw, &own_buffer);
  if (!s.ok()) return absl::InternalError(absl::StrCat("reply: ", s.error_message()));
  return absl::OkStatus();
}

}  // namespace glmserve
