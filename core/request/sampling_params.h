// A generation request's sampling settings and their one bounds rule, which every front end
// (gRPC, KServe, OpenAI) and the engine apply: the sampler (core/engine/sampler.h) defines
// what each setting means.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace glmserve {

struct SamplingParams {
  float temperature = 0.0f;         // 0: greedy (argmax; ties: lowest id)
  int32_t top_k = 0;                // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;               // nucleus: smallest set with cumulative prob >= top_p
  float min_p = 0.0f;               // drop tokens with prob < min_p * max prob
  float repetition_penalty = 1.0f;  // > 1 discourages tokens already in prompt or output
  uint64_t seed = 0;                // the request's random stream
};

// INVALID_ARGUMENT naming the field: temperature < 0 or not finite, top_k < 0, top_p not in
// (0, 1], min_p not in [0, 1), repetition_penalty <= 0 or not finite.
absl::Status ValidateSamplingParams(const SamplingParams& params);

}  // namespace glmserve
