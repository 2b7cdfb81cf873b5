// Hand-encoded protobuf wire data for the tests of the raw request path (server/wire_utf8.h,
// server/raw_call.h): what a client built from any schema, or no schema, may send, including
// invalid UTF-8 in `string` fields (which protobuf's own serializer is not meant to write)
// and data that is not the wire format at all.
#pragma once

#include <cstdint>
#include <string>

namespace glmserve::testing {

inline std::string WireVarint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

inline std::string WireTag(uint32_t field, uint32_t wire_type) {
  return WireVarint((uint64_t{field} << 3) | wire_type);
}

// A length-delimited field (string, bytes or an embedded message's encoding).
inline std::string WireLen(uint32_t field, const std::string& payload) {
  return WireTag(field, 2) + WireVarint(payload.size()) + payload;
}

inline std::string WireInt(uint32_t field, uint64_t value) {
  return WireTag(field, 0) + WireVarint(value);
}

// Well-formed UTF-8 except for one bare continuation byte and one 0xFF.
inline const std::string kBadUtf8("ok \xff\xfe bad", 9);

}  // namespace glmserve::testing
