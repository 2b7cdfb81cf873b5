// core/engine/scoring.h: the perplexity and greedy helpers against a direct computation on the
// tiny preset (one forward over the whole window, log-softmax by hand; argmax per decode step
// from a full recompute), window cutting, and the refusals.
#include "core/engine/scoring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"

namespace glmserve {
namespace {

std::unique_ptr<ModelRunner> TinyRunner() {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny");
  EXPECT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(*std::move(w), DeviceKind::kCpu);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

// Logits [n, vocab] of one no-cache-reuse forward over `ids`.
std::vector<float> AllLogits(ModelRunner& runner, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  auto cache = runner.CreateCache((n + 15) / 16, 16);
  EXPECT_TRUE(cache.ok());
  BlockTable table;
  EXPECT_TRUE((*cache)->Reserve(&table, n).ok());
  ForwardBatch batch;
  batch.sequences = {{n, 0, &table}};
  batch.token_ids = ids;
  ForwardOptions options;
  options.logits = LogitsRows::kAll;
  ForwardResult result;
  EXPECT_TRUE(runner.Forward(batch, cache->get(), options, &result).ok());
  return result.logits;
}

std::vector<int32_t> Ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % 250);
  return ids;
}

TEST(ScoreTokens, IsTheLogSoftmaxOfEachWindowsForward) {
  auto runner = TinyRunner();
  const int64_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> ids = Ids(10);
  // Windows of 4: [0,4) [4,8) [8,10), each from position 0.
  double expected = 0;
  int64_t predicted = 0;
  std::vector<int32_t> argmax(ids.size(), -1);
  for (int64_t b = 0; b < 10; b += 4) {
    const std::vector<int32_t> w(ids.begin() + b, ids.begin() + std::min<int64_t>(10, b + 4));
    const std::vector<float> logits = AllLogits(*runner, w);
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      const float* row = logits.data() + i * vocab;
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]));
      expected += std::log(sum) - row[w[i + 1]];
      argmax[b + i] = ArgMaxRow(row, vocab);
    }
    predicted += static_cast<int64_t>(w.size()) - 1;
  }
  absl::StatusOr<TokenScores> s = ScoreTokens(*runner, ids, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->predicted, predicted);
  EXPECT_EQ(s->predicted, 7);
  EXPECT_NEAR(s->nll_sum, expected, 1e-9 * std::fabs(expected));
  EXPECT_EQ(s->argmax, argmax);
  EXPECT_NEAR(s->perplexity(), std::exp(expected / 7), 1e-9 * s->perplexity());
  // One window: a different (longer-context) score.
  absl::StatusOr<TokenScores> whole = ScoreTokens(*runner, ids, 64);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->predicted, 9);
  EXPECT_NE(whole->nll_sum, s->nll_sum);
}

TEST(GreedyTokens, EachTokenIsTheArgmaxOfAFullRecompute) {
  auto runner = TinyRunner();
  const int64_t vocab = runner->config().vocab_size;
  std::vector<int32_t> seq = Ids(5);
  absl::StatusOr<std::vector<int32_t>> greedy = GreedyTokens(*runner, seq, 6);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  ASSERT_EQ(greedy->size(), 6u);
  for (const int32_t token : *greedy) {
    const std::vector<float> logits = AllLogits(*runner, seq);
    EXPECT_EQ(token, ArgMaxRow(logits.data() + logits.size() - vocab, vocab));
    seq.push_back(token);
  }
  // A stop id ends it, included.
  absl::StatusOr<std::vector<int32_t>> stopped = GreedyTokens(*runner, Ids(5), 6, {(*greedy)[2]});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(*stopped, std::vector<int32_t>(greedy->begin(), greedy->begin() + 3));
}

TEST(Scoring, RefusesWhatItCannotScore) {
  auto runner = TinyRunner();
  EXPECT_EQ(ScoreTokens(*runner, Ids(8), 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScoreTokens(*runner, {1, 2, 256}, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScoreTokens(*runner, {1, -1}, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GreedyTokens(*runner, {}, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GreedyTokens(*runner, {1}, -1).status().code(), absl::StatusCode::kInvalidArgument);
  const float nan_first[] = {NAN, 1.0f, 3.0f, 3.0f};
  EXPECT_EQ(ArgMaxRow(nan_first, 4), 2);  // NaN never wins; ties to the lowest id
}

}  // namespace
}  // namespace glmserve
