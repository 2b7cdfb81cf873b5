// glm-run end to end: on a golden checkpoint it prints the reference's greedy continuation and
// writes the reference's logits and hidden states as .npy files; bad arguments fail cleanly.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/npy.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tests/tools/glm_run_process.h"

namespace glmserve {
namespace {

using testing::RunGlmRun;
using testing::RunResult;

// A GLM-4.5 and a GLM-5 (glm_moe_dsa) checkpoint.
class GlmRunGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GlmRunGoldenTest, ReproducesGoldenGreedyLogitsAndHiddenStates) {
  const std::string dir = testing::GoldenDir(GetParam());
  std::ifstream in(dir + "/expected.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(text.str());
  const auto prompt = expected["prompt"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy"].get<std::vector<int32_t>>();
  const std::string tmp = testing::MakeTempDir("glm_run_test");
  const RunResult r =
      RunGlmRun(absl::StrCat("--model=", dir, " --prompt=", absl::StrJoin(prompt, ","),
                             " --max_new_tokens=", greedy.size(), " --logits_out=", tmp,
                             "/logits.npy --hidden_out=", tmp, "/hidden.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("greedy    " + absl::StrJoin(greedy, ",")), std::string::npos)
      << r.output;
  absl::StatusOr<NpyArray> logits = ReadNpy(tmp + "/logits.npy");
  absl::StatusOr<NpyArray> ref = ReadNpy(dir + "/logits.npy");
  ASSERT_TRUE(logits.ok() && ref.ok());
  EXPECT_EQ(logits->shape, ref->shape);
  EXPECT_LT(testing::RelativeError(logits->data, ref->data), 1e-5);
  absl::StatusOr<NpyArray> hidden = ReadNpy(tmp + "/hidden.npy");
  absl::StatusOr<NpyArray> ref_hidden = ReadNpy(dir + "/hidden_states.npy");
  ASSERT_TRUE(hidden.ok() && ref_hidden.ok());
  EXPECT_EQ(hidden->shape, ref_hidden->shape);
  EXPECT_LT(testing::RelativeError(hidden->data, ref_hidden->data), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Goldens, GlmRunGoldenTest,
                         ::testing::Values("qknorm_bias_fp32", "glm5_fp32"));
// Every CPU math mode on the bf16 golden: each says which it ran and reproduces the
// reference's greedy tokens (the mode's logits tolerances are in tests/core/engine/golden_test.cc).
TEST(GlmRunTest, EveryCpuMathModeReproducesTheBf16GoldenGreedy) {
  const std::string dir = testing::GoldenDir("bf16");
  std::ifstream in(dir + "/expected.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(text.str());
  const auto prompt = expected["prompt"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy"].get<std::vector<int32_t>>();
  for (const std::string mode : {"exact", "bf16", "bf16_amx"}) {
    const RunResult r = RunGlmRun(absl::StrCat("--model=", dir, " --cpu_math=", mode,
                                               " --prompt=", absl::StrJoin(prompt, ","),
                                               " --max_new_tokens=", greedy.size()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("cpu math " + mode + ", kernel "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("greedy    " + absl::StrJoin(greedy, ",")), std::string::npos)
        << r.output;
  }
  // Int8 weights (tests/core/cpu/quantize_test.cc measures their accuracy) say so.
  const RunResult q8 = RunGlmRun(absl::StrCat(
      "--model=", dir, " --cpu_math=bf16 --weight_dtype=int8 --prompt=", absl::StrJoin(prompt, ","),
      " --max_new_tokens=", greedy.size()));
  ASSERT_EQ(q8.exit_code, 0) << q8.output;
  EXPECT_NE(q8.output.find("weights int8 (groups of 32, quantized at load from BF16)"),
            std::string::npos)
      << q8.output;
  EXPECT_NE(q8.output.find("greedy    " + absl::StrJoin(greedy, ",")), std::string::npos)
      << q8.output;
  // The int8 matrices run their own kernel in either bf16 mode: with bf16_amx the same
  // greedy tokens, and the compute string names both.
  const RunResult q8_amx =
      RunGlmRun(absl::StrCat("--model=", dir, " --cpu_math=bf16_amx --weight_dtype=int8 --prompt=",
                             absl::StrJoin(prompt, ","), " --max_new_tokens=", greedy.size()));
  ASSERT_EQ(q8_amx.exit_code, 0) << q8_amx.output;
  EXPECT_NE(q8_amx.output.find("cpu math bf16_amx"), std::string::npos) << q8_amx.output;
  EXPECT_NE(q8_amx.output.find("weights int8"), std::string::npos) << q8_amx.output;
  EXPECT_NE(q8_amx.output.find("greedy    " + absl::StrJoin(greedy, ",")), std::string::npos)
      << q8_amx.output;
  const RunResult q8_exact = RunGlmRun("--model=tiny --weight_dtype=int8");
  EXPECT_NE(q8_exact.exit_code, 0);
  EXPECT_NE(q8_exact.output.find("pass --cpu_math=bf16"), std::string::npos) << q8_exact.output;
  const RunResult bad = RunGlmRun("--model=tiny --cpu_math=fp64");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("is not one of exact, bf16"), std::string::npos) << bad.output;
}

// --kv_cache_dtype=fp8_e4m3: the bf16 golden's greedy tokens survive the FP8 KV cache (8 of 8,
// docs/kv_cache.md), the run says so, and GLM-5 and unknown values are refused by name.
TEST(GlmRunTest, Fp8KvCacheFlag) {
  const std::string dir = testing::GoldenDir("bf16");
  std::ifstream in(dir + "/expected.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(text.str());
  const auto prompt = expected["prompt"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy"].get<std::vector<int32_t>>();
  const RunResult r = RunGlmRun(absl::StrCat("--model=", dir, " --kv_cache_dtype=fp8_e4m3",
                                             " --prompt=", absl::StrJoin(prompt, ","),
                                             " --max_new_tokens=", greedy.size()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kv cache  fp8_e4m3, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("greedy    " + absl::StrJoin(greedy, ",")), std::string::npos)
      << r.output;
  const RunResult glm5 = RunGlmRun("--model=tiny-glm5 --kv_cache_dtype=fp8_e4m3");
  EXPECT_NE(glm5.exit_code, 0);
  EXPECT_NE(glm5.output.find("GLM-5's latent cache"), std::string::npos) << glm5.output;
  const RunResult bad = RunGlmRun("--model=tiny --kv_cache_dtype=fp16");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("is not one of auto, fp32, bf16, fp8_e4m3"), std::string::npos)
      << bad.output;
}

// The kv cache line names the format auto chose: bf16 in --cpu_math=bf16 on bf16 weights (whose
// attention rounds K and V to bf16 anyway: the same greedy tokens as an fp32 cache), fp32 in the
// exact mode.
TEST(GlmRunTest, KvCacheLineNamesTheFormatAutoChose) {
  const std::string dir = testing::GoldenDir("bf16");
  const std::string run = absl::StrCat("--model=", dir, " --prompt=1,2,3,4,5 --max_new_tokens=6");
  const RunResult bf16 = RunGlmRun(run + " --cpu_math=bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("kv cache  bf16, "), std::string::npos) << bf16.output;
  const RunResult fp32 = RunGlmRun(run + " --cpu_math=bf16 --kv_cache_dtype=fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_NE(fp32.output.find("kv cache  fp32, "), std::string::npos) << fp32.output;
  const auto greedy = [](const std::string& out) {
    const size_t at = out.find("greedy    ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_FALSE(greedy(bf16.output).empty()) << bf16.output;
  EXPECT_EQ(greedy(bf16.output), greedy(fp32.output));
  const RunResult exact = RunGlmRun(run);
  ASSERT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_NE(exact.output.find("kv cache  fp32, "), std::string::npos) << exact.output;
}

// --save writes a checkpoint from a preset that loads back to the same model: the same
// greedy tokens and the same logits, bit for bit.
TEST(GlmRunTest, SaveWritesACheckpointThatRunsLikeThePreset) {
  const std::string tmp = testing::MakeTempDir("glm_run_save");
  const RunResult saved = RunGlmRun(absl::StrCat("--model=tiny --seed=5 --save=", tmp, "/ckpt"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_NE(saved.output.find("saved     tiny"), std::string::npos) << saved.output;
  const std::string args = " --prompt=3,1,4,1,5 --max_new_tokens=6 --logits_out=" + tmp;
  const RunResult preset = RunGlmRun("--model=tiny --seed=5" + args + "/a.npy");
  const RunResult loaded = RunGlmRun("--model=" + tmp + "/ckpt" + args + "/b.npy");
  ASSERT_EQ(preset.exit_code, 0) << preset.output;
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  const size_t at = preset.output.find("greedy    ");
  ASSERT_NE(at, std::string::npos) << preset.output;
  const std::string greedy = preset.output.substr(at, preset.output.find('\n', at) - at);
  EXPECT_NE(loaded.output.find(greedy), std::string::npos) << loaded.output;
  absl::StatusOr<NpyArray> a = ReadNpy(tmp + "/a.npy");
  absl::StatusOr<NpyArray> b = ReadNpy(tmp + "/b.npy");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data, b->data);
  const RunResult bad = RunGlmRun("--model=tiny --save=/proc/no/such/dir");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
}

TEST(GlmRunTest, BadArgumentsFailWithAMessage) {
  RunResult r = RunGlmRun("--model=tiny --prompt=1,x,3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a token id"), std::string::npos) << r.output;
  r = RunGlmRun("--model=tiny --prompt=1,999");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("outside the vocabulary"), std::string::npos) << r.output;
  r = RunGlmRun("--model=/no/such/dir");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/no/such/dir"), std::string::npos) << r.output;
}

// --perplexity scores a text file with the checkpoint's own tokenizer: on the embedded default
// model and its held-out text it prints Transformers' perplexity (tests/golden/kjv), in every
// weight form the flag takes; a model without a tokenizer and a window under 2 are refused.
TEST(GlmRunTest, PerplexityOfTheDefaultModelIsTransformers) {
  std::ifstream in(testing::GoldenDir("kjv/perplexity.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string model = testing::ModelDir("glm-4.5-kjv");
  const std::string text = testing::GoldenDir("kjv/heldout.txt");
  const RunResult r = RunGlmRun(absl::StrCat("--model=", model, " --perplexity=", text));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("perplexity ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double ppl = std::stod(r.output.substr(at + 11));
  EXPECT_NEAR(ppl, ref["perplexity"].get<double>(), 1e-4 * ref["perplexity"].get<double>());
  EXPECT_NE(
      r.output.find(absl::StrCat("over ", ref["predicted"].get<int64_t>(), " predicted tokens")),
      std::string::npos)
      << r.output;
  const RunResult fp8 =
      RunGlmRun(absl::StrCat("--model=", model, " --weight_dtype=fp8_block --perplexity=", text));
  EXPECT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find("(F8_E4M3)"), std::string::npos) << fp8.output;

  const RunResult no_tokenizer = RunGlmRun(absl::StrCat("--model=tiny --perplexity=", text));
  EXPECT_NE(no_tokenizer.exit_code, 0);
  EXPECT_NE(no_tokenizer.output.find("needs the checkpoint's tokenizer.json"), std::string::npos)
      << no_tokenizer.output;
  const RunResult bad_window =
      RunGlmRun(absl::StrCat("--model=", model, " --perplexity=", text, " --perplexity_window=1"));
  EXPECT_NE(bad_window.exit_code, 0);
  EXPECT_NE(bad_window.output.find("window must be >= 2"), std::string::npos) << bad_window.output;
}

}  // namespace
}  // namespace glmserve
