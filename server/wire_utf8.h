// The UTF-8 of a request's text, checked on its wire bytes before protobuf parses them.
//
// Request text is `string` in glmserve.proto (so that proto3's JSON mapping and generated stubs
// treat it as text), and protobuf's parser refuses a proto3 string holding invalid UTF-8 by
// failing the whole message, which gRPC reports as a generic error before any handler runs.
// The RPCs whose requests have string fields are raw methods instead (server/service.h,
// server/kserve_service.h): their bytes are walked here with the message's Descriptor first,
// so that invalid UTF-8 becomes INVALID_ARGUMENT naming the field (`messages[1].content`,
// `stop.stop_strings[3]`), and only then parsed. No transport types: the walk takes the
// serialized message.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace glmserve {

// Nesting the walk follows (known message fields and unknown groups together): protobuf's own
// default recursion limit, so that the walk refuses no message protobuf would parse. The
// request schemas nest at most four deep; the bound only stops hostile input.
inline constexpr int kMaxWireDepth = 100;

// Walks `wire`, the protobuf wire encoding of a `descriptor` message: every field the
// descriptor knows as `string` (wire type 2) must hold valid UTF-8 (core/text/unicode.h's
// ValidateUtf8, the project's one UTF-8 check), at any depth through known message fields.
// Unknown fields are skipped, as protobuf keeps them unchecked. INVALID_ARGUMENT naming the
// field and the bad byte's offset, or, for data that is not the wire format (a truncated
// varint or length, field number 0, a wire type that does not exist, unbalanced groups,
// nesting beyond kMaxWireDepth), naming the byte where it breaks. Linear in wire's size.
absl::Status CheckWireUtf8(const google::protobuf::Descriptor& descriptor, std::string_view wire);

// CheckWireUtf8 for message's type, then parses `wire` into `message` (cleared first).
// INVALID_ARGUMENT also for wire data that passes the walk but that protobuf does not parse
// (e.g. a truncated varint inside a packed repeated field).
absl::Status ParseCheckedMessage(std::string_view wire, google::protobuf::Message* message);

}  // namespace glmserve
