// The one mapping from internal errors (absl::Status) to the OpenAI-compatible endpoint's
// HTTP status and OpenAI's error JSON, so every route reports a condition the same way:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": null,
//              "code": "invalid_argument"}}
#pragma once

#include <string>

#include "absl/status/status.h"

namespace glmserve {

// A status whose HTTP status is not the one its code maps to (413 for a body over the limit)
// carries it as this payload (the decimal status).
inline constexpr char kHttpStatusPayload[] = "glmserve.dev/http_status";
absl::Status WithHttpStatus(absl::Status status, int http_status);

struct HttpError {
  int status = 500;
  std::string body;  // OpenAI's error JSON
};

// INVALID_ARGUMENT / OUT_OF_RANGE 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND
// 404 (unknown model or route), the payload's 413, FAILED_PRECONDITION 422 (well-formed, but
// this server cannot serve it: no tokenizer, a span without the LM head), RESOURCE_EXHAUSTED
// 429, DEADLINE_EXCEEDED 408, UNAVAILABLE 503, anything else 500.
HttpError ToHttpError(const absl::Status& status);

}  // namespace glmserve
