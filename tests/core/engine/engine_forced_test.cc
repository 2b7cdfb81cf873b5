// GenerateRequest::forced: tokens the engine emits instead of sampling (tool_choice's start of
// a tool call). Forced tokens come out in order, at output index 0 or right after the first
// generated trigger token, with the model's own logprobs; the tokens after them are what the
// model continues with; other requests in the batch are unaffected; preemption, recompute
// and prefix-cache hits force exactly the same; bad forced tokens are refused up front.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/cpu/cpu_model.h"
#include "core/engine/engine.h"
#include "core/model/checkpoint.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve {
namespace {

std::unique_ptr<Engine> MakeEngine(EngineOptions options = {}) {
  options.check_invariants = true;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
      std::make_unique<CpuModel>(testing::EngineTestWeights(), CpuMath::kExact), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

using testing::Collector;
using testing::Outcome;

// engine_harness.h's request with 4 alternatives and (when sampling) no top-p, as these tests
// were written with.
GenerateRequest MakeGenerate(int key, int prompt_len, int max_new, bool sample) {
  GenerateRequest g = testing::MakeGenerate(key, prompt_len, max_new, sample);
  g.top_logprobs = 4;
  g.sampling.top_p = SamplingParams().top_p;
  return g;
}

Outcome RunAlone(const GenerateRequest& g) {
  return testing::RunAlone([](EngineOptions o) { return MakeEngine(o); }, g);
}

TEST(EngineForcedTest, ForcedTokensComeFirstWithTheModelsLogprobs) {
  const GenerateRequest plain = MakeGenerate(1, 9, 8, /*sample=*/false);
  const Outcome model = RunAlone(plain);
  ASSERT_EQ(model.top[0].size(), 4u);
  // Force the model's third choice at index 0 (not what greedy picks), then two more ids.
  const int32_t third = model.top[0][2].token;
  GenerateRequest forced = plain;
  forced.forced.tokens = {third, 17, 42};
  const Outcome got = RunAlone(forced);
  ASSERT_EQ(got.tokens.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + 3), forced.forced.tokens);
  EXPECT_NE(got.tokens[0], model.tokens[0]);
  // Its logprob is the model's for that token, and the alternatives are the model's.
  EXPECT_EQ(got.logprobs[0], model.top[0][2].logprob);
  ASSERT_EQ(got.top[0].size(), model.top[0].size());
  for (size_t j = 0; j < got.top[0].size(); ++j) {
    EXPECT_EQ(got.top[0][j].token, model.top[0][j].token);
    EXPECT_EQ(got.top[0][j].logprob, model.top[0][j].logprob);
  }
  // After the forced part the model continues exactly as from a prompt that ends with it.
  GenerateRequest continued = plain;
  continued.prompt.insert(continued.prompt.end(), forced.forced.tokens.begin(),
                          forced.forced.tokens.end());
  continued.stop.max_new_tokens = 5;
  const Outcome tail = RunAlone(continued);
  EXPECT_EQ(std::vector<int32_t>(got.tokens.begin() + 3, got.tokens.end()), tail.tokens);
  EXPECT_EQ(std::vector<float>(got.logprobs.begin() + 3, got.logprobs.end()), tail.logprobs);
}

TEST(EngineForcedTest, AfterTokenForcesRightAfterItsFirstGeneratedOccurrence) {
  const GenerateRequest plain = MakeGenerate(2, 7, 10, /*sample=*/true);
  const Outcome model = RunAlone(plain);
  ASSERT_EQ(model.tokens.size(), 10u);
  const int32_t trigger = model.tokens[3];
  const size_t first =
      std::find(model.tokens.begin(), model.tokens.end(), trigger) - model.tokens.begin();  // <= 3
  GenerateRequest forced = plain;
  forced.forced.tokens = {11, 12};
  forced.forced.after_token = trigger;
  const Outcome got = RunAlone(forced);
  ASSERT_EQ(got.tokens.size(), 10u);
  // Identical up to and including the trigger (the same sampled draws), then the forced ids.
  EXPECT_EQ(std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + first + 1),
            std::vector<int32_t>(model.tokens.begin(), model.tokens.begin() + first + 1));
  EXPECT_EQ(got.tokens[first + 1], 11);
  EXPECT_EQ(got.tokens[first + 2], 12);
  // A trigger the model never generates forces nothing at all.
  int32_t absent = 0;
  while (std::find(model.tokens.begin(), model.tokens.end(), absent) != model.tokens.end()) {
    ++absent;
  }
  forced.forced.after_token = absent;
  EXPECT_TRUE(RunAlone(forced).SameTokens(model));
}

