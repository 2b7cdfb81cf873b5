// Speculative decoding with the MTP layer (core/engine/speculation.cc, docs/mtp.md): the
// output is the output without it, token for token and logprob for logprob, greedy and
// sampled, under concurrency, chunked prefill, preemption, prefix hits, stops and limits; the
// trained default model's drafts are accepted; bad settings are refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu/cpu_model.h"
#include "core/cpu/quantize.h"
#include "core/engine/engine.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "core/text/text_assets.h"
#include "tests/core/engine/engine_harness.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Collector;
using testing::ExpectAllBlocksFree;
using testing::Outcome;

const std::string kModel = testing::ModelDir("glm-4.5-kjv");

// The trained default model (its MTP layer was trained: drafts get accepted), the same made
// FP8 at load (128x128 blocks, as GLM-5-FP8), or the tiny GLM-4.5 and GLM-5 presets with random
// weights and a random MTP layer (drafts almost never accepted: every step rolls back; GLM-5's
// MTP layer keeps its own indexer and latent cache layer).
// kKjvTp2: the trained model on a tensor-parallel group of two CPU ranks (docs/parallel.md),
// its MTP layer sliced like every layer.
enum class Model { kKjv, kRandomTiny, kRandomGlm5, kKjvFp8, kKjvTp2 };

std::unique_ptr<ModelRunner> MakeModel(Model model) {
  if (model == Model::kKjv || model == Model::kKjvFp8 || model == Model::kKjvTp2) {
    absl::StatusOr<ModelWeights> w = LoadModel(kModel);
    EXPECT_TRUE(w.ok()) << w.status();
    if (model == Model::kKjvTp2) {
      ParallelConfig parallel;
      parallel.tensor_parallel = 2;
      auto group = CreateCpuTensorParallelRunner(*std::move(w), parallel, CpuMath::kBf16, 1);
      EXPECT_TRUE(group.ok()) << group.status();
      return *std::move(group);
    }
    if (model == Model::kKjvFp8) {  // the MTP layer's matrices too, as FP8 checkpoints have them
      EXPECT_TRUE(QuantizeWeights(&*w, WeightQuant::kFp8Block).ok());
      EXPECT_EQ(w->mtp->layer.moe.experts[0].gate.format, WeightFormat::kFp8Scaled);
      return std::make_unique<CpuModel>(*std::move(w), CpuMath::kExact);
    }
    return std::make_unique<CpuModel>(*std::move(w), CpuMath::kBf16);
  }
  absl::StatusOr<ModelConfig> config =
      PresetConfig(model == Model::kRandomGlm5 ? "tiny-glm5" : "tiny");
  EXPECT_TRUE(config.ok());
  config->max_position_embeddings = 512;
  config->num_nextn_predict_layers = 1;
  RandomWeightOptions options;
  options.seed = 7;
  options.stddev = 0.1;
  options.mtp = true;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options);
  EXPECT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->mtp.has_value());
  return std::make_unique<CpuModel>(*std::move(w), CpuMath::kExact);
}

