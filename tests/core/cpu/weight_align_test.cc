// core/cpu/weight_align.h: kBf16Amx copies linear matrices that sit off cache lines into an
// aligned buffer at load, values unchanged; the forward gives the same bits either way.
#include "core/cpu/weight_align.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/cpu/cpu_model.h"
#include "core/model/checkpoint.h"
#include "tests/core/all_logits.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// Moves every linear matrix 16 bytes past a cache line, as a safetensors file usually puts
// them, into a buffer held by weights->storage.
void Misalign(ModelWeights* weights) {
  for (Matrix* m : weights->LinearMatrices()) {
    auto buffer = std::shared_ptr<char[]>(new char[m->bytes() + 128]);
    char* base = buffer.get() + (64 - reinterpret_cast<uintptr_t>(buffer.get()) % 64) + 16;
    std::memcpy(base, m->data, m->bytes());
    m->data = base;
    weights->storage.push_back(std::shared_ptr<const void>(buffer, buffer.get()));
  }
}

TEST(WeightAlign, CopiesMisalignedMatricesOnceWithTheirValues) {
  absl::StatusOr<ModelWeights> reference = LoadCheckpoint(testing::GoldenDir("bf16"));
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<ModelWeights> weights = LoadCheckpoint(testing::GoldenDir("bf16"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  Misalign(&*weights);
  const std::vector<Matrix*> before = weights->LinearMatrices();
  ASSERT_FALSE(before.empty());
  int64_t bytes = 0;
  for (const Matrix* m : before) {
    ASSERT_FALSE(Aligned(m->data));
    bytes += (m->bytes() + 63) / 64 * 64;
  }
  EXPECT_EQ(AlignLinearMatrices(&*weights), bytes);
  const std::vector<Matrix*> after = weights->LinearMatrices();
  const std::vector<Matrix*> want = reference->LinearMatrices();
  ASSERT_EQ(after.size(), want.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(Aligned(after[i]->data)) << i;
    ASSERT_EQ(after[i]->bytes(), want[i]->bytes());
    EXPECT_EQ(std::memcmp(after[i]->data, want[i]->data, want[i]->bytes()), 0) << i;
  }
  EXPECT_EQ(AlignLinearMatrices(&*weights), 0) << "nothing left to move";
}

// The bf16_amx model aligns at construction (the other modes read weights as they are), and
// its logits are the bits of the same model built from aligned weights.
TEST(WeightAlign, Bf16AmxModelAlignsAtLoadWithIdenticalLogits) {
  const std::vector<int32_t> prompt = {3, 17, 25, 9, 10, 42, 7};
  absl::StatusOr<ModelWeights> aligned = LoadCheckpoint(testing::GoldenDir("bf16"));
  absl::StatusOr<ModelWeights> shifted = LoadCheckpoint(testing::GoldenDir("bf16"));
  ASSERT_TRUE(aligned.ok() && shifted.ok());
  AlignLinearMatrices(&*aligned);
  Misalign(&*shifted);
  CpuModel want(*std::move(aligned), CpuMath::kBf16Amx);
  CpuModel got(*std::move(shifted), CpuMath::kBf16Amx);
  ModelWeights view = got.weights();  // a shallow copy: the same matrices' data
  for (const Matrix* m : view.LinearMatrices()) EXPECT_TRUE(Aligned(m->data));
  const std::vector<float> logits = testing::AllLogits(got, prompt);
  ASSERT_FALSE(logits.empty());
  EXPECT_EQ(logits, testing::AllLogits(want, prompt));

  absl::StatusOr<ModelWeights> exact_weights = LoadCheckpoint(testing::GoldenDir("bf16"));
  ASSERT_TRUE(exact_weights.ok());
  Misalign(&*exact_weights);
  CpuModel exact(*std::move(exact_weights), CpuMath::kExact);
  ModelWeights exact_view = exact.weights();
  for (const Matrix* m : exact_view.LinearMatrices()) {
    EXPECT_FALSE(Aligned(m->data)) << "only bf16_amx copies";
  }
}

}  // namespace
}  // namespace glmserve
