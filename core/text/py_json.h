// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it (what the `tojson` filter
// of Transformers' chat templates produces): ", " and ": " separators, keys in their order,
// non-ASCII text unescaped, floats as Python's repr (shortest round trip, "1.0", "1e-05").
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace glmserve {

// Re-serializes the JSON text `json` (at most `max_depth` deep) in Python's style.
// INVALID_ARGUMENT when it does not parse.
absl::StatusOr<std::string> PythonJsonDumps(std::string_view json, int max_depth = 64);

// Whether the JSON text `json` nests arrays/objects at most `max_depth` deep (checked before
// parsing, since parsing and serializing recurse per level).
bool JsonDepthWithin(std::string_view json, int max_depth);

// Python's repr() of a double: "0.1", "100.0", "1e-05", "1e+16", "inf" -> "Infinity" in JSON.
std::string PythonFloatRepr(double v);

}  // namespace glmserve
