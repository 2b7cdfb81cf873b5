// Refusing broken checkpoints at load: NaN or Inf in a weight makes every output it touches
// NaN, which the sampler would otherwise turn into invented tokens. The check names the
// tensor and the element, so the operator knows which shard to re-download.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/weights.h"

namespace glmserve {

enum class VerifyWeights {
  kAuto,     // kFull up to kFullVerifyLimitBytes of weights, kSampled above
  kFull,     // every element (reads every byte of the checkpoint once)
  kSampled,  // every 1-D parameter, and kVerifySamples evenly spaced runs of each matrix
  kOff,
};

inline constexpr int64_t kFullVerifyLimitBytes = int64_t{8} << 30;
inline constexpr int64_t kVerifySamples = 16;        // runs per matrix in sampled mode
inline constexpr int64_t kVerifyRunElements = 1024;  // elements per run (a few pages)

// "auto", "full", "sampled", "off"; INVALID_ARGUMENT otherwise.
absl::StatusOr<VerifyWeights> ParseVerifyWeights(absl::string_view text);

// INVALID_ARGUMENT naming the first tensor (by its Hugging Face name) and element that is
// NaN or Inf; `source` (the checkpoint directory) prefixes the message. `w` is not changed
// (the slot walk needs a mutable pointer).
absl::Status VerifyWeightsFinite(ModelWeights* w, VerifyWeights mode, absl::string_view source);

}  // namespace glmserve
