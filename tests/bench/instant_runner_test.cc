// The instant runner (the host-overhead benchmark's model): the rows it returns are the
// requested ones, a pure function of each position's token and index, and the engine over it
// generates what the rows say.
#include "bench/instant_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "core/engine/engine.h"

namespace glmserve {
namespace {

ModelConfig SmallConfig() {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

int32_t ArgMax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

TEST(InstantRunnerTest, ReturnsTheRequestedRowsOfEachPosition) {
  InstantRunner runner(SmallConfig(), 8);
  const int64_t vocab = runner.config().vocab_size;
  std::unique_ptr<KvCache> cache = *runner.CreateCache(16, 4);
  BlockTable a, b, c;
  ASSERT_TRUE(cache->Reserve(&a, 7).ok() && cache->Reserve(&b, 3).ok() &&
              cache->Reserve(&c, 2).ok());
  const std::vector<int32_t> ids = {5, 6, 7, 8, 1, 2, 3};
  ForwardBatch batch;
  batch.sequences = {{4, 3, &a}, {2, 0, &b}, {1, 1, &c}};  // a continues at position 3
  batch.token_ids = ids;
  ForwardOptions options;
  options.sequence_logits = {LogitsRows::kAll, LogitsRows::kNone, LogitsRows::kLast};
  ForwardResult result;
  result.logits.assign(3, 1.0f);  // stale contents are replaced
  ASSERT_TRUE(runner.Forward(batch, cache.get(), options, &result).ok());
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(5 * vocab));
  auto row = [&](int64_t r) {
    return std::vector<float>(result.logits.begin() + r * vocab,
                              result.logits.begin() + (r + 1) * vocab);
  };
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(row(r), runner.RowFor(ids[r], 3 + r)) << r;
  EXPECT_EQ(row(4), runner.RowFor(3, 1));
  // Positions spread over the pool: 64 positions of one token reach most of its 8 rows.
  std::vector<const std::vector<float>*> used;
  for (int64_t p = 0; p < 64; ++p) used.push_back(&runner.RowFor(5, p));
  std::sort(used.begin(), used.end());
  EXPECT_GE(std::unique(used.begin(), used.end()) - used.begin(), 6);
  EXPECT_GT(runner.forward_seconds(), 0.0);

  // The same position alone gets the same row: nothing depends on the rest of the batch.
  ForwardBatch alone;
  alone.sequences = {{1, 1, &c}};
  alone.token_ids = absl::MakeConstSpan(ids).subspan(6, 1);
  ForwardOptions last;
  ASSERT_TRUE(runner.Forward(alone, cache.get(), last, &result).ok());
  EXPECT_EQ(result.logits, runner.RowFor(3, 1));
}

TEST(InstantRunnerTest, RefusesWhatItCannotDo) {
  InstantRunner runner(SmallConfig());
  EXPECT_EQ(runner.CreateCache(0, 16).status().code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<KvCache> cache = *runner.CreateCache(4, 4);
  BlockTable t;
  ASSERT_TRUE(cache->Reserve(&t, 2).ok());
  const std::vector<int32_t> ids = {1, 2};
  ForwardBatch batch;
  batch.sequences = {{2, 0, &t}};
  batch.token_ids = ids;
  ForwardResult result;
  ForwardOptions hidden;
  hidden.return_hidden = true;
  EXPECT_EQ(runner.Forward(batch, cache.get(), hidden, &result).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(runner.config().vocab_size)};
  batch.token_ids = bad;
  EXPECT_EQ(runner.Forward(batch, cache.get(), ForwardOptions{}, &result).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner.Forward(batch, nullptr, ForwardOptions{}, &result).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InstantRunnerTest, EngineGeneratesWhatTheRowsSay) {
  const ModelConfig config = SmallConfig();
  auto owned = std::make_unique<InstantRunner>(config, 16);
  const InstantRunner* runner = owned.get();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(std::move(owned), {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> tokens(3);
  int finished = 0;
  for (int k = 0; k < 3; ++k) {
    GenerateRequest g;
    g.prompt = {static_cast<int32_t>(10 + k), static_cast<int32_t>(20 + k)};
    g.stop.max_new_tokens = 6;
    g.stop.ignore_eos = true;
    ASSERT_TRUE((*engine)
                    ->Submit(g,
                             [&, k](Event&& e) {
                               std::lock_guard<std::mutex> lock(mu);
                               if (auto* t = std::get_if<TokenEvent>(&e.body)) {
                                 tokens[k].push_back(t->token);
                               } else if (std::holds_alternative<FinishEvent>(e.body)) {
                                 ++finished;
                                 cv.notify_all();
                               }
                             })
                    .ok());
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished == 3; }));
  for (int k = 0; k < 3; ++k) {
    // Greedy: each token is the argmax of the row at the previous position.
    std::vector<int32_t> sequence = {static_cast<int32_t>(10 + k), static_cast<int32_t>(20 + k)};
    ASSERT_EQ(tokens[k].size(), 6u) << k;
    for (int32_t t : tokens[k]) {
      const int64_t position = static_cast<int64_t>(sequence.size()) - 1;
      EXPECT_EQ(t, ArgMax(runner->RowFor(sequence.back(), position))) << k;
      sequence.push_back(t);
    }
  }
}

}  // namespace
}  // namespace glmserve
