// Stop strings, matched on the generated text across token boundaries: text is released only
// once it cannot be the start of a stop string, and generation stops at the occurrence that
// ends first (ties: the one starting first), whatever the split of the text into pushes; the stop
// string itself and what follows are not returned (OpenAI's `stop` semantics). Count and length are
// bounded at creation.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace glmserve {

struct StopStringLimits {
  size_t max_count = 16;
  size_t max_bytes = 256;  // each
};

class StopStringMatcher {
 public:
  // INVALID_ARGUMENT for an empty or non-UTF-8 stop string or beyond `limits`, naming it.
  static absl::StatusOr<StopStringMatcher> Create(std::vector<std::string> stops,
                                                  const StopStringLimits& limits = {});

  struct Result {
    std::string text;      // released text (never part of a stop string)
    bool stopped = false;  // a stop string was found: the generation ends here
    int stop_index = -1;   // which one
  };
  // Feeds generated text (whole UTF-8 characters, as StreamDetokenizer emits them). After a
  // stop, further calls return nothing.
  Result Push(std::string_view text);
  // The end of the generation without a stop: the held text.
  std::string Finish();
  bool empty() const { return stops_.empty(); }

 private:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace glmserve
