// Tensor parallel on the trained default model (docs/parallel.md) against Transformers itself:
// a group of CPU ranks (TP 2 and 4; experts whole per rank or width-split; 2 KV heads, so TP 4
// replicates each on two ranks) must give Transformers' greedy reply and its held-out
// perplexity, as one rank does (tests/models/glm45_kjv_test.cc), and one rank's perplexity to
// within the reordering of fp32 sums.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/engine/runner_factory.h"
#include "core/engine/scoring.h"
#include "core/model/checkpoint.h"
#include "core/text/text_assets.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace glmserve {
namespace {

const std::string kModel = testing::ModelDir("glm-4.5-kjv");
const std::string kGolden = testing::GoldenDir("kjv");
constexpr int64_t kWindow = 256;  // tools/make_goldens_kjv.py's WINDOW

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

std::vector<int32_t> HeldOutIds() {
  absl::StatusOr<TextAssets> assets = LoadTextAssets(kModel);
  EXPECT_TRUE(assets.ok() && assets->tokenizer != nullptr);
  std::ifstream f(kGolden + "/heldout.txt", std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  absl::StatusOr<std::vector<int32_t>> ids = assets->tokenizer->Encode(text.str());
  EXPECT_TRUE(ids.ok()) << ids.status();
  return *ids;
}

std::unique_ptr<ModelRunner> Group(int tp, bool expert_parallel) {
  absl::StatusOr<ModelWeights> w = LoadModel(kModel);
  EXPECT_TRUE(w.ok()) << w.status();
  ParallelConfig parallel;
  parallel.tensor_parallel = tp;
  parallel.expert_parallel = expert_parallel;
  auto runner = CreateCpuTensorParallelRunner(*std::move(w), parallel, CpuMath::kExact, 1);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

TEST(Glm45KjvTensorParallel, GreedyReplyAndPerplexityMatchTransformers) {
  const nlohmann::json prompt = ReadJson(kGolden + "/prompt.json");
  const nlohmann::json ppl = ReadJson(kGolden + "/perplexity.json");
  const std::vector<int32_t> expected = prompt["greedy_64"].get<std::vector<int32_t>>();
  const std::vector<int32_t> held = HeldOutIds();
  const double reference = ppl["perplexity"].get<double>();
  absl::StatusOr<ModelWeights> whole = LoadModel(kModel);
  ASSERT_TRUE(whole.ok());
  auto one = CreateModelRunner(*std::move(whole), DeviceKind::kCpu, CpuMath::kExact);
  ASSERT_TRUE(one.ok());
  absl::StatusOr<TokenScores> one_score = ScoreTokens(**one, held, kWindow);
  ASSERT_TRUE(one_score.ok());
  struct Layout {
    int tp;
    bool ep;
  };
  for (const Layout l : {Layout{2, true}, Layout{2, false}, Layout{4, true}, Layout{4, false}}) {
    auto runner = Group(l.tp, l.ep);
    ASSERT_NE(runner, nullptr);
    absl::StatusOr<std::vector<int32_t>> got = GreedyTokens(
        *runner, prompt["ids"].get<std::vector<int32_t>>(), static_cast<int64_t>(expected.size()));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, expected) << "TP " << l.tp;
    absl::StatusOr<TokenScores> s = ScoreTokens(*runner, held, kWindow);
    ASSERT_TRUE(s.ok()) << s.status();
    std::printf("TP %d %s: held-out perplexity %.6f (one rank %.6f, Transformers %.6f)\n", l.tp,
                l.ep ? "EP" : "width-split", s->perplexity(), one_score->perplexity(), reference);
    EXPECT_NEAR(s->perplexity(), reference, 1e-4 * reference);
    EXPECT_NEAR(s->perplexity(), one_score->perplexity(), 1e-5 * reference);
    EXPECT_EQ(s->argmax, one_score->argmax);
  }
}

}  // namespace
}  // namespace glmserve
