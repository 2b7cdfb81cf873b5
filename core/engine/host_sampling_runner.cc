#include "core/engine/host_sampling_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/engine/sampler.h"

namespace glmserve {

absl::Status SampleReturnedRows(const ForwardOptions& options, int64_t vocab,
                                ForwardResult* result) {
  const int64_t entries = static_cast<int64_t>(options.sample.size());
  if (static_cast<int64_t>(result->logits.size()) != entries * vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(result->logits.size() / std::max<int64_t>(1, vocab), " rows for ", entries,
                     " sample requests"));
  }
  bool any_logprobs = false;
  for (const RowSampleRequest& r : options.sample) {
    any_logprobs |= r.sample && (r.params.logprob || r.params.top_logprobs > 0);
  }
  const int64_t k = samplemath::kMaxRowTopLogprobs;
  result->tokens.assign(entries, -1);
  result->row_finite.assign(entries, 0);
  result->token_logprobs.clear();
  result->top_ids.clear();
  result->top_logprobs.clear();
  if (any_logprobs) {
    result->token_logprobs.assign(entries, 0.0f);
    result->top_ids.assign(entries * k, -1);
    result->top_logprobs.assign(entries * k, 0.0f);
  }
  int64_t kept = 0;  // rows moved to the front of result->logits so far
  for (int64_t e = 0; e < entries; ++e) {
    const float* row = result->logits.data() + e * vocab;
    bool finite = true;
    for (int64_t i = 0; i < vocab; ++i) finite &= std::isfinite(row[i]);
    result->row_finite[e] = finite ? 1 : 0;
    const RowSampleRequest& req = options.sample[e];
    if (req.sample && finite) {
      const samplemath::RowSampling& p = req.params;
      const int64_t columns = p.columns > 0 ? std::min<int64_t>(p.columns, vocab) : vocab;
      const absl::Span<const int32_t> penalised =
          absl::MakeConstSpan(options.penalised_ids.data() + p.penalised_begin, p.penalised_count);
      const absl::Span<const float> span = absl::MakeConstSpan(row, columns);
      const LogprobRequest want{p.logprob || p.top_logprobs > 0, p.top_logprobs};
      const SampledToken t =
          p.forced >= 0 ? ForcedToken(span, p.forced, want)
                        : SampleToken(span, SamplingParamsOf(p), penalised, p.token_index, want);
      result->tokens[e] = t.token;
      if (want.chosen) {
        result->token_logprobs[e] = t.logprob;
        for (size_t j = 0; j < t.top.size(); ++j) {
          result->top_ids[e * k + j] = t.top[j].token;
          result->top_logprobs[e * k + j] = t.top[j].logprob;
        }
      }
    }
    if (req.keep_logits) {
      if (kept != e) std::copy(row, row + vocab, result->logits.data() + kept * vocab);
      ++kept;
    }
  }
  result->logits.resize(kept * vocab);
  return absl::OkStatus();
}

absl::Status HostSamplingRunner::Forward(const ForwardBatch& batch, KvCache* cache,
                                         const ForwardOptions& options, ForwardResult* result) {
  if (options.sample.empty()) return inner_->Forward(batch, cache, options, result);
  RETURN_IF_ERROR(ValidateSampleRequests(batch, options, config().vocab_size));
  ForwardOptions rows = options;  // the same step, every returned row whole
  rows.sample.clear();
  rows.penalised_ids.clear();
  RETURN_IF_ERROR(inner_->Forward(batch, cache, rows, result));
  return SampleReturnedRows(options, config().vocab_size, result);
}

}  // namespace glmserve
