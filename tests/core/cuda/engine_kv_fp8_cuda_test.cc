// The engine's preemption and prefix-hit invariants on the CUDA runner with the FP8 KV cache
// (--kv_cache_dtype=fp8_e4m3; docs/kv_cache.md): engine_test.cc's SmallKvCachePreemptsAndStill
// Matches and PrefixHitGivesIdenticalOutputAndSkipsCompute, the same requests and the same
// bit-identity assertions as its CPU `fp8_kv` mode. A preempted request is recomputed (its
// prompt and generated tokens as a prefill) and a prefix hit reads blocks another request
// wrote; the outputs must equal the request run alone, bit for bit.
//
// That holds when the runner's arithmetic for a token does not depend on the step's shape:
// under the emulation (tools/cuda_emu), whose cuBLAS is one exact loop, it does not, so these
// tests check the engine's and the runner's bookkeeping (block tables, recompute, FP8 codes
// rewritten identically, prefix blocks). On a real GPU cuBLAS picks algorithms by shape
// (docs/cuda.md: not bit-identical across batch compositions), so there the same requests are
// held to the GPU's own contract instead: equal tokens for the greedy requests, logprobs within
// 1e-2 (sampled requests may legitimately diverge after a near-tie and are not compared).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "core/checkpoint.h"
#include "core/cuda/model.h"
#include "core/engine.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/engine_harness.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::Collector;
using ::glmserve::testing::MakeGenerate;
using ::glmserve::testing::Outcome;

bool Emulated() {
#ifdef GLMSERVE_CUDA_EMU
  return true;
#else
  return false;
#endif
}

class EngineKvFp8Cuda : public ::testing::Test {
 protected:
  void SetUp() override { GLM_REQUIRE_CUDA_DEVICE(); }
};

// engine_test.cc's TinyModel (seed 7, stddev 0.1, bf16 weights) on the CUDA runner.
std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok());
  config->max_position_embeddings = 512;
  RandomWeightOptions w_options;
  w_options.seed = 7;
  w_options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, w_options);
  EXPECT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(*std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  options.check_invariants = true;
  options.kv_cache_dtype = KvCacheDType::kFp8E4M3;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*std::move(m), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->kv_cache_dtype(), DType::kF8E4M3);
  return *std::move(engine);
}

Outcome RunAlone(const GenerateRequest& g) {
  EngineOptions options;
  options.prefix_caching = false;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  EXPECT_TRUE(engine->Submit({g}, c.For(0)).ok());
  c.Wait(1);
  return c.outcomes()[0];
}

// The contract this device is held to (top of the file).
void ExpectSameOutput(const Outcome& got, const Outcome& alone, bool greedy, const char* what) {
  if (Emulated()) {
    EXPECT_TRUE(got == alone) << what << ": not bit-identical to the request run alone";
    return;
  }
  if (!greedy) return;
  EXPECT_EQ(got.tokens, alone.tokens) << what;
  ASSERT_EQ(got.logprobs.size(), alone.logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], alone.logprobs[i], 1e-2) << what << " token " << i;
  }
}

void ExpectAllBlocksFree(Engine& engine) {
  for (int i = 0; i < 200 && !engine.Idle(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << "blocks leaked";
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.invariant_error, "");
}

TEST_F(EngineKvFp8Cuda, SmallKvCachePreemptsAndStillMatches) {
  EngineOptions options;
  // 6 blocks of 16. Each request starts in one block and ends needing 3: admission (one
  // spare block per running sequence) lets 3 in, and their growth forces preemptions.
  options.kv_capacity_tokens = 96;
  options.block_size = 16;
  options.max_running = 8;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::vector<GenerateRequest> requests;
  for (int k = 0; k < 8; ++k) {
    requests.push_back(MakeGenerate(k, 4, 40, /*sample=*/k % 2 == 0));
    ASSERT_TRUE(engine->Submit({requests.back()}, c.For(k)).ok());
  }
  c.Wait(8);
  int64_t preempted = 0;
  for (int k = 0; k < 8; ++k) {
    const Outcome& got = c.outcomes()[k];
    EXPECT_TRUE(got.finish.status.ok()) << got.finish.status;
    EXPECT_EQ(got.tokens.size(), 40u);
    const std::string what = "request " + std::to_string(k);
    ExpectSameOutput(got, RunAlone(requests[k]), k % 2 == 1, what.c_str());
    preempted += got.finish.preemptions;
  }
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().preemptions, preempted);
  ExpectAllBlocksFree(*engine);
}

TEST_F(EngineKvFp8Cuda, PrefixHitGivesIdenticalOutputAndSkipsCompute) {
  EngineOptions options;
  options.block_size = 8;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  GenerateRequest a = MakeGenerate(1, 35, 4, false);
  GenerateRequest b = a;
  b.prompt.resize(30);  // shares the first 3 full blocks (24 tokens) with a
  b.prompt.push_back(9);
  b.sampling.temperature = 0.7f;
  b.sampling.seed = 5;
  Collector c;
  ASSERT_TRUE(engine->Submit({a}, c.For(0)).ok());
  c.Wait(1);
  const int64_t computed_before = engine->Stats().prompt_tokens_computed;
  ASSERT_TRUE(engine->Submit({b}, c.For(1)).ok());
  c.Wait(2);
  const EngineStats s = engine->Stats();
  EXPECT_EQ(c.outcomes()[1].finish.cached_prompt_tokens, 24);
  EXPECT_EQ(s.prompt_tokens_computed - computed_before, 31 - 24);  // only the tail computed
  EXPECT_GE(s.prefix_hits, 3);
  ExpectSameOutput(c.outcomes()[1], RunAlone(b), /*greedy=*/false, "a prefix hit");
  // The same prompt again: everything but the last block is a hit. Greedy: held to equal
  // tokens on a GPU too.
  ASSERT_TRUE(engine->Submit({a}, c.For(2)).ok());
  c.Wait(3);
  EXPECT_EQ(c.outcomes()[2].finish.cached_prompt_tokens, 32);
  ExpectSameOutput(c.outcomes()[2], c.outcomes()[0], /*greedy=*/true, "the same prompt again");
  ExpectSameOutput(c.outcomes()[0], RunAlone(a), /*greedy=*/true, "a alone");
  ExpectAllBlocksFree(*engine);
}

}  // namespace
}  // namespace glmserve::cuda
