// FP8 GLM-5 on the CPU (docs/glm5.md, docs/fp8.md): the absorbed attention's kv_b_proj
// widened exactly, the preset in the GLM-5-FP8 form (128x128 block scales), the model's
// logits equal to those of its dequantized twin, the checkpoint round trip and device
// selection. The golden glm5_fp8_block_fp32 (golden_test.cc) ties it to Transformers;
// the runner conformance suite's cpu_fp8_glm5 case checks the batching invariants.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/base/dtype.h"
#include "core/cpu/cpu_model.h"
#include "core/cpu/ops/mla.h"
#include "core/cuda/runner.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/weight_layout.h"
#include "nlohmann/json.hpp"
#include "tests/core/all_logits.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::AllLogits;

using Json = nlohmann::json;

// The fp32 value of element (r, c) of an FP8 matrix: e4m3 x its block's scale.
float Fp8Value(const Matrix& m, int64_t r, int64_t c) {
  const uint8_t code = static_cast<const uint8_t*>(m.data)[r * m.cols + c];
  return E4m3ToFloat(code) * m.Fp8RowScales(r)[c / m.scale_block_cols];
}

// Replaces every FP8 matrix of `w` by an fp32 matrix of its values: the dequantized model.
void Dequantize(ModelWeights* w) {
  for (const WeightSlot& slot : ListWeightSlots(w)) {
    if (slot.matrix == nullptr || slot.matrix->format != WeightFormat::kFp8Scaled) continue;
    const Matrix& m = *slot.matrix;
    auto values = std::make_shared<std::vector<float>>(m.rows * m.cols);
    for (int64_t r = 0; r < m.rows; ++r) {
      for (int64_t c = 0; c < m.cols; ++c) (*values)[r * m.cols + c] = Fp8Value(m, r, c);
    }
    *slot.matrix = Matrix{DType::kF32, m.rows, m.cols, values->data()};
    w->storage.push_back(values);
  }
  w->linear_format = WeightFormat::kDense;
}

// Longer than tiny-glm5's index_topk (8), so the sparse selection runs too.
const std::vector<int32_t> kIds = {5, 17, 99, 3, 42, 42, 7, 250, 1, 0, 64, 31, 200, 9};

TEST(Glm5Fp8Test, AbsorbedKeyOfAnFp8KvBProjIsItsDequantizedTranspose) {
  // kv_b_proj [H (dn + dv), R] = [3 x (40 + 24), 144]: 192 rows and 144 columns, both cut
  // short at the second 128-block; scales differ per block and a code is subnormal.
  MlaShape shape;
  shape.heads = 3;
  shape.latent_dim = 144;
  shape.nope_dim = 40;
  shape.v_dim = 24;
  shape.rope_dim = 8;
  const int64_t rows = shape.heads * (shape.nope_dim + shape.v_dim), cols = shape.latent_dim;
  std::vector<uint8_t> codes(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    codes[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    if (codes[i] == 0x7f || codes[i] == 0xff) codes[i] = 0x01;  // no NaN codes here
  }
  const std::vector<float> scales = {0.5f, 0.25f, 3.0f, 0.125f};  // [2, 2] blocks
  Matrix m{DType::kF8E4M3, rows, cols, codes.data()};
  m.format = WeightFormat::kFp8Scaled;
  m.scales = scales.data();
  m.scale_block_rows = 128;
  m.scale_block_cols = 128;
  const AbsorbedKey k = AbsorbedKeyWeights(m, shape);
  ASSERT_EQ(k.dtype, DType::kF32);
  ASSERT_EQ(k.bytes.size(), shape.heads * cols * shape.nope_dim * sizeof(float));
  const float* got = reinterpret_cast<const float*>(k.bytes.data());
  for (int64_t h = 0; h < shape.heads; ++h) {
    for (int64_t i = 0; i < shape.nope_dim; ++i) {
      const int64_t row = h * (shape.nope_dim + shape.v_dim) + i;  // W_uk[h] row i
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(got[(h * cols + c) * shape.nope_dim + i], Fp8Value(m, row, c))
            << "head " << h << " row " << i << " col " << c;
      }
    }
  }
  // A row of the second block row (head 2 starts at row 128) takes that block's scales.
  EXPECT_EQ(got[(2 * cols + 130) * shape.nope_dim + 0],
            E4m3ToFloat(codes[128 * cols + 130]) * 0.125f);
}

