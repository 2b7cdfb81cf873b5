#include "core/request/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace glmserve {

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0, got ", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", params.top_k));
  }
  // Written so that NaN fails the test.
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", params.top_p));
  }
  if (!(params.min_p >= 0.0f && params.min_p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1), got ", params.min_p));
  }
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be finite and > 0, got ", params.repetition_penalty));
  }
  return absl::OkStatus();
}

}  // namespace glmserve
