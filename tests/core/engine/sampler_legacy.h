// The pre-fast-path sampler (see sampler_legacy.cc): same semantics and arithmetic as
// glmserve::SampleToken had at commit 9d47240, always computing the chosen token's logprob.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "core/engine/sampler.h"

namespace glmserve::legacy {

SampledToken LegacySampleToken(absl::Span<const float> logits, const SamplingParams& params,
                               absl::Span<const int32_t> history, uint64_t token_index,
                               int32_t top_logprobs);

}  // namespace glmserve::legacy