TEST(Glm5Fp8Test, PresetIsBlockScaledWithWeightsProjHeadAndRoutersUnquantized) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-glm5-fp8");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->config.is_mla());
  EXPECT_EQ(w->linear_format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(w->weight_dtype, DType::kF8E4M3);
  const LayerWeights& full = w->layers[2];  // full indexer layer, MoE
  for (const Matrix* m : {&full.mla.q_a_proj, &full.mla.q_b_proj, &full.mla.kv_a_proj,
                          &full.mla.kv_b_proj, &full.mla.o_proj, &full.mla.indexer.wq_b,
                          &full.mla.indexer.wk, &full.moe.experts[1].gate}) {
    EXPECT_EQ(m->format, WeightFormat::kFp8Scaled);
    EXPECT_EQ(m->scale_block_rows, 128);
    EXPECT_EQ(m->scale_block_cols, 128);
  }
  EXPECT_EQ(full.mla.indexer.weights_proj.dtype, DType::kBF16);
  EXPECT_EQ(full.moe.router.dtype, DType::kBF16);
  EXPECT_EQ(w->lm_head.dtype, DType::kBF16);
  EXPECT_EQ(w->embed_tokens.dtype, DType::kBF16);
  EXPECT_TRUE(PresetIsFp8("glm-5-fp8:layers=4"));
  absl::StatusOr<ModelConfig> released = PresetConfig("glm-5-fp8");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->hidden_size, 6144);
}

// The FP8 model computes exactly its dequantized twin (fp32 weights e4m3 x scale): the FP8
// kernels widen in registers to those values and keep the fp32 reduction order, and the
// absorbed W_uk^T is widened to the same values.
TEST(Glm5Fp8Test, LogitsEqualTheDequantizedModel) {
  absl::StatusOr<ModelWeights> fp8 = LoadModel("tiny-glm5-fp8");
  absl::StatusOr<ModelWeights> deq = LoadModel("tiny-glm5-fp8");
  ASSERT_TRUE(fp8.ok() && deq.ok());
  Dequantize(&*deq);
  CpuModel a(*std::move(fp8), CpuMath::kExact), b(*std::move(deq), CpuMath::kExact);
  const std::vector<float> la = AllLogits(a, kIds), lb = AllLogits(b, kIds);
  ASSERT_EQ(la.size(), kIds.size() * 256);
  EXPECT_EQ(la, lb);
}

TEST(Glm5Fp8Test, SavedPresetLoadsBackInTheBlockFp8Form) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-glm5-fp8");
  ASSERT_TRUE(w.ok());
  const std::string dir = testing::MakeTempDir("glm5_fp8_save_");
  ASSERT_TRUE(SaveCheckpoint(*w, dir).ok());
  std::ifstream in(dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  const Json q = Json::parse(text.str())["quantization_config"];
  EXPECT_EQ(q["quant_method"], "fp8");
  EXPECT_EQ(q["weight_block_size"], Json::array({128, 128}));
  absl::StatusOr<ModelWeights> again = LoadCheckpoint(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->layers[0].mla.kv_b_proj.format, WeightFormat::kFp8Scaled);
  EXPECT_EQ(again->layers[0].mla.indexer.weights_proj.dtype, DType::kBF16);
  CpuModel a(*std::move(w)), b(*std::move(again));
  EXPECT_EQ(AllLogits(a, kIds), AllLogits(b, kIds));
  std::filesystem::remove_all(dir);
}

// The CUDA runner serves FP8 GLM-5 (its device path is tested under emulation in
// tests/core/cuda/fp8_model_cuda_test.cc and golden_test.cc): device selection treats it as
// any other model, with no FP8 GLM-5 refusal left.
TEST(Glm5Fp8Test, DeviceSelectionTakesTheGpuWhenPresent) {
  absl::StatusOr<ModelWeights> w = LoadModel("tiny-glm5-fp8");
  ASSERT_TRUE(w.ok());
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(*std::move(w), DeviceKind::kCuda);
  if (CudaDeviceAvailable()) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE((*r)->device_name(), "cpu");
  } else {
    // Refused for the missing device only (the message names it), not for the model.
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_EQ(r.status().message().find("FP8 GLM-5"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("--device=cuda"), std::string::npos) << r.status();
  }
  absl::StatusOr<ModelWeights> again = LoadModel("tiny-glm5-fp8");
  ASSERT_TRUE(again.ok());
  absl::StatusOr<std::unique_ptr<ModelRunner>> any =
      CreateModelRunner(*std::move(again), DeviceKind::kAuto);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->device_name() == "cpu", !CudaDeviceAvailable());
}

}  // namespace
}  // namespace glmserve
