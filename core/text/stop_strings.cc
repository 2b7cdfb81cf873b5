#include "core/text/stop_strings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/text/unicode.h"

namespace glmserve {

absl::StatusOr<StopStringMatcher> StopStringMatcher::Create(std::vector<std::string> stops,
                                                            const StopStringLimits& limits) {
  if (stops.size() > limits.max_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(stops.size(), " stop strings, more than the limit ", limits.max_count));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is empty"));
    }
    if (stops[i].size() > limits.max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is ", stops[i].size(),
                                                     " bytes, more than the limit ",
                                                     limits.max_bytes));
    }
    RETURN_IF_ERROR(ValidateUtf8(stops[i], absl::StrCat("stop string ", i)));
  }
  return StopStringMatcher(std::move(stops));
}

StopStringMatcher::Result StopStringMatcher::Push(std::string_view text) {
  Result r;
  if (stopped_) return r;
  held_.append(text);
  // The occurrence that ends first (the one a token-by-token check sees first, as vLLM's),
  // the leftmost-starting (longest) one among those ending at the same byte. Choosing by end,
  // not by start, makes the result independent of how the text was split into pushes: a
  // longer stop string starting earlier may still be incomplete when a shorter one completes.
  size_t best = std::string::npos, best_end = std::string::npos;
  int which = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at == std::string::npos) continue;
    const size_t end = at + stops_[i].size();
    if (end < best_end || (end == best_end && at < best)) {
      best = at;
      best_end = end;
      which = static_cast<int>(i);
    }
  }
  if (which >= 0) {
    r.text = held_.substr(0, best);
    r.stopped = true;
    r.stop_index = which;
    stopped_ = true;
    held_.clear();
    return r;
  }
  // Hold the longest suffix that is a proper prefix of some stop string. Such a suffix starts
  // with a UTF-8 lead byte (stop strings are valid UTF-8), so the release ends on a character
  // boundary.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(held_.size(), s.size() - 1); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopStringMatcher::Finish() {
  std::string out = stopped_ ? std::string() : std::move(held_);
  held_.clear();
  return out;
}

}  // namespace glmserve
