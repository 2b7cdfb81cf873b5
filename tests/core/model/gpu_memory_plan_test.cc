// The GPU memory planner (core/model/gpu_memory_plan.h): the split of a device's memory, its
// refusals with the numbers, and the released FP8 models on one H200 (docs/fp8.md).
#include "core/model/gpu_memory_plan.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "core/model/checkpoint.h"

namespace glmserve {
namespace {

GpuMemoryRequest Request(const ModelConfig& c, bool fp8) {
  GpuMemoryRequest r;
  r.weight_bytes = ModelWeightBytes(c, fp8);
  r.activation_bytes = ActivationArenaBytes(c, 2048, 64);
  r.kv_bytes_per_token = KvBytesPerToken(c, c.num_hidden_layers);
  r.min_kv_tokens = 4096;
  return r;
}

TEST(GpuMemoryPlanTest, WeightBytesMatchTheLoadedPresets) {
  for (const char* name : {"tiny", "tiny-fp8", "tiny-glm5", "tiny-glm5-fp8"}) {
    absl::StatusOr<ModelWeights> w = LoadModel(name);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(ModelWeightBytes(w->config, PresetIsFp8(name)), w->ParameterBytes()) << name;
  }
}

TEST(GpuMemoryPlanTest, SplitsTheBudget) {
  GpuMemoryRequest r;
  r.gpu_memory_fraction = 0.5;
  r.weight_bytes = 1000;
  r.activation_bytes = 200;
  r.reserve_bytes = 100;
  r.kv_bytes_per_token = 10;
  r.block_size = 4;
  absl::StatusOr<GpuMemoryPlan> p = PlanGpuMemory({10000, 10000}, r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->budget_bytes, 5000);
  // (5000 - 1300) / 10 = 370 tokens = 92 whole blocks of 4.
  EXPECT_EQ(p->kv_blocks, 92);
  EXPECT_EQ(p->kv_tokens, 368);
  EXPECT_EQ(p->kv_bytes, 3680);
  // Less free memory than the fraction allows: the free memory is the budget.
  p = PlanGpuMemory({3000, 10000}, r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->budget_bytes, 3000);
  EXPECT_EQ(p->kv_tokens, 170 / 4 * 4);
}

TEST(GpuMemoryPlanTest, RefusesWithTheNumbers) {
  GpuMemoryRequest r;
  r.weight_bytes = 9'000'000'000;
  r.kv_bytes_per_token = 1000;
  r.reserve_bytes = 0;
  absl::StatusOr<GpuMemoryPlan> p = PlanGpuMemory({8'000'000'000, 10'000'000'000}, r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("weights 9.00 GB"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("budget is 8.00 GB"), std::string::npos) << p.status();
  // Weights fit but not one sequence's KV cache.
  r.weight_bytes = 7'000'000'000;
  r.min_kv_tokens = 2'000'000;
  p = PlanGpuMemory({8'000'000'000, 10'000'000'000}, r);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("KV cache for 2000000 tokens"), std::string::npos);
  for (double bad : {0.0, -0.5, 1.5}) {
    r.gpu_memory_fraction = bad;
    EXPECT_EQ(PlanGpuMemory({1, 1}, r).status().code(), absl::StatusCode::kInvalidArgument);
  }
  r.gpu_memory_fraction = 0.9;
  EXPECT_EQ(PlanGpuMemory({2, 1}, r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuMemoryPlanTest, Glm45AirFp8FitsOneH200AndGlm45Fp8DoesNot) {
  absl::StatusOr<ModelConfig> air = PresetConfig("glm-4.5-air-fp8");
  ASSERT_TRUE(air.ok());
  const GpuMemoryRequest r = Request(*air, true);
  absl::StatusOr<GpuMemoryPlan> p = PlanGpuMemory({kH200Bytes, kH200Bytes}, r);
  ASSERT_TRUE(p.ok()) << p.status();
  std::printf("glm-4.5-air-fp8 on one H200 at 0.9: %s\n", p->Describe().c_str());
  // ~110 GB of FP8 weights (the bf16 embedding and head included); the rest is KV cache.
  EXPECT_GT(p->weight_bytes, 100e9);
  EXPECT_LT(p->weight_bytes, 120e9);
  EXPECT_GT(p->kv_tokens, 100'000);

  absl::StatusOr<ModelConfig> big = PresetConfig("glm-4.5-fp8");
  ASSERT_TRUE(big.ok());
  p = PlanGpuMemory({kH200Bytes, kH200Bytes}, Request(*big, true));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  std::printf("glm-4.5-fp8 on one H200: %s\n", std::string(p.status().message()).c_str());
  EXPECT_NE(p.status().message().find("does not fit"), std::string::npos);
  // The bf16 Air does not fit either (213.7 GB).
  EXPECT_FALSE(PlanGpuMemory({kH200Bytes, kH200Bytes}, Request(*air, false)).ok());
}

}  // namespace
}  // namespace glmserve