TEST(EngineForcedTest, StopsAndLengthApplyToForcedTokens) {
  GenerateRequest g = MakeGenerate(3, 5, 8, false);
  g.forced.tokens = {20, 21, 22, 23};
  g.stop.stop_token_ids = {22};
  Outcome got = RunAlone(g);
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{20, 21, 22}));
  EXPECT_EQ(got.finish.reason, FinishReason::kStop);
  g.stop.stop_token_ids.clear();
  g.stop.max_new_tokens = 2;
  got = RunAlone(g);
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{20, 21}));
  EXPECT_EQ(got.finish.reason, FinishReason::kLength);
}

TEST(EngineForcedTest, BatchPreemptionAndPrefixHitsForceTheSame) {
  // 6 blocks of 16 for 8 requests growing to 4 blocks each: preemptions and recomputes
  // (with the prefix cache on); half force, some only after a trigger.
  EngineOptions options;
  options.kv_capacity_tokens = 96;
  options.block_size = 16;
  options.max_running = 8;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::vector<GenerateRequest> requests;
  for (int k = 0; k < 8; ++k) {
    GenerateRequest g = MakeGenerate(k, 20, 40, /*sample=*/k % 3 == 0);
    if (k % 2 == 0) g.forced.tokens = {30 + k, 31, 32};
    if (k % 4 == 2) {
      GenerateRequest unforced = g;
      unforced.forced = {};
      g.forced.after_token = RunAlone(unforced).tokens[0];
    }
    requests.push_back(g);
    ASSERT_TRUE(engine->Submit({g}, c.For(k)).ok());
  }
  c.Wait(8);
  int64_t preemptions = 0;
  for (int k = 0; k < 8; ++k) {
    EXPECT_TRUE(c[k].finish.status.ok()) << c[k].finish.status;
    EXPECT_TRUE(c[k].SameTokens(RunAlone(requests[k]))) << "request " << k;
    preemptions += c[k].finish.preemptions;
    if (k % 4 == 0) {
      EXPECT_EQ(c[k].tokens[0], 30 + k);
    }
  }
  EXPECT_GT(preemptions, 0);
  // A forced request whose prompt comes from the prefix cache: output identical.
  std::unique_ptr<Engine> cached = MakeEngine();
  Collector d;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cached->Submit({requests[2]}, d.For(i)).ok());
    d.Wait(i + 1);
  }
  EXPECT_EQ(d[1].finish.cached_prompt_tokens, 16);
  EXPECT_TRUE(d[1].SameTokens(c[2]));
  EXPECT_TRUE(d[0].SameTokens(c[2]));
}

TEST(EngineForcedTest, BadForcedTokensAreRefusedUpFront) {
  std::unique_ptr<Engine> engine = MakeEngine();
  const int32_t vocab = static_cast<int32_t>(engine->model().config().vocab_size);
  auto refused = [&](GenerateRequest g, const char* message) {
    absl::StatusOr<RequestId> id = engine->Submit({std::move(g)}, [](Event&&) {});
    ASSERT_FALSE(id.ok()) << message;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(message), std::string::npos) << id.status();
  };
  GenerateRequest g = MakeGenerate(0, 4, 4, false);
  g.forced.tokens = {1, vocab};
  refused(g, "forced token 1");
  g.forced.tokens = {-1};
  refused(g, "forced token 0");
  g.forced.tokens = {100};
  g.sample_vocab_limit = 50;
  refused(g, "sampled ids [0, 50)");
  g.sample_vocab_limit = 0;
  g.forced.tokens.assign(kMaxForcedTokens + 1, 1);
  refused(g, "at most 256");
  g.forced.tokens = {1};
  g.forced.after_token = vocab;
  refused(g, "after_token");
  g.forced.after_token = -2;
  refused(g, "after_token");
  EXPECT_EQ(engine->Stats().steps, 0);
}

}  // namespace
}  // namespace glmserve
