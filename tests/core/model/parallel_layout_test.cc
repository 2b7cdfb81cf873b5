// The tensor-parallel layout rules (core/model/parallel_layout.h).
#include "core/model/parallel_layout.h"

#include <gtest/gtest.h>

namespace glmserve {
namespace {

TEST(SplitRangeTest, PartsCoverTheExtentInOrderOnUnitBoundaries) {
  for (const int64_t extent : {1, 7, 96, 1536, 151552}) {
    for (const int64_t unit : {1, 32, 128}) {
      for (const int size : {1, 2, 3, 4, 6, 8}) {
        int64_t next = 0;
        for (int r = 0; r < size; ++r) {
          const IndexRange part = SplitRange(extent, unit, r, size);
          EXPECT_EQ(part.begin, next) << extent << " " << unit << " " << size << " " << r;
          EXPECT_GE(part.count, 0);
          if (part.end() != extent) EXPECT_EQ(part.end() % unit, 0);
          next = part.end();
        }
        EXPECT_EQ(next, extent);
      }
    }
  }
  // Units spread as evenly as they go: 12 blocks of 128 over 8 ranks are 1 or 2 blocks each.
  for (int r = 0; r < 8; ++r) {
    const int64_t count = SplitRange(1536, 128, r, 8).count;
    EXPECT_TRUE(count == 128 || count == 256) << r;
  }
}

TEST(ParallelLayoutTest, Glm45HeadsAndExperts) {
  const ModelConfig c = *PresetConfig("glm-4.5");  // 96 heads, 8 KV heads, 160 experts
  ParallelConfig p;
  p.tensor_parallel = 8;
  ASSERT_TRUE(CheckParallelLayout(c, p, 128).ok()) << CheckParallelLayout(c, p, 128);
  for (int r = 0; r < 8; ++r) {
    const RankLayout l = LayoutOf(c, p, r, 128);
    EXPECT_EQ(l.q_heads, (IndexRange{12 * r, 12}));
    EXPECT_EQ(l.kv_heads, (IndexRange{r, 1}));  // 12 query heads read exactly KV head r
    EXPECT_EQ(l.experts, (IndexRange{20 * r, 20}));
    EXPECT_EQ(l.LocalConfig(c).num_attention_heads, 12);
    EXPECT_EQ(l.LocalConfig(c).num_key_value_heads, 1);
    EXPECT_EQ(l.LocalConfig(c).vocab_size, c.vocab_size);  // ids stay the model's
  }
  // 16 ranks: 6 query heads each, two ranks share (replicate) each KV head. With FP8
  // 128-blocks the shared expert's 1536 columns are 12 blocks: ranks 0, 4, 8 and 12 hold none
  // of it (zero width), the others one block each.
  p.tensor_parallel = 16;
  ASSERT_TRUE(CheckParallelLayout(c, p, 128).ok()) << CheckParallelLayout(c, p, 128);
  int64_t shared_columns = 0;
  for (int r = 0; r < 16; ++r) {
    const IndexRange w = LayoutOf(c, p, r, 128).SharedWidth(c);
    EXPECT_EQ(w.count, r % 4 == 0 ? 0 : 128) << r;
    shared_columns += w.count;
  }
  EXPECT_EQ(shared_columns, 1536);
  ASSERT_TRUE(CheckParallelLayout(c, p, 1).ok()) << CheckParallelLayout(c, p, 1);
  for (int r = 0; r < 16; ++r) {
    const RankLayout l = LayoutOf(c, p, r, 1);
    EXPECT_EQ(l.kv_heads, (IndexRange{r / 2, 1})) << r;
    // Every query head of the rank reads that KV head (96 / 8 = 12 per KV head).
    EXPECT_EQ(l.q_heads.begin / 12, l.kv_heads.begin);
    EXPECT_EQ((l.q_heads.end() - 1) / 12, l.kv_heads.begin);
  }
}

TEST(ParallelLayoutTest, UnevenExpertsAndWidthSplit) {
  ModelConfig c = *PresetConfig("tiny");
  c.n_routed_experts = 10;
  ParallelConfig p;
  p.tensor_parallel = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  ASSERT_TRUE(CheckParallelLayout(c, p).ok());
  int64_t held = 0;
  for (int r = 0; r < 4; ++r) {
    const RankLayout l = LayoutOf(c, p, r);
    EXPECT_TRUE(l.experts.count == 2 || l.experts.count == 3);
    EXPECT_EQ(l.experts.begin, held);
    held += l.experts.count;
    EXPECT_EQ(l.ExpertWidth(c).count, c.moe_intermediate_size);  // whole experts
  }
  EXPECT_EQ(held, 10);
  p.expert_parallel = false;
  for (int r = 0; r < 4; ++r) {
    const RankLayout l = LayoutOf(c, p, r);
    EXPECT_EQ(l.experts.count, 10);
    EXPECT_EQ(l.ExpertWidth(c).count, c.moe_intermediate_size / 4);
  }
}

TEST(ParallelLayoutTest, RefusalsNameTheNumbers) {
  const ModelConfig c = *PresetConfig("tiny");  // 4 heads, 2 KV heads, 8 experts
  ParallelConfig p;
  p.tensor_parallel = 3;
  absl::Status s = CheckParallelLayout(c, p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4 attention heads"), absl::string_view::npos) << s;
  ModelConfig odd = c;
  odd.num_attention_heads = 12;
  odd.num_key_value_heads = 3;
  p.tensor_parallel = 4;  // 3 KV heads: neither divides nor is divided by 4
  s = CheckParallelLayout(odd, p);
  EXPECT_NE(s.message().find("3 KV heads"), absl::string_view::npos) << s;
  p.tensor_parallel = 2;  // two 16-wide heads a rank: 32 columns of o_proj, not a 128-block
  s = CheckParallelLayout(c, p, 128);
  EXPECT_NE(s.message().find("32 columns of o_proj, not whole scale blocks of 128"),
            absl::string_view::npos)
      << s;
  ModelConfig wide_heads = c;  // heads of 128: o_proj fine; the 32-wide shared expert is one
  wide_heads.head_dim = 128;   // block, so rank 1 holds none of it (zero width): accepted
  EXPECT_TRUE(CheckParallelLayout(wide_heads, p, 128).ok());
  ModelConfig few = c;
  few.num_attention_heads = 16;
  few.num_key_value_heads = 16;
  few.n_routed_experts = 8;
  p.tensor_parallel = 16;
  s = CheckParallelLayout(few, p);
  EXPECT_NE(s.message().find("8"), absl::string_view::npos) << s;
  EXPECT_FALSE(s.ok());
  p.tensor_parallel = 0;
  EXPECT_FALSE(CheckParallelLayout(c, p).ok());
}

}  // namespace
}  // namespace glmserve
