// Request bodies' JSON, parsed in time linear in their size and with every cost bounded:
// nesting deeper than kMaxJsonDepth, more than kMaxJsonValues values, a duplicate key in an
// object (RFC 8259 leaves its meaning open; a proxy and this server could read different
// values) and anything after the top-level value are refused with INVALID_ARGUMENT. One pass
// of nlohmann-json's SAX parser builds the document, so a refusal stops the work where it is.
// (nlohmann's DOM parser with a callback, used before for the depth bound, rescans an array
// after each of its objects: quadratic, 26 s of CPU for 1 MB of `[{},{},...]`.)
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace glmserve {

// Tool schemas are a few levels deep; without a bound a body of '[' would nest millions.
inline constexpr int kMaxJsonDepth = 64;
// Far above any valid request (4,096 messages of a few fields, a prompt of token ids within
// --max_prompt_tokens), far below what a 16 MiB body could hold (5 million `{}`).
inline constexpr size_t kMaxJsonValues = size_t{1} << 20;

// "invalid JSON: ..." (nlohmann's message with the byte offset; invalid UTF-8 inside a
// string is reported there), or the bound that was passed.
absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body);

}  // namespace glmserve
