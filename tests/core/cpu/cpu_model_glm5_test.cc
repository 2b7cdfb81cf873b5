// GLM-5 specifics of the CPU model beyond the runner conformance suite's shared invariants
// (tests/core/engine/runner_conformance_test.cc): the latent cache's size, runs that would start at
// a shared indexer layer, checkpoints with GLM-5's tensor names, and the CUDA backend's refusal.
#include <gtest/gtest.h>

#include "core/cpu/cpu_model.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

ModelWeights Glm5Weights(const char* preset = "tiny-glm5", LayerSpan span = {}) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  RandomWeightOptions options;
  options.seed = 7;
  options.dtype = DType::kBF16;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options, span);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

TEST(Glm5ModelTest, KvCacheHoldsTheLatentRowOnly) {
  CpuModel model(Glm5Weights());
  const ModelConfig& c = model.config();
  // tiny-glm5: 32 latent + 8 rotary key + 16 indexer key, fp32, 4 layers.
  EXPECT_EQ(model.kv_bytes_per_token(), 4 * (32 + 8 + 16) * 4);
  const KvCacheShape shape = model.CacheShape(10, 16);
  EXPECT_TRUE(shape.latent);
  EXPECT_EQ(shape.kv_heads * shape.head_dim, c.cache_values_per_token_layer());
  KvCache cache(shape);
  EXPECT_EQ(cache.bytes_per_token(), model.kv_bytes_per_token());
  EXPECT_EQ(cache.num_elements(), 4 * 10 * 16 * 56);
  // The released shape: 78 layers x (512 + 64 + 128) values, against GLM-4.5's
  // 92 x 2 x 8 x 128 (both counted in bf16, as the GPU would store them).
  const ModelConfig glm5 = *PresetConfig("glm-5");
  const ModelConfig glm45 = *PresetConfig("glm-4.5");
  EXPECT_EQ(glm5.num_hidden_layers * glm5.cache_values_per_token_layer() * 2, 109824);
  EXPECT_EQ(glm45.num_hidden_layers * glm45.cache_values_per_token_layer() * 2, 368 * 1024);
}

TEST(Glm5ModelTest, RunsMustStartAtAFullIndexerLayer) {
  // tiny-glm5 layers: full, shared, full, shared. A span [1, 4) would start at a shared layer.
  CpuModel tail(Glm5Weights("tiny-glm5", {1, -1}));
  KvCache cache(tail.CacheShape(4, 4));
  BlockTable table;
  ASSERT_TRUE(cache.Reserve(&table, 3).ok());
  std::vector<float> hidden(3 * tail.config().hidden_size, 0.5f);
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  batch.hidden_in = hidden;
  ForwardResult result;
  absl::Status s = tail.Forward(batch, &cache, ForwardOptions{}, &result);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'shared'"), absl::string_view::npos) << s;
  // Within the whole model, a sub-run from layer 2 (full) is fine, from 1 (shared) is not.
  CpuModel whole(Glm5Weights());
  KvCache c2(whole.CacheShape(4, 4));
  BlockTable t2;
  ASSERT_TRUE(c2.Reserve(&t2, 3).ok());
  batch.sequences = {{3, 0, &t2}};
  ForwardOptions options;
  options.logits = LogitsRows::kNone;
  options.layer_begin = 1;
  options.layer_end = 3;
  EXPECT_EQ(whole.Forward(batch, &c2, options, &result).code(), absl::StatusCode::kInvalidArgument);
  options.layer_begin = 2;
  options.layer_end = 4;
  options.logits = LogitsRows::kLast;
  EXPECT_TRUE(whole.Forward(batch, &c2, options, &result).ok());
  // Serving such a span is refused at start-up.
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(Glm5Weights("tiny-glm5", {1, -1}), DeviceKind::kCpu);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CreateModelRunner(Glm5Weights("tiny-glm5", {2, -1}), DeviceKind::kCpu).ok());
}

// Saved with GLM-5's tensor names and loaded back, the model computes the same logits.
TEST(Glm5ModelTest, CheckpointRoundTripKeepsTheLogits) {
  ModelWeights weights = Glm5Weights();
  const std::string dir = testing::MakeTempDir("glm5_ckpt");
  ASSERT_TRUE(SaveCheckpoint(weights, dir).ok());
  absl::StatusOr<ModelWeights> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->config.is_mla());
  EXPECT_FALSE(loaded->layers[0].mla.indexer.empty());
  EXPECT_TRUE(loaded->layers[1].mla.indexer.empty()) << "layer 1 is a shared indexer layer";
  CpuModel a(std::move(weights)), b(*std::move(loaded));
  const std::vector<int32_t> ids = {5, 17, 99, 3, 42, 42, 7, 250, 1, 0, 64, 31};
  std::vector<float> out[2];
  for (int i = 0; i < 2; ++i) {
    CpuModel& m = i == 0 ? a : b;
    KvCache cache(m.CacheShape(4, 4));
    BlockTable table;
    ASSERT_TRUE(cache.Reserve(&table, 12).ok());
    ForwardBatch batch;
    batch.sequences = {{12, 0, &table}};
    batch.token_ids = ids;
    ForwardOptions options;
    options.logits = LogitsRows::kAll;
    ForwardResult result;
    ASSERT_TRUE(m.Forward(batch, &cache, options, &result).ok());
    out[i] = result.logits;
  }
  EXPECT_EQ(out[0], out[1]);
}

// The CUDA backend takes GLM-5 (issue 15): with a GPU it builds a runner; without one the
// answer is the missing device, never an architecture refusal, and --device=auto falls back
// to the CPU. (The device results are checked in tests/core/cuda/ and the runner suites.)
TEST(Glm5ModelTest, CudaBackendTakesGlm5) {
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateCudaRunner(Glm5Weights());
  if (CudaDeviceAvailable()) {
    ASSERT_TRUE(runner.ok()) << runner.status();
    return;
  }
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition) << runner.status();
  EXPECT_EQ(runner.status().message().find("glm_moe_dsa"), absl::string_view::npos);
  absl::StatusOr<std::unique_ptr<ModelRunner>> any =
      CreateModelRunner(Glm5Weights(), DeviceKind::kAuto);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->device_name(), "cpu");
}

}  // namespace
}  // namespace glmserve