std::unique_ptr<Engine> MakeEngine(Model model, int32_t draft_tokens, EngineOptions options = {}) {
  options.check_invariants = true;
  options.mtp_draft_tokens = draft_tokens;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(MakeModel(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

// Prompts of real text for the trained model: windows of the held-out chapters.
std::vector<int32_t> HeldOutIds() {
  absl::StatusOr<TextAssets> assets = LoadTextAssets(kModel);
  EXPECT_TRUE(assets.ok() && assets->tokenizer != nullptr);
  std::ifstream f(testing::GoldenDir("kjv") + "/heldout.txt", std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  absl::StatusOr<std::vector<int32_t>> ids = assets->tokenizer->Encode(text.str());
  EXPECT_TRUE(ids.ok());
  return *ids;
}

GenerateRequest Request(Model model, int key, int max_new, bool sample) {
  GenerateRequest g = testing::MakeGenerate(key, 4 + key % 29, max_new, sample);
  if (model != Model::kRandomTiny && model != Model::kRandomGlm5) {
    static const std::vector<int32_t> held = HeldOutIds();
    const size_t at = static_cast<size_t>(key) * 97 % (held.size() - 64);
    g.prompt.assign(held.begin() + at, held.begin() + at + 8 + key % 33);
  }
  return g;
}

Outcome Plain(Model model, GenerateRequest g, EngineOptions options = {}) {
  g.mtp_draft_tokens = 0;
  return testing::RunAlone([&](EngineOptions o) { return MakeEngine(model, 0, o); }, g, options);
}

struct Case {
  Model model;
  int32_t k;
};

class SpeculationTest : public ::testing::TestWithParam<Case> {};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kNames[] = {"Kjv", "RandomTiny", "RandomGlm5", "KjvFp8", "KjvTp2"};
  return std::string(kNames[static_cast<int>(info.param.model)]) + "K" +
         std::to_string(info.param.k);
}

TEST_P(SpeculationTest, ConcurrentOutputsEqualPlainDecoding) {
  const Case p = GetParam();
  EngineOptions options;
  options.max_batch_tokens = 48;  // prompts in chunks, drafts fighting for room
  options.max_running = 12;
  options.mtp_max_batch = 0;  // drafts at every batch size
  std::unique_ptr<Engine> engine = MakeEngine(p.model, p.k, options);
  Collector c;
  std::vector<GenerateRequest> requests;
  constexpr int kRequests = 16;
  for (int key = 0; key < kRequests; ++key) {
    requests.push_back(Request(p.model, key, 12 + key % 21, /*sample=*/key % 2 == 1));
    ASSERT_TRUE(engine->Submit({requests.back()}, c.For(key)).ok());
  }
  c.Wait(kRequests);
  for (int key = 0; key < kRequests; ++key) {
    const Outcome& got = c.outcomes()[key];
    EXPECT_TRUE(got.finish.status.ok()) << got.finish.status;
    EXPECT_EQ(static_cast<int>(got.tokens.size()), requests[key].stop.max_new_tokens);
    EXPECT_TRUE(got == Plain(p.model, requests[key])) << "request " << key;
  }
  ExpectAllBlocksFree(*engine);
  const EngineStats s = engine->Stats();
  EXPECT_GT(s.spec_verify_steps, 0);
  EXPECT_GT(s.spec_draft_tokens, 0);
  int64_t steps = 0, gained = 0;
  for (size_t n = 0; n < s.spec_acceptance_lengths.size(); ++n) {
    steps += s.spec_acceptance_lengths[n];
    gained += static_cast<int64_t>(n) * s.spec_acceptance_lengths[n];
  }
  EXPECT_EQ(steps, s.spec_verify_steps);
  EXPECT_EQ(gained, s.spec_verify_steps + s.spec_accepted_tokens);
  const double mean = static_cast<double>(gained) / static_cast<double>(steps);
  std::printf(
      "k=%d: %lld verify steps, %lld of %lld drafts accepted, mean acceptance length %.3f\n", p.k,
      static_cast<long long>(steps), static_cast<long long>(s.spec_accepted_tokens),
      static_cast<long long>(s.spec_draft_tokens), mean);
  // The trained MTP layer's drafts are accepted (half greedy, half sampled requests here;
  // bench/mtp_bench measures the greedy figures); random drafts almost never.
  if (p.model != Model::kRandomTiny && p.model != Model::kRandomGlm5) {
    EXPECT_GT(mean, 1.3);
  }
}

TEST_P(SpeculationTest, PreemptionAndPrefixHitsKeepTheOutput) {
  const Case p = GetParam();
  testing::EngineScenario t;
  t.make = [&](EngineOptions options) { return MakeEngine(p.model, p.k, options); };
  t.expect_same = [&](const Outcome& got, const Outcome& want, bool, const std::string& what) {
    EXPECT_TRUE(got == want) << what << ": not bit-identical";
  };
  testing::PreemptionScenario(t);
  testing::PrefixHitScenario(t);
}

TEST_P(SpeculationTest, ChunkedPrefillEqualsPlain) {
  const Case p = GetParam();
  const GenerateRequest g = Request(p.model, 5, 20, /*sample=*/true);
  const Outcome reference = Plain(p.model, g);
  for (int64_t budget : {1, 3, 7, 64}) {
    EngineOptions options;
    options.max_batch_tokens = budget;
    EXPECT_TRUE(testing::RunAlone([&](EngineOptions o) { return MakeEngine(p.model, p.k, o); }, g,
                                  options) == reference)
        << "budget " << budget;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculationTest,
                         ::testing::Values(Case{Model::kKjv, 1}, Case{Model::kKjv, 2},
                                           Case{Model::kKjv, 3}, Case{Model::kRandomTiny, 2},
                                           Case{Model::kRandomGlm5, 2}, Case{Model::kKjvFp8, 2},
                                           Case{Model::kKjvTp2, 2}),
                         CaseName);

// A verify step that could emit more than the request may: max_new_tokens and a stop token
// reached inside a run of accepted drafts end the output exactly where plain decoding does.
TEST(SpeculationLimits, StopsAndLengthsInsideAcceptedRuns) {
  std::unique_ptr<Engine> engine = MakeEngine(Model::kKjv, 3);
  GenerateRequest g = Request(Model::kKjv, 2, 24, /*sample=*/false);
  const Outcome full = Plain(Model::kKjv, g);
  ASSERT_EQ(full.tokens.size(), 24u);
  for (int max_new = 1; max_new <= 6; ++max_new) {
    GenerateRequest short_g = g;
    short_g.stop.max_new_tokens = max_new;
    Collector c;
    ASSERT_TRUE(engine->Submit({short_g}, c.For(0)).ok());
    c.Wait(1);
    EXPECT_EQ(c[0].finish.reason, FinishReason::kLength);
    EXPECT_EQ(c[0].tokens,
              std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + max_new));
  }
  for (int at : {3, 9, 17}) {
    GenerateRequest stop_g = g;
    stop_g.stop.stop_token_ids = {full.tokens[static_cast<size_t>(at)]};
    const Outcome want = Plain(Model::kKjv, stop_g);
    Collector c;
    ASSERT_TRUE(engine->Submit({stop_g}, c.For(0)).ok());
    c.Wait(1);
    EXPECT_EQ(c[0].finish.reason, FinishReason::kStop);
    EXPECT_TRUE(c[0] == want) << "stop at " << at;
  }
  // Forced tokens (tool_choice): emitted as forced, the drafts verified against them.
  GenerateRequest forced = g;
  forced.forced.tokens = {full.tokens[4], full.tokens[3], full.tokens[2]};
  forced.forced.after_token = full.tokens[1];
  Collector c;
  ASSERT_TRUE(engine->Submit({forced}, c.For(0)).ok());
  c.Wait(1);
  EXPECT_TRUE(c[0] == Plain(Model::kKjv, forced));
  ExpectAllBlocksFree(*engine);
}

// Steps with more decoding sequences than mtp_max_batch draft nothing (and skip the MTP layer);
// drafting resumes as the batch shrinks. Outputs stay the plain ones throughout.
TEST(SpeculationLimits, BusyStepsPauseDrafting) {
  std::vector<GenerateRequest> requests;
  for (int key = 0; key < 8; ++key) {
    requests.push_back(Request(Model::kKjv, key, 8 + 4 * key, /*sample=*/false));
  }
  int64_t verify_steps[2] = {0, 0};
  for (int64_t limit : {int64_t{0}, int64_t{2}}) {
    EngineOptions options;
    options.mtp_max_batch = limit;
    std::unique_ptr<Engine> engine = MakeEngine(Model::kKjv, 1, options);
    Collector c;
    for (int key = 0; key < 8; ++key) ASSERT_TRUE(engine->Submit({requests[key]}, c.For(key)).ok());
    c.Wait(8);
    for (int key = 0; key < 8; ++key) {
      EXPECT_TRUE(c[key] == Plain(Model::kKjv, requests[key])) << "limit " << limit << " " << key;
    }
    ExpectAllBlocksFree(*engine);
    verify_steps[limit == 0 ? 0 : 1] = engine->Stats().spec_verify_steps;
  }
  EXPECT_GT(verify_steps[1], 0);                // the last two streams drafted
  EXPECT_LT(verify_steps[1], verify_steps[0]);  // the busy steps did not
}

TEST(SpeculationLimits, PerRequestSettingAndRefusals) {
  // A request may turn it off (or choose k) on a server that runs it: same output.
  std::unique_ptr<Engine> engine = MakeEngine(Model::kKjv, 1);
  GenerateRequest g = Request(Model::kKjv, 7, 16, /*sample=*/false);
  for (int32_t k : {0, 2, kMaxMtpDraftTokens}) {
    g.mtp_draft_tokens = k;
    Collector c;
    ASSERT_TRUE(engine->Submit({g}, c.For(0)).ok());
    c.Wait(1);
    EXPECT_TRUE(c[0] == Plain(Model::kKjv, g)) << "k " << k;
  }
  g.mtp_draft_tokens = kMaxMtpDraftTokens + 1;
  EXPECT_EQ(engine->Validate(g).code(), absl::StatusCode::kInvalidArgument);
  g.mtp_draft_tokens = -2;
  EXPECT_EQ(engine->Validate(g).code(), absl::StatusCode::kInvalidArgument);

  // A server without it refuses a request that asks for drafts, not silently ignores it.
  std::unique_ptr<Engine> plain = MakeEngine(Model::kKjv, 0);
  g.mtp_draft_tokens = 1;
  EXPECT_EQ(plain->Validate(g).code(), absl::StatusCode::kFailedPrecondition);
  g.mtp_draft_tokens = -1;
  EXPECT_TRUE(plain->Validate(g).ok());

  // An engine cannot run a layer the model lacks, nor more drafts than the bound.
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, {});
  ASSERT_TRUE(w.ok());
  EngineOptions options;
  options.mtp_draft_tokens = 1;
  absl::StatusOr<std::unique_ptr<Engine>> none =
      Engine::Create(std::make_unique<CpuModel>(*std::move(w)), options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  options.mtp_draft_tokens = kMaxMtpDraftTokens + 1;
  EXPECT_EQ(ValidateEngineOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options.mtp_draft_tokens = 1;
  options.mtp_max_batch = -1;
  EXPECT_EQ(ValidateEngineOptions(options).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glmserve
