// The embedded default model's MTP layer (docs/mtp.md) against the independent reference
// (tools/make_goldens_kjv.py: tools/train_default_model.py's MtpLayer, the published formula):
// its logits on the golden prompt, and, on the CPU runner, the MTP cache layer and the step's
// checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/npy.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"
#include "nlohmann/json.hpp"
#include "tests/mtp_steps.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

const std::string kModel = testing::ModelDir("glm-4.5-kjv");
const std::string kGolden = testing::GoldenDir("kjv");

std::vector<int32_t> PromptIds() {
  std::ifstream f(kGolden + "/prompt.json");
  return nlohmann::json::parse(f)["ids"].get<std::vector<int32_t>>();
}

std::unique_ptr<ModelRunner> MtpRunner(CpuMath math = CpuMath::kExact) {
  absl::StatusOr<ModelWeights> w = LoadModel(kModel);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  EXPECT_TRUE(w->mtp.has_value()) << "the checkpoint stores model.layers.4.*";
  absl::StatusOr<std::unique_ptr<ModelRunner>> r =
      CreateModelRunner(*std::move(w), DeviceKind::kCpu, math);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  EXPECT_TRUE((*r)->has_mtp());
  EXPECT_TRUE((*r)->EnableMtp().ok());
  return *std::move(r);
}

// The model over the prompt, then the MTP layer over the pairs (ids[i + 1], h[i]).
std::vector<float> MtpLogits(ModelRunner& runner, const std::vector<int32_t>& ids) {
  return testing::RunModelThenMtp(runner, ids, /*model_logits=*/false).mtp_logits;
}

TEST(Glm45KjvMtp, LogitsMatchTheReference) {
  const std::vector<int32_t> ids = PromptIds();
  absl::StatusOr<NpyArray> ref = ReadNpy(kGolden + "/mtp_logits.npy");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto runner = MtpRunner();
  ASSERT_NE(runner, nullptr);
  const int64_t n = static_cast<int64_t>(ids.size());
  ASSERT_EQ(ref->shape, (std::vector<int64_t>{n - 1, runner->config().vocab_size}));
  const std::vector<float> logits = MtpLogits(*runner, ids);
  const double rel = testing::RelativeError(logits, ref->data);
  std::printf("glm-4.5-kjv MTP layer vs the reference: logits relative error %.3g\n", rel);
  EXPECT_LE(rel, 1e-5);
}

// Drafting position by position (one pair a step, the cache carrying the rest) gives the same
// logits bit for bit as the whole prompt at once: the MTP layer is batch-invariant like the
// model, so where a draft is computed never changes it.
TEST(Glm45KjvMtp, OneStepAtATimeEqualsAllAtOnce) {
  const std::vector<int32_t> ids = PromptIds();
  auto runner = MtpRunner(CpuMath::kBf16);
  ASSERT_NE(runner, nullptr);
  const std::vector<float> all = MtpLogits(*runner, ids);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t hidden = runner->config().hidden_size, vocab = runner->config().vocab_size;
  auto cache = runner->CreateCache((n + 15) / 16, 16);
  ASSERT_TRUE(cache.ok());
  BlockTable table;
  ASSERT_TRUE((*cache)->Reserve(&table, n).ok());
  for (int64_t i = 0; i + 1 < n; ++i) {
    ForwardBatch batch;
    batch.sequences = {{1, i, &table}};
    const std::vector<int32_t> tok = {ids[i]};
    batch.token_ids = tok;
    ForwardOptions options;
    options.return_head_input = true;
    ForwardResult main;
    ASSERT_TRUE(runner->Forward(batch, cache->get(), options, &main).ok());
    ForwardBatch mtp;
    mtp.sequences = {{1, i, &table}};
    const std::vector<int32_t> next = {ids[i + 1]};
    mtp.token_ids = next;
    mtp.hidden_in = main.head_input;
    ForwardOptions mtp_options;
    mtp_options.mtp = true;
    ForwardResult out;
    ASSERT_TRUE(runner->Forward(mtp, cache->get(), mtp_options, &out).ok());
    ASSERT_EQ(static_cast<int64_t>(out.logits.size()), vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      ASSERT_EQ(out.logits[v], all[i * vocab + v]) << "position " << i << " token " << v;
    }
    (void)hidden;
  }
}

TEST(Glm45KjvMtp, StepChecks) {
  auto runner = MtpRunner();
  ASSERT_NE(runner, nullptr);
  auto cache = runner->CreateCache(4, 16);
  ASSERT_TRUE(cache.ok());
  BlockTable table;
  ASSERT_TRUE((*cache)->Reserve(&table, 4).ok());
  const int64_t hidden = runner->config().hidden_size;
  ForwardBatch batch;
  batch.sequences = {{2, 0, &table}};
  const std::vector<int32_t> ids = {5, 6};
  batch.token_ids = ids;
  std::vector<float> h(hidden);  // one row short
  batch.hidden_in = h;
  ForwardOptions options;
  options.mtp = true;
  ForwardResult out;
  EXPECT_EQ(runner->Forward(batch, cache->get(), options, &out).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> h2(2 * hidden);
  batch.hidden_in = h2;
  const std::vector<int32_t> bad = {5, 1 << 30};
  batch.token_ids = bad;
  EXPECT_EQ(runner->Forward(batch, cache->get(), options, &out).code(),
            absl::StatusCode::kInvalidArgument);
  batch.token_ids = ids;
  options.layer_end = 2;
  EXPECT_EQ(runner->Forward(batch, cache->get(), options, &out).code(),
            absl::StatusCode::kInvalidArgument);
  options.layer_end = -1;
  EXPECT_TRUE(runner->Forward(batch, cache->get(), options, &out).ok());

  // A cache made before EnableMtp has no MTP layer: refused, not overrun.
  absl::StatusOr<ModelWeights> w = LoadModel(kModel);
  ASSERT_TRUE(w.ok());
  auto plain = CreateModelRunner(*std::move(w), DeviceKind::kCpu, CpuMath::kExact);
  ASSERT_TRUE(plain.ok());
  auto small = (*plain)->CreateCache(4, 16);
  ASSERT_TRUE(small.ok());
  BlockTable t2;
  ASSERT_TRUE((*small)->Reserve(&t2, 4).ok());
  batch.sequences = {{2, 0, &t2}};
  EXPECT_EQ((*plain)->Forward(batch, small->get(), options, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*plain)->EnableMtp().ok());
  EXPECT_EQ((*plain)->Forward(batch, small->get(), options, &out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Glm45KjvMtp, SpanAndMtpLessModelsRefuseIt) {
  absl::StatusOr<ModelWeights> span = LoadCheckpoint(kModel, {0, 2});
  ASSERT_TRUE(span.ok()) << span.status();
  EXPECT_FALSE(span->mtp.has_value());
  auto r = CreateModelRunner(*std::move(span), DeviceKind::kCpu, CpuMath::kExact);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->has_mtp());
  EXPECT_EQ((*r)->EnableMtp().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace glmserve
