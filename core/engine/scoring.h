// Quality measurements over any ModelRunner: the log-likelihood a model gives a token
// sequence (perplexity) and its greedy continuation. glm-run --perplexity, the default model's
// quality gates (tests/models/) and bench/ use them; docs/quality.md states the method.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/model_runner.h"

namespace glmserve {

// How a token sequence scored. Windows: the sequence is cut into consecutive windows of at most
// `window` tokens, each run from position 0 with an empty cache (the Transformers reference in
// tools/make_goldens_kjv.py cuts the same way); inside a window every token after the first is
// predicted from the ones before it.
struct TokenScores {
  double nll_sum = 0;     // sum over predicted tokens of -log p(token | window prefix), nats
  int64_t predicted = 0;  // tokens predicted (each window's length minus one)
  // argmax[i]: the model's most likely next token after ids[0..i] within i's window, for every
  // position that predicts one (the last position of each window does not): -1 there.
  std::vector<int32_t> argmax;

  double mean_nll() const { return predicted > 0 ? nll_sum / predicted : 0.0; }
  double perplexity() const { return std::exp(mean_nll()); }
};

// Scores `ids` (every id in [0, vocab)) with `runner`, which must hold the whole model (from
// the embedding to the LM head). Log-softmax in double precision over each fp32 logits row.
absl::StatusOr<TokenScores> ScoreTokens(ModelRunner& runner, absl::Span<const int32_t> ids,
                                        int64_t window);

// The greedy continuation of `prompt`: `new_tokens` argmax tokens (ties to the lowest id), one
// decode step each through the runner's own KV cache; stops early after any of `stop_ids`
// (included in the result).
absl::StatusOr<std::vector<int32_t>> GreedyTokens(ModelRunner& runner,
                                                  absl::Span<const int32_t> prompt,
                                                  int64_t new_tokens,
                                                  absl::Span<const int32_t> stop_ids = {});

// The lowest index of the largest value of row[0..n) (NaN never wins).
int32_t ArgMaxRow(const float* row, int64_t n);

}  // namespace glmserve
