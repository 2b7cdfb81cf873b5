#include "core/engine/scoring.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/model/kv_cache.h"

namespace glmserve {
namespace {

constexpr int64_t kBlockSize = 16;

absl::Status CheckWholeModel(const ModelRunner& runner, absl::Span<const int32_t> ids) {
  const ModelConfig& c = runner.config();
  if (runner.layer_begin() != 0 || runner.layer_end() != c.num_hidden_layers) {
    return absl::FailedPreconditionError(
        "scoring needs the whole model (embedding to LM head) in one runner");
  }
  for (const int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// -log softmax(row)[target], in double precision.
double NegLogProb(const float* row, int64_t n, int32_t target) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
  return std::log(sum) + max - row[target];
}

}  // namespace

int32_t ArgMaxRow(const float* row, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best] || (std::isnan(row[best]) && !std::isnan(row[i]))) {
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

absl::StatusOr<TokenScores> ScoreTokens(ModelRunner& runner, absl::Span<const int32_t> ids,
                                        int64_t window) {
  if (window < 2) return absl::InvalidArgumentError("the scoring window must be >= 2 tokens");
  RETURN_IF_ERROR(CheckWholeModel(runner, ids));
  const int64_t vocab = runner.config().vocab_size;
  const int64_t width = std::min<int64_t>(window, static_cast<int64_t>(ids.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                   runner.CreateCache((width + kBlockSize - 1) / kBlockSize, kBlockSize));
  TokenScores scores;
  scores.argmax.assign(ids.size(), -1);
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  for (int64_t begin = 0; begin < static_cast<int64_t>(ids.size()); begin += window) {
    const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(ids.size()) - begin);
    BlockTable table;
    RETURN_IF_ERROR(cache->Reserve(&table, n));
    ForwardBatch batch;
    batch.sequences = {{n, 0, &table}};
    batch.token_ids = ids.subspan(begin, n);
    ForwardResult result;
    const absl::Status run = runner.Forward(batch, cache.get(), options, &result);
    cache->Free(&table);
    RETURN_IF_ERROR(run);
    // logits: [n, vocab]; row i predicts ids[begin + i + 1].
    for (int64_t i = 0; i + 1 < n; ++i) {
      const float* row = result.logits.data() + i * vocab;
      scores.nll_sum += NegLogProb(row, vocab, ids[begin + i + 1]);
      scores.argmax[begin + i] = ArgMaxRow(row, vocab);
    }
    scores.predicted += n - 1;
  }
  return scores;
}

absl::StatusOr<std::vector<int32_t>> GreedyTokens(ModelRunner& runner,
                                                  absl::Span<const int32_t> prompt,
                                                  int64_t new_tokens,
                                                  absl::Span<const int32_t> stop_ids) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (new_tokens < 0) return absl::InvalidArgumentError("new_tokens must be >= 0");
  RETURN_IF_ERROR(CheckWholeModel(runner, prompt));
  const int64_t vocab = runner.config().vocab_size;
  const int64_t total = static_cast<int64_t>(prompt.size()) + new_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                   runner.CreateCache((total + kBlockSize - 1) / kBlockSize, kBlockSize));
  BlockTable table;
  RETURN_IF_ERROR(cache->Reserve(&table, total));
  std::vector<int32_t> out;
  out.reserve(new_tokens);  // token_ids below points into it
  ForwardBatch batch;
  batch.sequences = {{static_cast<int64_t>(prompt.size()), 0, &table}};
  batch.token_ids = prompt;
  ForwardResult result;
  int64_t position = static_cast<int64_t>(prompt.size());
  while (static_cast<int64_t>(out.size()) < new_tokens) {
    RETURN_IF_ERROR(runner.Forward(batch, cache.get(), ForwardOptions{}, &result));
    out.push_back(ArgMaxRow(result.logits.data() + result.logits.size() - vocab, vocab));
    if (std::find(stop_ids.begin(), stop_ids.end(), out.back()) != stop_ids.end()) break;
    batch.sequences = {{1, position++, &table}};
    batch.token_ids = absl::MakeConstSpan(&out.back(), 1);
  }
  cache->Free(&table);
  return out;
}

}  // namespace glmserve
