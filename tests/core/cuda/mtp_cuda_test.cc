// The MTP layer on the CUDA runner (core/cuda/model_mtp.cc, docs/mtp.md): its logits against
// the independent references (tools/make_goldens_mtp.py for GLM-4.5 and GLM-5 shapes, fp32 and
// block FP8; the trained default model's layer), within the bf16 activations' bound the CUDA
// runner's golden tests use; and speculative decoding through the engine on it, held to the
// device's contract (engine_kv_fp8_cuda_test.cc): bit-identical under the emulation, equal
// greedy tokens and logprobs within 1e-2 on a GPU, whose cuBLAS picks algorithms by shape.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/npy.h"
#include "core/cuda/model.h"
#include "core/engine/engine.h"
#include "core/model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/core/engine/engine_harness.h"
#include "tests/mtp_steps.h"
#include "tests/test_util.h"

namespace glmserve::cuda {
namespace {

using ::glmserve::testing::Emulated;
using ::glmserve::testing::Outcome;

// bf16 activations with fp32 accumulation against fp32 references (golden_test.cc's bound for
// the CUDA runner's logits).
constexpr double kBf16Bound = 3e-2;

std::unique_ptr<CudaModel> Model(const std::string& dir) {
  absl::StatusOr<ModelWeights> w = LoadModel(dir);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(*std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// The model over `ids` with head inputs, then the MTP layer over (ids[i + 1], h[i]).
std::vector<float> MtpLogits(CudaModel& model, const std::vector<int32_t>& ids,
                             std::vector<float>* main_logits) {
  ::glmserve::testing::MtpPass pass =
      ::glmserve::testing::RunModelThenMtp(model, ids, /*model_logits=*/true,
                                           /*mtp_head_input=*/true);
  *main_logits = std::move(pass.model_logits);
  return std::move(pass.mtp_logits);
}

class MtpCudaGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MtpCudaGoldenTest, LogitsWithinTheBf16BoundOfTheReference) {
  GLM_REQUIRE_CUDA_DEVICE();
  const std::string dir = ::glmserve::testing::GoldenDir(GetParam());
  std::ifstream f(dir + "/mtp.json");
  ASSERT_TRUE(f.good()) << dir;
  const std::vector<int32_t> ids = nlohmann::json::parse(f)["prompt"].get<std::vector<int32_t>>();
  absl::StatusOr<NpyArray> want_logits = ReadNpy(dir + "/logits.npy");
  absl::StatusOr<NpyArray> want_mtp = ReadNpy(dir + "/mtp_logits.npy");
  ASSERT_TRUE(want_logits.ok() && want_mtp.ok());
  std::unique_ptr<CudaModel> model = Model(dir);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->has_mtp());
  ASSERT_TRUE(model->EnableMtp().ok());
  std::vector<float> main;
  const std::vector<float> mtp = MtpLogits(*model, ids, &main);
  const double main_rel = ::glmserve::testing::RelativeError(main, want_logits->data);
  const double mtp_rel = ::glmserve::testing::RelativeError(mtp, want_mtp->data);
  std::printf("%s on CUDA: model logits relative error %.3g, MTP logits %.3g\n", GetParam(),
              main_rel, mtp_rel);
  EXPECT_LE(main_rel, kBf16Bound);
  EXPECT_LE(mtp_rel, kBf16Bound);
}

INSTANTIATE_TEST_SUITE_P(Goldens, MtpCudaGoldenTest,
                         ::testing::Values("mtp_glm45_fp32", "mtp_glm45_fp8_block", "mtp_glm5_fp32",
                                           "mtp_glm5_fp8_block"));

TEST(MtpCuda, TrainedLayerAndRefusals) {
  GLM_REQUIRE_CUDA_DEVICE();
  const std::string kjv = ::glmserve::testing::ModelDir("glm-4.5-kjv");
  std::ifstream f(::glmserve::testing::GoldenDir("kjv") + "/prompt.json");
  const std::vector<int32_t> ids = nlohmann::json::parse(f)["ids"].get<std::vector<int32_t>>();
  absl::StatusOr<NpyArray> want =
      ReadNpy(::glmserve::testing::GoldenDir("kjv") + "/mtp_logits.npy");
  ASSERT_TRUE(want.ok());
  std::unique_ptr<CudaModel> model = Model(kjv);
  ASSERT_NE(model, nullptr);
  // Before EnableMtp: caches have no MTP layer and the step is refused.
  auto plain = model->CreateCache(2, 16);
  ASSERT_TRUE(plain.ok());
  BlockTable table;
  ASSERT_TRUE((*plain)->Reserve(&table, 4).ok());
  ForwardBatch batch;
  batch.sequences = {{2, 0, &table}};
  const std::vector<int32_t> two = {5, 6};
  const std::vector<float> h(2 * model->config().hidden_size, 0.5f);
  batch.token_ids = two;
  batch.hidden_in = h;
  ForwardOptions options;
  options.mtp = true;
  ForwardResult out;
  EXPECT_EQ(model->Forward(batch, plain->get(), options, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->EnableMtp().ok());
  EXPECT_EQ(model->Forward(batch, plain->get(), options, &out).code(),
            absl::StatusCode::kInvalidArgument);  // the old cache lacks the layer
  std::vector<float> main;
  const double rel = ::glmserve::testing::RelativeError(MtpLogits(*model, ids, &main), want->data);
  std::printf("glm-4.5-kjv MTP layer on CUDA vs the reference: relative error %.3g\n", rel);
  EXPECT_LE(rel, kBf16Bound);
  // A span has none.
  absl::StatusOr<ModelWeights> span = LoadCheckpoint(kjv, {0, 2});
  ASSERT_TRUE(span.ok());
  absl::StatusOr<std::unique_ptr<CudaModel>> s = CudaModel::Create(*std::move(span));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->has_mtp());
  EXPECT_EQ((*s)->EnableMtp().code(), absl::StatusCode::kFailedPrecondition);
}

// Speculation through the engine on the CUDA runner: the trained model, k = 2, two greedy
// requests together (one continuing the model's own greedy text, whose drafts are accepted, one
// on arbitrary ids, whose drafts are mostly rejected), against the same without drafts. Short:
// the emulation runs about a token per second.
TEST(MtpCuda, SpeculativeDecodingKeepsTheOutput) {
  GLM_REQUIRE_CUDA_DEVICE();
  const std::string kjv = ::glmserve::testing::ModelDir("glm-4.5-kjv");
  std::ifstream f(::glmserve::testing::GoldenDir("kjv") + "/prompt.json");
  const std::vector<int32_t> greedy =
      nlohmann::json::parse(f)["greedy_64"].get<std::vector<int32_t>>();
  const auto run = [&](int32_t k) {
    return ::glmserve::testing::RunDraftedPair(Model(kjv), k, greedy, 10, "CUDA");
  };
  const std::vector<Outcome> plain = run(0), spec = run(2);
  for (int key = 0; key < 2; ++key) {
    if (Emulated()) {
      EXPECT_TRUE(spec[key] == plain[key]) << "request " << key << ": not bit-identical";
      continue;
    }
    EXPECT_EQ(spec[key].tokens, plain[key].tokens) << "request " << key;
    ASSERT_EQ(spec[key].logprobs.size(), plain[key].logprobs.size());
    for (size_t i = 0; i < plain[key].logprobs.size(); ++i) {
      EXPECT_NEAR(spec[key].logprobs[i], plain[key].logprobs[i], 1e-2) << key << " " << i;
    }
  }
}

}  // namespace
}  // namespace glmserve::cuda
