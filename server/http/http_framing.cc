#include "server/http/http_framing.h"

#include <iterator>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/status.hpp"
#include "core/base/status_macros.h"
#include "server/http/openai_error.h"

namespace glmserve {
namespace {

namespace http = boost::beast::http;

absl::Status Refuse(int status, std::string message) {
  return WithHttpStatus(absl::InvalidArgumentError(std::move(message)), status);
}

absl::string_view View(boost::beast::string_view s) { return {s.data(), s.size()}; }

// Transfer-Encoding: only exactly `chunked` is a framing this server reads; RFC 9112 6.3:
// chunked not last is 400, another coding (gzip, ...) 501; HTTP/1.0 with it is faulty
// framing (6.1).
absl::Status CheckTransferEncoding(const http::request_header<>& head) {
  if (head.count(http::field::transfer_encoding) == 0) return absl::OkStatus();
  if (head.version() < 11) {
    return Refuse(400, "Transfer-Encoding in an HTTP/1.0 request");
  }
  std::vector<std::string> codings;
  for (const auto& field : head) {
    if (field.name() != http::field::transfer_encoding) continue;
    for (absl::string_view c : absl::StrSplit(View(field.value()), ',')) {
      c = absl::StripAsciiWhitespace(c);
      if (!c.empty()) codings.push_back(absl::AsciiStrToLower(c));
    }
  }
  if (codings.empty() || codings.back() != "chunked") {
    return Refuse(400, "Transfer-Encoding must end with chunked");
  }
  if (codings.size() > 1) {
    return Refuse(501, absl::StrCat("Transfer-Encoding '", codings.front().substr(0, 32),
                                    "' is not supported (only chunked)"));
  }
  return absl::OkStatus();
}

// The request target's path: origin-form ("/p?q"), absolute-form ("http://host/p?q": RFC 9112
// 3.2.2, the Host field is then ignored) or asterisk-form ("*", OPTIONS only).
absl::Status CheckTarget(absl::string_view target, http::verb method, CheckedHead* out) {
  if (target == "*") {
    if (method != http::verb::options) return Refuse(400, "the target '*' is for OPTIONS only");
    out->asterisk = true;
    out->path = "*";
    return absl::OkStatus();
  }
  absl::string_view rest = target;
  if (!absl::StartsWith(rest, "/")) {
    absl::string_view lower_scheme;
    for (absl::string_view scheme : {"http://", "https://"}) {
      if (rest.size() >= scheme.size() &&
          absl::EqualsIgnoreCase(rest.substr(0, scheme.size()), scheme)) {
        lower_scheme = scheme;
      }
    }
    if (lower_scheme.empty()) {
      return Refuse(400, "the request target must be a path or an absolute http URI");
    }
    rest.remove_prefix(lower_scheme.size());
    const size_t end = rest.find_first_of("/?");
    if (end == 0) return Refuse(400, "the absolute request target has no host");
    rest = end == absl::string_view::npos ? absl::string_view() : rest.substr(end);
  }
  const size_t query = rest.find('?');
  out->path = std::string(rest.substr(0, query));
  if (out->path.empty()) out->path = "/";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckedHead> CheckRequestHead(const http::request_header<>& head,
                                             int max_header_fields) {
  if (head.version() != 10 && head.version() != 11) {
    return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }
  const auto fields = std::distance(head.begin(), head.end());
  if (fields > max_header_fields) {
    return Refuse(431, absl::StrCat("the request has ", fields, " header fields; at most ",
                                    max_header_fields, " are accepted"));
  }
  const size_t hosts = head.count(http::field::host);
  if (hosts > 1) return Refuse(400, "more than one Host field");
  if (head.version() == 11 && hosts == 0) return Refuse(400, "HTTP/1.1 request without Host");
  if (head.count(http::field::content_length) > 1) {
    // Beast accepts repeated identical lengths (RFC 9112 allows it); a proxy may not.
    return Refuse(400, "more than one Content-Length field");
  }
  if (const auto length = head.find(http::field::content_length); length != head.end()) {
    const absl::string_view v = View(length->value());
    if (v.empty() || v.find_first_not_of("0123456789") != absl::string_view::npos) {
      return Refuse(400, "Content-Length must be one decimal number");  // not "2, 2"
    }
  }
  RETURN_IF_ERROR(CheckTransferEncoding(head));
  CheckedHead out;
  RETURN_IF_ERROR(CheckTarget(View(head.target()), head.method(), &out));
  if (head.count(http::field::expect) > 0) {
    const auto expect = head.find(http::field::expect);
    if (head.count(http::field::expect) > 1 ||
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(View(expect->value())),
                                "100-continue")) {
      return Refuse(417, "Expect supports 100-continue only");
    }
    out.expect_continue = head.version() == 11;
  }
  return out;
}

absl::Status ParserError(const boost::system::error_code& ec, int64_t max_header_bytes,
                         int64_t max_body_bytes) {
  if (ec == http::error::header_limit) {
    return Refuse(431, absl::StrCat("the request's header is over the server's limit of ",
                                    max_header_bytes, " bytes"));
  }
  if (ec == http::error::body_limit) {
    return WithHttpStatus(
        absl::ResourceExhaustedError(absl::StrCat("the request body is over the server's limit of ",
                                                  max_body_bytes, " bytes")),
        413);
  }
  if (ec == http::error::bad_version) {
    return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }
  return Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
}

std::string ResponseHead(int status, absl::string_view content_type, int64_t content_length,
                         bool close, bool http10,
                         const std::vector<std::pair<std::string, std::string>>& extra) {
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  std::string out = absl::StrCat(http10 ? "HTTP/1.0 " : "HTTP/1.1 ", status, " ",
                                 absl::string_view(reason.data(), reason.size()), "\r\n");
  absl::StrAppend(&out, "Server: glm-server\r\n");
  if (!content_type.empty()) absl::StrAppend(&out, "Content-Type: ", content_type, "\r\n");
  if (content_length >= 0) {
    absl::StrAppend(&out, "Content-Length: ", content_length, "\r\n");
  } else if (!http10) {
    absl::StrAppend(&out, "Transfer-Encoding: chunked\r\n");
  }
  if (status == 401) absl::StrAppend(&out, "WWW-Authenticate: Bearer\r\n");
  for (const auto& [name, value] : extra) absl::StrAppend(&out, name, ": ", value, "\r\n");
  if (close) {
    absl::StrAppend(&out, "Connection: close\r\n");
  } else if (http10) {
    absl::StrAppend(&out, "Connection: keep-alive\r\n");
  }
  absl::StrAppend(&out, "\r\n");
  return out;
}

std::string Chunk(absl::string_view data) {
  if (data.empty()) return "0\r\n\r\n";
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

}  // namespace glmserve
