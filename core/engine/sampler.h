// Token sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, with a
// per-request seed whose random stream depends only on (seed, token index), so a request's
// tokens never depend on what else shares its batch or on preemption and recompute.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/sample_math.h"
#include "core/request/sampling_params.h"

namespace glmserve {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  // log-softmax of the model's raw logits at the chosen token (before penalty, temperature
  // and truncation: the model's own belief, comparable across sampling settings); 0 when
  // not requested.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // the requested most likely tokens, best first
};

// What a request asked to see besides the token. Each costs a pass over the whole row
// (a log-sum-exp, a top-n selection), so SampleToken computes them only when asked.
struct LogprobRequest {
  bool chosen = false;  // the chosen token's logprob
  int32_t top = 0;      // this many most likely tokens with their logprobs (> 0 implies chosen)
};

// Chooses the token at output index `token_index` of a request. `history` is the prompt plus
// the tokens generated so far (for the repetition penalty). Deterministic: the same inputs
// give the same token on every machine, and the token does not depend on `want`.
// Thread-safe: scratch space is per thread.
SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         absl::Span<const int32_t> history, uint64_t token_index,
                         LogprobRequest want);

// A token chosen by the caller instead of sampled (GenerateRequest::forced), with the logprobs
// `want` asks for, computed exactly as SampleToken computes them for a sampled token.
SampledToken ForcedToken(absl::Span<const float> logits, int32_t token, LogprobRequest want);

// The same, always with the chosen token's logprob and `top_logprobs` alternatives.
inline SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                                absl::Span<const int32_t> history, uint64_t token_index,
                                int32_t top_logprobs) {
  return SampleToken(logits, params, history, token_index, LogprobRequest{true, top_logprobs});
}

// ---- A device sampler's request (core/model/sample_math.h) -------------------------------
// The fields of `params` a RowSampling carries, for output index `token_index` (the penalised
// id range, columns, forced token and logprob request are the caller's to fill).
samplemath::RowSampling RowSamplingFor(const SamplingParams& params, uint64_t token_index);
// The SamplingParams a RowSampling describes.
SamplingParams SamplingParamsOf(const samplemath::RowSampling& row);

// ---- Sampling from a row summary --------------------------------------------------------
// A device that holds the logits can send back, instead of the whole row, its few largest
// raw logits and the raw logits at the penalised ids; for greedy and top-k requests without
// logprobs that is all SampleToken looks at, and SampleFromSummary then gives exactly
// SampleToken's token. (core/cuda/kernels.h LaunchRowTopK computes the summary's top list
// with the same ordering and NaN rules.)

// The ids the repetition penalty applies to: the distinct in-range ids of `history`,
// ascending; none when the penalty is 1.
std::vector<int32_t> PenalisedIds(const SamplingParams& params, absl::Span<const int32_t> history,
                                  int64_t vocab);

// How many of the row's largest raw logits SampleFromSummary needs for this request: for
// greedy, penalised + 1; for top-k with a finite temperature, top_k + penalised; capped at
// vocab. 0 when the request needs the whole row (temperature sampling without top-k, any
// logprobs) or more than `max_candidates`.
int64_t SummaryCandidates(const SamplingParams& params, LogprobRequest want, int64_t penalised,
                          int64_t vocab, int64_t max_candidates);

struct RowSummary {
  int64_t vocab = 0;
  // The row's largest raw logits by (value descending, id ascending), NaN read as -inf:
  // their ids ascending, and their values.
  absl::Span<const int32_t> top_ids;
  absl::Span<const float> top_values;
  absl::Span<const int32_t> penalised_ids;  // PenalisedIds(...)
  absl::Span<const float> penalised_raw;    // the raw logits at those ids
};

// SampleToken's token (logprobs are not available from a summary). INVALID_ARGUMENT when the
// summary is malformed (sizes, order, ids out of range) or holds fewer candidates than
// SummaryCandidates asks for this request.
absl::StatusOr<int32_t> SampleFromSummary(const RowSummary& row, const SamplingParams& params,
                                          uint64_t token_index);

}  // namespace glmserve
