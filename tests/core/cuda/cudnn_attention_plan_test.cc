// cuDNN attention's step metadata (core/cuda/cudnn_attention_plan.h): what the fused SDPA is
// given for a step, built from the same tiles and block tables the attention kernels read.
// Plain host code: runs in every build, with or without a GPU or cuDNN.
#include "core/cuda/cudnn_attention_plan.h"

#include <gtest/gtest.h>

#include <set>

namespace glmserve::cuda {
namespace {

TEST(CudnnAttentionPlan, BucketUp) {
  EXPECT_EQ(BucketUp(0), 1);
  EXPECT_EQ(BucketUp(1), 1);
  EXPECT_EQ(BucketUp(2), 2);
  EXPECT_EQ(BucketUp(3), 4);
  EXPECT_EQ(BucketUp(64), 64);
  EXPECT_EQ(BucketUp(65), 128);
}

TEST(CudnnAttentionPlan, KeyOrdersAndCompares) {
  const CudnnPlanKey a{2, 1, 4}, b{2, 1, 8}, c{2, 2, 1}, d{4, 1, 1};
  EXPECT_TRUE(a < b);
  EXPECT_TRUE(b < c);
  EXPECT_TRUE(c < d);
  EXPECT_FALSE(a < a);
  EXPECT_TRUE(a == CudnnPlanKey({2, 1, 4}));
  EXPECT_FALSE(a == b);
  std::set<CudnnPlanKey> keys = {a, b, c, d, a};
  EXPECT_EQ(keys.size(), 4u);
}

// A prefill chunk with earlier context (5 new tokens at positions 3..7, several tiles), a
// decode row (position 8 of a 9-key context) and a fresh one-token prompt.
TEST(CudnnAttentionPlan, MixedStepRegroupsTilesPerSequence) {
  const BlockTable a = {7, 2, 9}, b = {5, 0, 3}, c = {4};
  ForwardBatch batch;
  batch.sequences = {{5, 3, &a}, {1, 8, &b}, {1, 0, &c}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, /*block_size=*/4, /*tile_tokens=*/2, StepPadding{}, false,
                &plan);
  ASSERT_EQ(plan.num_tiles, 5);  // 2 + 2 + 1 tiles for a, then b, then c

  CudnnAttentionBatch out;
  std::string why;
  const int64_t row_elems = 3 * 8;  // heads x head_dim
  ASSERT_TRUE(BuildCudnnAttentionBatch(plan, 4, row_elems, &out, &why)) << why;
  EXPECT_EQ(out.sequences, 3);
  EXPECT_EQ(out.key, (CudnnPlanKey{4, 8, 4}));  // 3 -> 4 sequences, 5 -> 8 rows, 3 -> 4 pages
  // The bucket's fourth entry: no query rows, one key on block 0.
  EXPECT_EQ(out.seq_len_q, (std::vector<int32_t>{5, 1, 1, 0}));
  EXPECT_EQ(out.seq_len_kv, (std::vector<int32_t>{8, 9, 1, 1}));
  EXPECT_EQ(out.ragged, (std::vector<int32_t>{0, 5 * 24, 6 * 24, 7 * 24, 7 * 24}));
  EXPECT_EQ(out.page_table, (std::vector<int32_t>{7, 2, 0, 0,  //
                                                  5, 0, 3, 0,  //
                                                  4, 0, 0, 0,  //
                                                  0, 0, 0, 0}));
  std::vector<int32_t> flat(out.total_ints(), -1);
  out.Write(flat.data());
  EXPECT_EQ(flat[out.seq_len_q_offset()], 5);
  EXPECT_EQ(flat[out.seq_len_kv_offset() + 1], 9);
  EXPECT_EQ(flat[out.ragged_offset() + 4], 7 * 24);
  EXPECT_EQ(flat[out.page_table_offset() + 4], 5);
  EXPECT_EQ(flat.back(), 0);
}

TEST(CudnnAttentionPlan, DecodeBatchAndLongContexts) {
  // Two decode rows, one of them deep into its table (context 37 over blocks of 4: 10 pages).
  BlockTable a, b = {1};
  for (int32_t i = 0; i < 10; ++i) a.push_back(100 - i);
  ForwardBatch batch;
  batch.sequences = {{1, 36, &a}, {1, 2, &b}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 16, StepPadding{}, false, &plan);
  CudnnAttentionBatch out;
  std::string why;
  ASSERT_TRUE(BuildCudnnAttentionBatch(plan, 4, 16, &out, &why)) << why;
  EXPECT_EQ(out.key, (CudnnPlanKey{2, 1, 16}));
  EXPECT_EQ(out.seq_len_q, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(out.seq_len_kv, (std::vector<int32_t>{37, 3}));
  EXPECT_EQ(out.ragged, (std::vector<int32_t>{0, 16, 32}));
  ASSERT_EQ(out.page_table.size(), 32u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out.page_table[i], 100 - i);
  for (int i = 10; i < 16; ++i) EXPECT_EQ(out.page_table[i], 0);
  EXPECT_EQ(out.page_table[16], 1);
}

TEST(CudnnAttentionPlan, RefusesPaddedGraphSteps) {
  const BlockTable a = {3};
  ForwardBatch batch;
  batch.sequences = {{1, 0, &a}, {1, 1, &a}, {1, 2, &a}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 2, StepPadding{4}, false, &plan);
  CudnnAttentionBatch out;
  std::string why;
  EXPECT_FALSE(BuildCudnnAttentionBatch(plan, 4, 8, &out, &why));
  EXPECT_NE(why.find("padding"), std::string::npos) << why;
}

TEST(CudnnAttentionPlan, SequencesSharingATableStaySeparate) {
  // Two sequences over the same blocks (a shared prefix): distinct table copies, so distinct
  // offsets; the second one's positions restart, which also separates them.
  const BlockTable a = {6, 1};
  ForwardBatch batch;
  batch.sequences = {{2, 4, &a}, {2, 4, &a}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 4, StepPadding{}, false, &plan);
  CudnnAttentionBatch out;
  std::string why;
  ASSERT_TRUE(BuildCudnnAttentionBatch(plan, 4, 2, &out, &why)) << why;
  EXPECT_EQ(out.sequences, 2);
  EXPECT_EQ(out.seq_len_q, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(out.seq_len_kv, (std::vector<int32_t>{6, 6}));
  EXPECT_EQ(out.page_table, (std::vector<int32_t>{6, 1, 6, 1}));
}

TEST(CudnnAttentionPlan, RefusesInt32Overflow) {
  const BlockTable a = {0};
  ForwardBatch batch;
  batch.sequences = {{2, 0, &a}};
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 2, StepPadding{}, false, &plan);
  CudnnAttentionBatch out;
  std::string why;
  EXPECT_FALSE(BuildCudnnAttentionBatch(plan, 4, int64_t{1} << 31, &out, &why));
  EXPECT_NE(why.find("int32"), std::string::npos) << why;
}

}  // namespace
}  // namespace glmserve::cuda
