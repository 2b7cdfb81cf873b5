#include "bench/spec_ceiling.h"

#include <cstdio>

#include "gtest/gtest.h"

namespace glmserve::bench {
namespace {

ModelReads Reads(const char* preset) {
  absl::StatusOr<ModelConfig> c = PresetConfig(preset);
  EXPECT_TRUE(c.ok()) << c.status();
  return ReadsOf(*c);
}

// The byte model against the published sizes of each released shape (355B-A32B, 106B-A12B,
// 744B-A40B; the model cards): those totals leave out the MTP layer, and the active counts the
// embedding and the head. Totals within 1%, active counts within the cards' rounding to 1B.
TEST(SpecCeiling, CountsThePublishedSizes) {
  struct Case {
    const char* preset;
    double total, active;
  };
  for (const Case& k : {Case{"glm-4.5", 355e9, 32e9}, Case{"glm-4.5-air", 106e9, 12e9},
                        Case{"glm-5", 744e9, 40e9}}) {
    const ModelReads r = Reads(k.preset);
    const double total = r.total - r.mtp_total, active = r.Active() - r.head;
    std::printf(
        "%-12s total %.1fB (MTP layer %.2fB) active %.2fB + head %.2fB; expert %.1fM, "
        "top %ld of %ld in %ld layers; MTP pass %.2fB\n",
        k.preset, total / 1e9, r.mtp_total / 1e9, active / 1e9, r.head / 1e9, r.expert / 1e6,
        static_cast<long>(r.top_k), static_cast<long>(r.experts), static_cast<long>(r.moe_layers),
        r.mtp_every_pass / 1e9);
    EXPECT_NEAR(total / k.total, 1.0, 0.01) << k.preset;
    EXPECT_NEAR(active, k.active, 0.5e9) << k.preset;
  }
}

TEST(SpecCeiling, DistinctExperts) {
  EXPECT_DOUBLE_EQ(DistinctExperts(128, 8, 1), 8.0);
  EXPECT_NEAR(DistinctExperts(16, 4, 8), 16 * (1 - std::pow(0.75, 8)), 1e-12);  // 14.4
  EXPECT_DOUBLE_EQ(DistinctExperts(16, 16, 5), 16.0);  // every token takes every expert
  for (int t = 1; t < 64; ++t) {
    EXPECT_LT(DistinctExperts(160, 8, t), DistinctExperts(160, 8, t + 1));
    EXPECT_LE(DistinctExperts(160, 8, t + 1), 160.0);
  }
}

// Without routed experts a verify step reads what a one-token step reads: the ceiling is the
// acceptance over the MTP layer's share.
TEST(SpecCeiling, WithoutRoutedExpertsOnlyTheMtpPassCosts) {
  ModelReads r;
  r.every_step = 1000;
  r.mtp_every_pass = 100;
  r.layers = 4;
  EXPECT_DOUBLE_EQ(StepBytes(r, 4, 0), StepBytes(r, 1, 0));
  EXPECT_NEAR(CeilingSpeedup(r, 1, 2.0, 0), 2.0 / 1.1, 1e-12);
  EXPECT_NEAR(CeilingSpeedup(r, 3, 4.0, 0), 4.0 / 1.3, 1e-12);
  // A step reads every layer's cache once, whatever its tokens; an MTP pass its one layer's.
  // Where the cache dominates, k drafts cost k / layers of a step.
  r.kv_per_position_layer = 1;
  EXPECT_NEAR(CeilingSpeedup(r, 1, 2.0, int64_t{1} << 40), 2.0 * 4 / 5, 1e-6);
  EXPECT_NEAR(CeilingSpeedup(r, 3, 4.0, int64_t{1} << 40), 4.0 * 4 / 7, 1e-6);
}

// GLM-4.5-Air at batch 1: each drafted token adds nearly 8 experts per layer to the verify step.
TEST(SpecCeiling, RoutedExpertsMakeTheVerifyStepDear) {
  const ModelReads r = Reads("glm-4.5-air");
  const double verify = StepBytes(r, 2, 0) / StepBytes(r, 1, 0);
  EXPECT_GT(verify, 1.4);
  EXPECT_LT(verify, 1.6);
  // Even with every draft accepted, one draft cannot give 1.4x on these bytes.
  EXPECT_LT(CeilingSpeedup(r, 1, 2.0, 0), 1.4);
}

}  // namespace
}  // namespace glmserve::bench
