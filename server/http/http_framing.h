// The framing rules of glm-server's HTTP/1.1 server (RFC 9112) beyond what Boost.Beast's
// parser enforces, and the bytes of responses. Beast already refuses: Content-Length together
// with Transfer-Encoding, two different Content-Lengths, lengths that are not plain digits
// (`+5`), control characters (NUL) in a field, malformed chunks, and bounds the header bytes
// and the body. Checked here, on the parsed head: one Host on HTTP/1.1, the number of fields,
// Transfer-Encoding other than exactly `chunked` (or any on HTTP/1.0), the target's form
// (origin, absolute, `*` for OPTIONS only), Expect. Every refusal closes the connection, so
// that bytes a proxy in front could frame differently are never read as a next request.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boost/beast/http/message.hpp"
#include "boost/beast/http/string_body.hpp"

namespace glmserve {

struct CheckedHead {
  std::string path;              // the path to route on (query dropped)
  bool asterisk = false;         // OPTIONS *
  bool expect_continue = false;  // Expect: 100-continue (HTTP/1.1)
};

// INVALID_ARGUMENT (400), or a status carrying 431 / 501 / 505 / 417 (WithHttpStatus), naming
// the rule.
absl::StatusOr<CheckedHead> CheckRequestHead(const boost::beast::http::request_header<>& head,
                                             int max_header_fields);

// The HTTP status and message for an error of Beast's parser (header_limit: 431, body_limit:
// 413, anything else 400).
absl::Status ParserError(const boost::system::error_code& ec, int64_t max_header_bytes,
                         int64_t max_body_bytes);

// A response's status line and fields. `content_length` < 0: a chunked body (HTTP/1.1) or one
// that ends with the connection (HTTP/1.0).
std::string ResponseHead(int status, absl::string_view content_type, int64_t content_length,
                         bool close, bool http10,
                         const std::vector<std::pair<std::string, std::string>>& extra = {});

// One chunk of a chunked body ("" gives the last chunk).
std::string Chunk(absl::string_view data);

}  // namespace glmserve
