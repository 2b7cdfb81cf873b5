// The embedded default model on the CUDA runner (a GPU, or tools/cuda_emu's emulated device)
// against the CPU's exact mode: perplexity on held-out text and greedy agreement on text the
// exact mode generated (docs/quality.md). The emulation is slow, so one 256-token window and
// 96 generated tokens; a GPU run (tools/gpu_bundle.sh) takes the same bounds.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/engine/runner_factory.h"
#include "core/engine/scoring.h"
#include "core/model/checkpoint.h"
#include "core/text/text_assets.h"
#include "tests/core/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

const std::string kModel = testing::ModelDir("glm-4.5-kjv");

std::unique_ptr<ModelRunner> Runner(DeviceKind device) {
  absl::StatusOr<ModelWeights> w = LoadModel(kModel);
  EXPECT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = CreateModelRunner(*std::move(w), device);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

TEST(Glm45KjvCuda, PerplexityAndGreedyAgreementWithinBoundsOfExact) {
  GLM_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<TextAssets> assets = LoadTextAssets(kModel);
  ASSERT_TRUE(assets.ok() && assets->tokenizer != nullptr);
  std::ifstream f(testing::GoldenDir("kjv/heldout.txt"), std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  absl::StatusOr<std::vector<int32_t>> held = assets->tokenizer->Encode(text.str());
  ASSERT_TRUE(held.ok() && held->size() >= 256);
  const std::vector<int32_t> window(held->begin(), held->begin() + 256);

  auto exact = Runner(DeviceKind::kCpu);
  auto cuda = Runner(DeviceKind::kCuda);
  ASSERT_NE(exact, nullptr);
  ASSERT_NE(cuda, nullptr);
  absl::StatusOr<TokenScores> ref = ScoreTokens(*exact, window, 256);
  absl::StatusOr<TokenScores> got = ScoreTokens(*cuda, window, 256);
  ASSERT_TRUE(ref.ok() && got.ok()) << got.status();
  const double increase = got->perplexity() / ref->perplexity() - 1;

  std::vector<int32_t> seq(held->begin() + 256, held->begin() + 288);
  absl::StatusOr<std::vector<int32_t>> greedy = GreedyTokens(*exact, seq, 96);
  ASSERT_TRUE(greedy.ok());
  seq.insert(seq.end(), greedy->begin(), greedy->end());
  absl::StatusOr<TokenScores> forced = ScoreTokens(*cuda, seq, 1 << 20);
  ASSERT_TRUE(forced.ok()) << forced.status();
  int agree = 0;
  for (size_t i = 31; i + 1 < seq.size(); ++i) agree += forced->argmax[i] == seq[i + 1];
  std::printf("cuda vs exact: perplexity %.4f vs %.4f (%+.3f%%), greedy agreement %d/96\n",
              got->perplexity(), ref->perplexity(), 100 * increase, agree);
  // The CUDA runner computes in bf16 activations with fp32 accumulation (docs/cuda.md): the
  // cost of the CPU's bf16 mode, with room for a different accumulation order.
  EXPECT_LE(std::fabs(increase), 0.005);
  EXPECT_GE(agree, 90);
}

}  // namespace
}  // namespace glmserve
