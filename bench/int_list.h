// A comma-separated list of counts from a benchmark flag ("1,4,16,64"), each in [least, most];
// INVALID_ARGUMENT naming the flag and the bad item otherwise.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace glmserve::bench {

inline absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view flag, absl::string_view text,
                                                     int least,
                                                     int most = std::numeric_limits<int>::max()) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < least || v > most) {
      const std::string range = most == std::numeric_limits<int>::max()
                                    ? absl::StrCat(">= ", least)
                                    : absl::StrCat("in [", least, ", ", most, "]");
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not a count ", range));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace glmserve::bench
