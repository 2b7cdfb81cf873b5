// The NaN/Inf check of checkpoint weights: which modes see what, and the message naming the
// tensor.
#include "core/model/weight_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "core/model/checkpoint.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

ModelWeights Tiny(DType dtype) {
  absl::StatusOr<ModelWeights> w =
      RandomWeights(*PresetConfig("tiny"), {.seed = 3, .dtype = dtype});
  EXPECT_TRUE(w.ok());
  return *std::move(w);
}

// Writes raw bits into a matrix element (the random weights own writable buffers).
void Poke(const Matrix& m, int64_t index, uint32_t bits) {
  char* p = static_cast<char*>(const_cast<void*>(m.data)) + index * DTypeSize(m.dtype);
  std::memcpy(p, &bits, DTypeSize(m.dtype));
}

TEST(WeightCheckTest, ParsesModes) {
  EXPECT_EQ(*ParseVerifyWeights("auto"), VerifyWeights::kAuto);
  EXPECT_EQ(*ParseVerifyWeights("full"), VerifyWeights::kFull);
  EXPECT_EQ(*ParseVerifyWeights("sampled"), VerifyWeights::kSampled);
  EXPECT_EQ(*ParseVerifyWeights("off"), VerifyWeights::kOff);
  EXPECT_EQ(ParseVerifyWeights("yes").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WeightCheckTest, FiniteWeightsPassEveryMode) {
  ModelWeights w = Tiny(DType::kBF16);
  for (VerifyWeights mode : {VerifyWeights::kAuto, VerifyWeights::kFull, VerifyWeights::kSampled}) {
    EXPECT_TRUE(VerifyWeightsFinite(&w, mode, "m").ok());
  }
}

TEST(WeightCheckTest, FullFindsAnyElementAndNamesIt) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    ModelWeights w = Tiny(dtype);
    const Matrix& m = w.layers[1].moe.experts[5].up;  // [32, 64]
    const uint32_t inf = dtype == DType::kF32    ? 0x7f800000u
                         : dtype == DType::kBF16 ? 0x7f80u
                                                 : 0x7c00u;
    Poke(m, 3 * 64 + 9, inf);
    const absl::Status s = VerifyWeightsFinite(&w, VerifyWeights::kFull, "checkpoint /m");
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("checkpoint /m: tensor 'model.layers.1.mlp.experts.5.up_proj.weight' "
                          "holds a non-finite value (NaN or Inf) at row 3, column 9"));
    EXPECT_TRUE(VerifyWeightsFinite(&w, VerifyWeights::kOff, "m").ok());
  }
}

TEST(WeightCheckTest, SampledReadsRunsOfLargeMatricesAndEveryVector) {
  ModelWeights w = Tiny(DType::kBF16);
  // The embedding [256, 64] = 16384 elements: exactly the sampled size, checked whole. The
  // lm_head is the same size; poke a NaN in a vector instead, always checked.
  w.layers[0].input_norm[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(std::string(VerifyWeightsFinite(&w, VerifyWeights::kSampled, "m").message()),
              HasSubstr("'model.layers.0.input_layernorm.weight' holds a non-finite value (NaN "
                        "or Inf) at element 7"));
}

TEST(WeightCheckTest, SampledSeesTheEndsOfEachMatrix) {
  // A larger model so that matrices exceed the sampled size.
  ModelConfig c = *PresetConfig("tiny");
  c.vocab_size = 1024;  // embedding [1024, 64] = 65536 elements > 16 runs of 1024
  absl::StatusOr<ModelWeights> w = RandomWeights(c, {.seed = 3});
  ASSERT_TRUE(w.ok());
  Poke(w->embed_tokens, 1024 * 64 - 1, 0x7fc0u);  // the last element: a NaN
  EXPECT_FALSE(VerifyWeightsFinite(&*w, VerifyWeights::kSampled, "m").ok());
  Poke(w->embed_tokens, 1024 * 64 - 1, 0);
  // Between two runs: only the full pass sees it (what "sampled" trades away).
  Poke(w->embed_tokens, 2500, 0x7fc0u);
  EXPECT_TRUE(VerifyWeightsFinite(&*w, VerifyWeights::kSampled, "m").ok());
  EXPECT_FALSE(VerifyWeightsFinite(&*w, VerifyWeights::kFull, "m").ok());
  EXPECT_FALSE(VerifyWeightsFinite(&*w, VerifyWeights::kAuto, "m").ok()) << "small: auto = full";
}

TEST(WeightCheckTest, LoadModelVerifiesCheckpointsByDefault) {
  const std::string dir = testing::MakeTempDir("weight_check_");
  ModelWeights w = Tiny(DType::kF32);
  Poke(w.layers[2].attn.o_proj, 100, 0x7fc00000u);
  ASSERT_TRUE(SaveCheckpoint(w, dir).ok());
  const absl::Status s = LoadModel(dir).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("'model.layers.2.self_attn.o_proj.weight'"));
  EXPECT_TRUE(LoadModel(dir, {}, {}, {.verify = VerifyWeights::kOff}).ok());
}

}  // namespace
}  // namespace glmserve
