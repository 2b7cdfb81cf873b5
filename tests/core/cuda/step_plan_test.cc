// The host-side step description the GPU kernels read (core/cuda/step_plan.h). Plain host
// code: runs in CUDA builds whether or not a GPU is present.
#include "core/cuda/step_plan.h"

#include <gtest/gtest.h>

namespace glmserve::cuda {
namespace {

TEST(CudaStepPlan, RaggedBatchTilesSlotsAndLogitRows) {
  const BlockTable a = {7, 2}, b = {5, 0, 3};
  ForwardBatch batch;
  batch.sequences = {{5, 0, &a}, {3, 6, &b}};
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  batch.token_ids = ids;
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, /*block_size=*/4, /*tile_tokens=*/2, StepPadding{},
                /*with_ids=*/true, &plan);
  EXPECT_EQ(plan.tokens, 8);
  EXPECT_EQ(plan.real_tokens, 8);
  EXPECT_EQ(plan.ids, ids);
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 6, 7, 8}));
  // Position p of a sequence lives in block table[p / 4] at slot p % 4.
  EXPECT_EQ(plan.slots, (std::vector<int32_t>{28, 29, 30, 31, 8, 2, 3, 12}));
  EXPECT_EQ(plan.block_tables, (std::vector<int32_t>{7, 2, 5, 0, 3}));
  // Tiles: {row0, num_q, pos0, bt_offset, kv_len}; at most 2 tokens, never across sequences.
  EXPECT_EQ(plan.tiles, (std::vector<int32_t>{0, 2, 0, 0, 2,  //
                                              2, 2, 2, 0, 4,  //
                                              4, 1, 4, 0, 5,  //
                                              5, 2, 6, 2, 8,  //
                                              7, 1, 8, 2, 9}));
  EXPECT_EQ(plan.num_tiles, 5);
  EXPECT_EQ(plan.max_kv_len, 9);
  EXPECT_EQ(plan.logit_index, (std::vector<int32_t>{4, 7}));
  EXPECT_EQ(plan.real_logit_rows, 2);

  BuildStepPlan(batch, LogitsRows::kAll, 4, 2, StepPadding{}, true, &plan);
  EXPECT_EQ(plan.logit_rows, 8);
  BuildStepPlan(batch, LogitsRows::kNone, 4, 2, StepPadding{}, false, &plan);
  EXPECT_EQ(plan.logit_rows, 0);
  EXPECT_TRUE(plan.ids.empty());
}

TEST(CudaStepPlan, PaddingRowsAreInert) {
  const BlockTable a = {3}, b = {1};
  ForwardBatch batch;
  batch.sequences = {{1, 2, &a}, {1, 0, &b}};
  const std::vector<int32_t> ids = {9, 10};
  batch.token_ids = ids;
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 8, StepPadding{4, 4, 4}, true, &plan);
  EXPECT_EQ(plan.tokens, 4);
  EXPECT_EQ(plan.real_tokens, 2);
  EXPECT_EQ(plan.ids, (std::vector<int32_t>{9, 10, 0, 0}));
  EXPECT_EQ(plan.slots, (std::vector<int32_t>{14, 4, -1, -1}));
  EXPECT_EQ(plan.num_tiles, 4);
  // Padding tiles attend to nothing (kv_len 0).
  EXPECT_EQ(std::vector<int32_t>(plan.tiles.begin() + 10, plan.tiles.end()),
            (std::vector<int32_t>{2, 1, 0, 0, 0, 3, 1, 0, 0, 0}));
  EXPECT_EQ(plan.logit_index, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.real_logit_rows, 2);
  EXPECT_EQ(plan.logit_rows, 4);
}

TEST(CudaStepPlan, MixedGraphStepPadsTilesAndLogitRowsToTheirBuckets) {
  // A prefill chunk after cached context (5 tokens, tiles of 2) and two decodes: 7 rows, 5
  // tiles, 3 logits rows, padded to the graph shape (8 rows, 8 tiles, 4 logits rows).
  const BlockTable a = {3, 1}, b = {2}, d = {0};
  ForwardBatch batch;
  batch.sequences = {{5, 3, &a}, {1, 2, &b}, {1, 0, &d}};
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  batch.token_ids = ids;
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kLast, 4, 2, StepPadding{8, 8, 4}, true, &plan);
  EXPECT_EQ(plan.tokens, 8);
  EXPECT_EQ(plan.real_tokens, 7);
  EXPECT_EQ(plan.slots.back(), -1);
  ASSERT_EQ(plan.num_tiles, 8);
  // Real tiles, the padding row's own (kv_len 0), then two empty ones (num_q 0).
  EXPECT_EQ(plan.tiles, (std::vector<int32_t>{0, 2, 3, 0, 5,  //
                                              2, 2, 5, 0, 7,  //
                                              4, 1, 7, 0, 8,  //
                                              5, 1, 2, 2, 3,  //
                                              6, 1, 0, 3, 1,  //
                                              7, 1, 0, 0, 0,  //
                                              0, 0, 0, 0, 0,  //
                                              0, 0, 0, 0, 0}));
  // The sequences' last rows, then the padding row.
  EXPECT_EQ(plan.logit_index, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(plan.real_logit_rows, 3);
  EXPECT_EQ(plan.logit_rows, 4);

  // More padded logits rows than padding rows: row 0 again (computed, never returned).
  BuildStepPlan(batch, LogitsRows::kLast, 4, 2, StepPadding{8, 8, 6}, true, &plan);
  EXPECT_EQ(plan.logit_index, (std::vector<int32_t>{4, 5, 6, 7, 0, 0}));
  // No logits: no logits rows whatever the padding says.
  BuildStepPlan(batch, LogitsRows::kNone, 4, 2, StepPadding{8, 8, 4}, true, &plan);
  EXPECT_EQ(plan.logit_rows, 0);
}

TEST(CudaStepPlan, MetaLayoutPlacesEverySection) {
  const BlockTable a = {3, 4};
  ForwardBatch batch;
  batch.sequences = {{6, 0, &a}};
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  batch.token_ids = ids;
  StepPlan plan;
  BuildStepPlan(batch, LogitsRows::kAll, 4, 4, StepPadding{}, true, &plan);
  MetaLayout layout{8, 16};
  ASSERT_TRUE(layout.Fits(plan));
  std::vector<int32_t> meta(layout.total(), -7);
  const int64_t used = WriteMeta(plan, layout, meta.data());
  EXPECT_EQ(used, layout.block_tables() + 2);
  EXPECT_EQ(meta[layout.ids() + 5], 6);
  EXPECT_EQ(meta[layout.positions() + 5], 5);
  EXPECT_EQ(meta[layout.slots() + 4], 16);
  EXPECT_EQ(meta[layout.logit_index() + 5], 5);
  EXPECT_EQ(meta[layout.tiles() + 5], 4);  // second tile's row0
  EXPECT_EQ(meta[layout.block_tables() + 1], 4);
  EXPECT_FALSE((MetaLayout{4, 16}).Fits(plan));
  EXPECT_FALSE((MetaLayout{8, 1}).Fits(plan));
}

}  // namespace
}  // namespace glmserve::cuda
