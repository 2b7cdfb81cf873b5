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

#include "core/cuda/model.h"
#include "core/engine/engine.h"
#include "core/model/checkpoint.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::Emulated;

using ::glmserve::testing::Collector;
using ::glmserve::testing::Outcome;

class EngineKvFp8Cuda : public ::testing::Test {
 protected:
  void SetUp() override { GLM_REQUIRE_CUDA_DEVICE(); }
};

// The engine tests' model (engine_harness.h's EngineTestWeights) on the CUDA runner.
std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
  absl::StatusOr<std::unique_ptr<CudaModel>> m =
      CudaModel::Create(::glmserve::testing::EngineTestWeights());
  EXPECT_TRUE(m.ok()) << m.status();
  options.check_invariants = true;
  options.kv_cache_dtype = KvCacheDType::kFp8E4M3;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*std::move(m), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->kv_cache_dtype(), DType::kF8E4M3);
  return *std::move(engine);
}

// The shared scenarios (engine_harness.h) on the CUDA runner, held to this device's contract
// (top of the file).
::glmserve::testing::EngineScenario Scenario() {
  ::glmserve::testing::EngineScenario t;
  t.make = [](EngineOptions options) { return MakeEngine(options); };
  t.expect_same = [](const Outcome& got, const Outcome& want, bool greedy,
                     const std::string& what) {
    if (Emulated()) {
      EXPECT_TRUE(got == want) << what << ": not bit-identical";
      return;
    }
    if (!greedy) return;
    EXPECT_EQ(got.tokens, want.tokens) << what;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-2) << what << " token " << i;
    }
  };
  return t;
}

TEST_F(EngineKvFp8Cuda, SmallKvCachePreemptsAndStillMatches) {
  ::glmserve::testing::PreemptionScenario(Scenario());
}

TEST_F(EngineKvFp8Cuda, PrefixHitGivesIdenticalOutputAndSkipsCompute) {
  ::glmserve::testing::PrefixHitScenario(Scenario());
}

}  // namespace
}  // namespace glmserve::cuda
