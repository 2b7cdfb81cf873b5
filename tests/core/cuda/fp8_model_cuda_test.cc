// The CUDA runner's FP8 weights (core/cuda/device_weights.h, docs/fp8.md): what reaches the
// device (codes at one byte per weight, scales, which projections stay bf16), the refusals
// (a group mixing FP8 and unquantized matrices, an FP8 lm_head), and the block-scaled form's
// partial blocks through the whole model. Forward results against the CPU are in
// model_cuda_test.cc (the fp8 case), runner_conformance_test.cc (cuda_fp8) and golden_test.cc
// (the fp8_* fixtures).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/cuda/model.h"
#include "core/model.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

ModelWeights Random(const std::string& preset, DType dtype) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  RandomWeightOptions options;
  options.seed = 42;
  options.dtype = dtype;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

TEST(Fp8ModelCudaTest, WeightsStayFp8OnTheDevice) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights w = Random("tiny", DType::kF8E4M3);
  const ModelConfig c = w.config;
  const int64_t expected_bytes = [&] {
    const FfnWeights* e0 = nullptr;
    for (const LayerWeights& l : w.layers) {
      if (l.is_moe) e0 = &l.moe.experts[0];
    }
    return e0->gate.bytes() + e0->up.bytes() + e0->down.bytes();
  }();
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Create(std::move(w));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 =
      CudaModel::Create(Random("tiny", DType::kBF16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const DeviceWeights& d = (*fp8)->device_weights();
  for (const DeviceLayer& l : d.layers) {
    EXPECT_NE(l.q8.codes, nullptr);
    EXPECT_EQ(l.qkv, nullptr) << "q/k/v must not also be uploaded in bf16";
    EXPECT_NE(l.o8.codes, nullptr);
    EXPECT_EQ(l.q8.rows, c.q_dim());
    EXPECT_EQ(l.k8.rows, c.kv_dim());
    EXPECT_EQ(l.q8.block_rows, 1);  // the random FP8 model is per output channel
    EXPECT_EQ(l.q8.block_cols, c.hidden_size);
    if (l.is_moe) {
      EXPECT_NE(l.experts_gate8.codes, nullptr);
      EXPECT_EQ(l.experts_gate_up, nullptr);
      EXPECT_NE(l.router, nullptr) << "the router stays fp32";
      EXPECT_EQ(l.shared.present(), l.shared.fp8());
    } else {
      EXPECT_TRUE(l.dense.fp8());
    }
  }
  EXPECT_NE(d.lm_head, nullptr) << "the head stays bf16";
  EXPECT_EQ(d.routed_expert_bytes, expected_bytes) << "codes + fp32 scales of one expert";
  // Linear weights at 1 byte instead of 2: the image shrinks by well over a quarter.
  EXPECT_LT((*fp8)->weight_bytes(), (*bf16)->weight_bytes() * 3 / 4);
  EXPECT_LT(d.dense_step_bytes, (*bf16)->device_weights().dense_step_bytes);
}

TEST(Fp8ModelCudaTest, MixedGroupsAndAnFp8HeadAreRefused) {
  GLM_REQUIRE_CUDA_DEVICE();
  ModelWeights dense = Random("tiny", DType::kBF16);
  {
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    w.layers[1].attn.k_proj = dense.layers[1].attn.k_proj;  // q and v FP8, k bf16
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("layer 1 attention: 2 of 3"), std::string::npos)
        << m.status();
  }
  {
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    for (LayerWeights& l : w.layers) {
      if (l.is_moe) l.moe.experts[2].down = dense.layers[l.layer_index].moe.experts[2].down;
    }
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("routed experts"), std::string::npos) << m.status();
  }
  {
    // An FP8 head of the right shape (checkpoints keep it bf16: the device reads it so).
    ModelWeights w = Random("tiny", DType::kF8E4M3);
    const int64_t vocab = w.config.vocab_size, hidden = w.config.hidden_size;
    const std::vector<uint8_t> codes(vocab * hidden, 0x38);
    const std::vector<float> scales(vocab, 0.5f);
    Matrix head{DType::kF8E4M3, vocab, hidden, codes.data()};
    head.format = WeightFormat::kFp8Scaled;
    head.scales = scales.data();
    head.scale_block_rows = 1;
    head.scale_block_cols = static_cast<int32_t>(hidden);
    w.lm_head = head;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find("lm_head"), std::string::npos) << m.status();
  }
  // A whole group kept unquantized (as an ignore list does) is fine: o_proj in bf16.
  ModelWeights w = Random("tiny", DType::kF8E4M3);
  for (LayerWeights& l : w.layers) l.attn.o_proj = dense.layers[l.layer_index].attn.o_proj;
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(std::move(w));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->device_weights().layers[0].o8.codes, nullptr);
  EXPECT_NE((*m)->device_weights().layers[0].o, nullptr);
}

}  // namespace
}  // namespace glmserve::cuda
