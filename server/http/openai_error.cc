#include "server/http/openai_error.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace glmserve {

absl::Status WithHttpStatus(absl::Status status, int http_status) {
  status.SetPayload(kHttpStatusPayload, absl::Cord(absl::StrCat(http_status)));
  return status;
}

HttpError ToHttpError(const absl::Status& status) {
  HttpError e;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      e.status = 403;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      break;
    case absl::StatusCode::kFailedPrecondition:
      e.status = 422;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 408;
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      break;
    default:
      e.status = 500;
      break;
  }
  if (auto p = status.GetPayload(kHttpStatusPayload)) {
    int code;
    if (absl::SimpleAtoi(std::string(*p), &code) && code >= 400 && code < 600) e.status = code;
  }
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status < 500  ? "invalid_request_error"
                                       : "server_error";
  nlohmann::json body = {
      {"error",
       {{"message", std::string(status.message())},
        {"type", type},
        {"param", nullptr},
        {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}}}};
  // Messages may quote client bytes that are not UTF-8 (an unknown field's name): replace
  // them rather than throw.
  e.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return e;
}

}  // namespace glmserve
