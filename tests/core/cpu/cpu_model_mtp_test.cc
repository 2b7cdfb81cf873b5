// The CPU runner's MTP-layer step (core/cpu/cpu_model_mtp.cc) against the independent reference
// of tools/make_goldens_mtp.py (the published formula with Transformers' own decoder layer,
// RoPE, mask and head): GLM-4.5 and GLM-5 shapes, fp32 and block-scaled FP8 checkpoints, a
// stored shared_head.head and the model's own head, GLM-5's MTP layer with its own indexer.
// (The trained default model's layer: tests/models/glm45_kjv_mtp_test.cc.)
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/npy.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/mtp_steps.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

class MtpGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MtpGoldenTest, ModelAndMtpLogitsMatchTheReference) {
  const std::string dir = testing::GoldenDir(GetParam());
  std::ifstream f(dir + "/mtp.json");
  ASSERT_TRUE(f.good()) << dir;
  const std::vector<int32_t> ids = nlohmann::json::parse(f)["prompt"].get<std::vector<int32_t>>();
  absl::StatusOr<NpyArray> want_logits = ReadNpy(dir + "/logits.npy");
  absl::StatusOr<NpyArray> want_mtp = ReadNpy(dir + "/mtp_logits.npy");
  ASSERT_TRUE(want_logits.ok() && want_mtp.ok());

  absl::StatusOr<ModelWeights> w = LoadCheckpoint(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->mtp.has_value());
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(*std::move(w), DeviceKind::kCpu, CpuMath::kExact);
  ASSERT_TRUE(r.ok()) << r.status();
  ModelRunner& runner = **r;
  ASSERT_TRUE(runner.EnableMtp().ok());
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = runner.config().vocab_size;
  ASSERT_EQ(want_mtp->shape, (std::vector<int64_t>{n - 1, vocab}));

  const testing::MtpPass pass = testing::RunModelThenMtp(runner, ids, /*model_logits=*/true);
  const double main_rel = testing::RelativeError(pass.model_logits, want_logits->data);
  const double mtp_rel = testing::RelativeError(pass.mtp_logits, want_mtp->data);
  std::printf("%s: model logits relative error %.3g, MTP logits %.3g\n", GetParam(), main_rel,
              mtp_rel);
  EXPECT_LE(main_rel, 1e-5);
  EXPECT_LE(mtp_rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Goldens, MtpGoldenTest,
                         ::testing::Values("mtp_glm45_fp32", "mtp_glm45_fp8_block", "mtp_glm5_fp32",
                                           "mtp_glm5_fp8_block"));

}  // namespace
}  // namespace glmserve
