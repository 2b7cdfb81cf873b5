// The continuous-batching engine: batching, chunking, preemption and prefix sharing never
// change a request's output; cancellation, deadlines and sessions keep the KV cache
// accounting exact; bad requests are refused up front.
#include "core/engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/cpu/cpu_model.h"
#include "core/cpu/quantize.h"
#include "core/engine/host_sampling_runner.h"
#include "core/model/checkpoint.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve {
namespace {

// The preset the helpers below build; the GLM-5 tests at the end switch it (ScopedPreset).
const char* g_preset = "tiny";
struct ScopedPreset {
  explicit ScopedPreset(const char* name) : saved(g_preset) { g_preset = name; }
  ~ScopedPreset() { g_preset = saved; }
  const char* saved;
};
// The arithmetic TinyModel builds with: the batch-invariance tests run in every CpuMath mode
// and with int8 weights (EngineMathTest sets these), since the contract holds within each.
CpuMath g_math = CpuMath::kExact;
bool g_int8 = false;
bool g_kv_fp8 = false;  // engines keep their KV cache in FP8 (--kv_cache_dtype=fp8_e4m3)
// The runner samples after each step (HostSamplingRunner), so the engine overlaps its steps
// (EngineOptions::overlap_steps, docs/engine.md).
bool g_overlap = false;

std::unique_ptr<ModelRunner> TinyModel(LayerSpan span = {}) {
  ModelWeights w = testing::EngineTestWeights(g_preset, span);
  EXPECT_EQ(w.weight_dtype, DType::kBF16) << "the bf16 mode needs bf16 weights to matter";
  if (g_int8) {
    EXPECT_TRUE(QuantizeWeights(&w, WeightQuant::kInt8).ok());
  }
  auto model = std::make_unique<CpuModel>(std::move(w), g_math);
  if (g_overlap) return std::make_unique<HostSamplingRunner>(std::move(model));
  return model;
}

std::unique_ptr<Engine> MakeEngine(EngineOptions options = {}, LayerSpan span = {}) {
  options.check_invariants = true;
  if (g_kv_fp8) options.kv_cache_dtype = KvCacheDType::kFp8E4M3;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(TinyModel(span), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) {
    // The bf16 modes' caches are bf16 (auto: their attention rounds K and V to bf16 anyway), so
    // every scenario below runs on that cache in those modes.
    EXPECT_EQ((*engine)->kv_cache_dtype(), g_kv_fp8                    ? DType::kF8E4M3
                                           : g_math != CpuMath::kExact ? DType::kBF16
                                                                       : DType::kF32);
  }
  return *std::move(engine);
}

using testing::Collector;
using testing::ExpectAllBlocksFree;
using testing::MakeGenerate;
using testing::Outcome;

Outcome RunAlone(const GenerateRequest& g, EngineOptions options = {}) {
  return testing::RunAlone([](EngineOptions o) { return MakeEngine(o); }, g, options);
}

// The shared scenarios (engine_harness.h) on this CPU engine: every output bit-identical.
testing::EngineScenario CpuScenario() {
  testing::EngineScenario t;
  t.make = [](EngineOptions options) { return MakeEngine(options); };
  t.expect_same = [](const Outcome& got, const Outcome& want, bool, const std::string& what) {
    EXPECT_TRUE(got == want) << what << ": not bit-identical";
  };
  return t;
}

// "exact", "bf16", "bf16_amx" (CpuMath), "int8" (bf16 math on int8 weights), "int8_amx"
// (bf16_amx math on int8 weights: the group-serial int8 arithmetic), "fp8_kv"
// (exact math, FP8 KV cache: its per-token scales keep every invariant bit-exact) or
// "overlap" (exact math, sampling in the runner: overlapped steps).
class EngineMathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    g_math = GetParam() == "exact"                                  ? CpuMath::kExact
             : GetParam() == "bf16_amx" || GetParam() == "int8_amx" ? CpuMath::kBf16Amx
                                                                    : CpuMath::kBf16;
    g_int8 = GetParam() == "int8" || GetParam() == "int8_amx";
    g_kv_fp8 = GetParam() == "fp8_kv";
    g_overlap = GetParam() == "overlap";
  }
  void TearDown() override {
    g_math = CpuMath::kExact;
    g_int8 = false;
    g_kv_fp8 = false;
    g_overlap = false;
  }
};

TEST_P(EngineMathTest, ConcurrentRequestsEqualOneAtATime) {
  EngineOptions options;
  options.max_batch_tokens = 64;
  options.max_running = 16;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::vector<GenerateRequest> requests;
  for (int k = 0; k < 32; ++k) {
    requests.push_back(MakeGenerate(k, 1 + (k * 7) % 40, 6 + k % 9, /*sample=*/k % 2 == 1));
    ASSERT_TRUE(engine->Submit({requests.back()}, c.For(k)).ok());
  }
  c.Wait(32);
  for (int k = 0; k < 32; ++k) {
    const Outcome& got = c.outcomes()[k];
    EXPECT_EQ(got.finishes, 1);
    EXPECT_EQ(got.finish.reason, FinishReason::kLength);
    EXPECT_EQ(static_cast<int>(got.tokens.size()), requests[k].stop.max_new_tokens);
    EXPECT_TRUE(got == RunAlone(requests[k])) << "request " << k;
  }
  ExpectAllBlocksFree(*engine);
  EXPECT_GT(engine->Stats().steps, 0);
}

TEST_P(EngineMathTest, ChunkedPrefillEqualsUnchunked) {
  const GenerateRequest g = MakeGenerate(3, 50, 5, /*sample=*/true);
  EngineOptions big;
  big.max_batch_tokens = 512;
  const Outcome reference = RunAlone(g, big);
  for (int64_t budget : {1, 5, 16, 49}) {
    EngineOptions options;
    options.max_batch_tokens = budget;
    EXPECT_TRUE(RunAlone(g, options) == reference) << "budget " << budget;
  }
}

TEST_P(EngineMathTest, SmallKvCachePreemptsAndStillMatches) {
  testing::PreemptionScenario(CpuScenario());
}

TEST_P(EngineMathTest, PrefixHitGivesIdenticalOutputAndSkipsCompute) {
  testing::PrefixHitScenario(CpuScenario());
}

TEST(EngineTest, CancelAndDeadlinesFreeEverythingAndSpareOthers) {
  EngineOptions options;
  options.max_batch_tokens = 32;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::mt19937 rng(3);
  std::vector<GenerateRequest> requests;
  std::vector<RequestId> ids;
  for (int k = 0; k < 24; ++k) {
    requests.push_back(MakeGenerate(k, 5 + k % 30, 40, k % 3 == 0));
    Request r{requests.back()};
    if (k % 6 == 5) r.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(k);
    absl::StatusOr<RequestId> id = engine->Submit(std::move(r), c.For(k));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (int k = 1; k < 24; k += 4) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    engine->Cancel(ids[k]);
  }
  c.Wait(24);
  for (int k = 0; k < 24; ++k) {
    const Outcome& got = c.outcomes()[k];
    EXPECT_EQ(got.finishes, 1);
    if (got.finish.reason == FinishReason::kCancelled) {
      EXPECT_EQ(got.finish.status.code(), absl::StatusCode::kCancelled);
    } else if (got.finish.reason == FinishReason::kDeadline) {
      EXPECT_EQ(got.finish.status.code(), absl::StatusCode::kDeadlineExceeded);
    } else {
      EXPECT_TRUE(got == RunAlone(requests[k])) << "request " << k;
    }
  }
  ExpectAllBlocksFree(*engine);
}

TEST_P(EngineMathTest, SessionInPiecesEqualsOneForward) {
  std::unique_ptr<Engine> engine = MakeEngine();
  std::vector<int32_t> ids;
  for (int i = 0; i < 21; ++i) ids.push_back((i * 13 + 1) % 250);
  Collector c;
  ForwardRequest whole;
  whole.token_ids = ids;
  whole.logits = LogitsRows::kAll;
  ASSERT_TRUE(engine->Submit({whole}, c.For(0)).ok());
  c.Wait(1);
  const ForwardOutput& ref = c.outcomes()[0].forward;
  ASSERT_EQ(ref.rows, 21);

  std::vector<float> hidden, logits;
  int start = 0, key = 1;
  for (int piece : {5, 1, 9, 6}) {
    ForwardRequest f;
    f.token_ids.assign(ids.begin() + start, ids.begin() + start + piece);
    f.session_id = "s1";
    f.create_session = start == 0;
    f.logits = LogitsRows::kAll;
    ASSERT_TRUE(engine->Submit({f}, c.For(key)).ok());
    c.Wait(key + 1);
    const Outcome& o = c.outcomes()[key];
    ASSERT_TRUE(o.finish.status.ok()) << o.finish.status;
    EXPECT_EQ(o.forward.start_position, start);
    hidden.insert(hidden.end(), o.forward.hidden.begin(), o.forward.hidden.end());
    logits.insert(logits.end(), o.forward.logits.begin(), o.forward.logits.end());
    start += piece;
    ++key;
  }
  EXPECT_EQ(hidden, ref.hidden);
  EXPECT_EQ(logits, ref.logits);
  EXPECT_EQ(engine->Stats().sessions, 1);
  EXPECT_TRUE(engine->CloseSession("s1").ok());
  EXPECT_EQ(engine->CloseSession("s1").code(), absl::StatusCode::kNotFound);
  ForwardRequest after;
  after.token_ids = {1};
  after.session_id = "s1";
  EXPECT_EQ(engine->Submit({after}, c.For(99)).status().code(), absl::StatusCode::kNotFound);
  ExpectAllBlocksFree(*engine);
}

INSTANTIATE_TEST_SUITE_P(AllModes, EngineMathTest,
                         ::testing::Values("exact", "bf16", "bf16_amx", "int8", "int8_amx",
                                           "fp8_kv", "overlap"),
                         [](const auto& info) { return info.param; });

TEST(EngineTest, HiddenStatesThroughASubSpanChain) {
  // Layers [0, 1) then [1, 3) of one engine, joined by hidden states, equal the whole stack.
  std::unique_ptr<Engine> engine = MakeEngine();
  Collector c;
  ForwardRequest whole;
  whole.token_ids = {3, 1, 4, 1, 5, 9, 2, 6};
  whole.logits = LogitsRows::kLast;
  whole.return_hidden = false;
  ASSERT_TRUE(engine->Submit({whole}, c.For(0)).ok());
  ForwardRequest head = whole;
  head.layer_end = 1;
  head.logits = LogitsRows::kNone;
  head.return_hidden = true;
  ASSERT_TRUE(engine->Submit({head}, c.For(1)).ok());
  c.Wait(2);
  ForwardRequest tail;
  tail.layer_begin = 1;
  tail.hidden = c.outcomes()[1].forward.hidden;
  tail.num_tokens = 8;
  tail.logits = LogitsRows::kLast;
  tail.return_hidden = false;
  ASSERT_TRUE(engine->Submit({tail}, c.For(2)).ok());
  c.Wait(3);
  ASSERT_EQ(c.outcomes()[2].forward.logits.size(), 256u);
  EXPECT_EQ(c.outcomes()[2].forward.logits, c.outcomes()[0].forward.logits);
}

TEST(EngineTest, RandomizedStressKeepsInvariants) {
  EngineOptions options;
  options.kv_capacity_tokens = 160;
  options.block_size = 8;
  options.max_batch_tokens = 24;
  options.max_running = 6;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::mt19937 rng(11);
  std::vector<RequestId> ids;
  int submitted = 0;
  for (int k = 0; k < 80; ++k) {
    GenerateRequest g = MakeGenerate(k % 10, 1 + rng() % 40, 1 + rng() % 30, rng() % 2);
    Request r{g};
    if (rng() % 7 == 0)
      r.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 20000);
    absl::StatusOr<RequestId> id = engine->Submit(std::move(r), c.For(k));
    if (id.ok()) {
      ids.push_back(*id);
      ++submitted;
    }
    if (rng() % 5 == 0 && !ids.empty()) engine->Cancel(ids[rng() % ids.size()]);
    if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
  }
  c.Wait(submitted);
  for (auto& [key, o] : c.outcomes()) EXPECT_EQ(o.finishes, 1) << "request " << key;
  ExpectAllBlocksFree(*engine);
}

TEST(EngineTest, BadRequestsAreRefusedUpFront) {
  EngineOptions options;
  options.kv_capacity_tokens = 64;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  auto code = [&](Request r) { return engine->Submit(std::move(r), c.For(0)).status().code(); };
  using absl::StatusCode;
  GenerateRequest ok = MakeGenerate(0, 4, 4, false);
  GenerateRequest g = ok;
  g.prompt.clear();
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.prompt[1] = 256;
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.sampling.temperature = -1;
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.sampling.top_p = 0;
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.stop.max_new_tokens = 0;
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.top_logprobs = 21;
  EXPECT_EQ(code({g}), StatusCode::kInvalidArgument);
  g = ok;
  g.stop.max_new_tokens = 100;  // 104 tokens > 64 slots: can never fit
  EXPECT_EQ(code({g}), StatusCode::kResourceExhausted);

  ForwardRequest f;
  f.layer_begin = 1;
  f.num_tokens = 2;
  f.hidden.assign(2 * 64, 0.5f);
  f.hidden[70] = NAN;
  EXPECT_EQ(code({f}), StatusCode::kInvalidArgument);
  f.hidden[70] = 0.f;
  f.hidden.pop_back();
  EXPECT_EQ(code({f}), StatusCode::kInvalidArgument);  // byte count
  f.hidden.push_back(0.f);
  f.layer_end = 5;
  EXPECT_EQ(code({f}), StatusCode::kInvalidArgument);  // layers not served
  ForwardRequest s;
  s.token_ids = {1, 2};
  s.session_id = "nope";
  EXPECT_EQ(code({s}), StatusCode::kNotFound);
  s.create_session = true;
  EXPECT_TRUE(engine->Submit({s}, c.For(1)).ok());
  EXPECT_EQ(code({s}), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine->CloseSession("other").code(), StatusCode::kNotFound);

  engine->StartDraining();
  EXPECT_EQ(code({ok}), StatusCode::kUnavailable);
  c.Wait(1);
}

TEST(EngineTest, GenerateNeedsTheWholeModel) {
  std::unique_ptr<Engine> engine = MakeEngine({}, LayerSpan{1, -1});
  Collector c;
  EXPECT_EQ(engine->Submit({MakeGenerate(0, 3, 3, false)}, c.For(0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(EngineTest, QueueFullIsResourceExhausted) {
  EngineOptions options;
  options.max_waiting = 2;
  options.max_running = 1;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  int accepted = 0;
  absl::StatusCode last = absl::StatusCode::kOk;
  for (int k = 0; k < 20; ++k) {
    absl::StatusOr<RequestId> id = engine->Submit({MakeGenerate(k, 30, 200, false)}, c.For(k));
    if (id.ok()) {
      ++accepted;
    } else {
      last = id.status().code();
    }
  }
  EXPECT_EQ(last, absl::StatusCode::kResourceExhausted);
  EXPECT_LE(accepted, 4);
  c.Wait(accepted);
}

TEST(EngineTest, StopTokensAndEos) {
  GenerateRequest g = MakeGenerate(2, 6, 12, false);
  const Outcome free_run = RunAlone(g);
  ASSERT_EQ(free_run.tokens.size(), 12u);
  g.stop.stop_token_ids = {free_run.tokens[3]};
  const Outcome stopped = RunAlone(g);
  EXPECT_EQ(stopped.finish.reason, FinishReason::kStop);
  // It stops at the first occurrence of that token, which it still reports.
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[3]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), first + 1));
}

// GLM-5 (tiny-glm5: latent KV cache, DSA indexer with index_topk 8) through the same engine:
// batching, preemption by recompute and prefix hits leave every output unchanged.
TEST(EngineGlm5Test, ConcurrentPreemptedAndPrefixHitRequestsEqualOneAtATime) {
  ScopedPreset preset("tiny-glm5");
  EngineOptions options;
  options.kv_capacity_tokens = 96;  // forces preemptions, as SmallKvCachePreemptsAndStillMatches
  options.block_size = 8;
  options.max_running = 8;
  options.max_batch_tokens = 32;
  std::unique_ptr<Engine> engine = MakeEngine(options);
  Collector c;
  std::vector<GenerateRequest> requests;
  for (int k = 0; k < 8; ++k) {
    requests.push_back(MakeGenerate(k % 4, 4 + 5 * (k % 4), 24, /*sample=*/k % 2 == 0));
    ASSERT_TRUE(engine->Submit({requests.back()}, c.For(k)).ok());
  }
  c.Wait(8);
  for (int k = 0; k < 8; ++k) {
    const Outcome& got = c.outcomes()[k];
    EXPECT_TRUE(got.finish.status.ok()) << got.finish.status;
    EXPECT_EQ(static_cast<int>(got.tokens.size()), 24);
    EXPECT_TRUE(got == RunAlone(requests[k])) << "request " << k;
  }
  EXPECT_GT(engine->Stats().preemptions, 0);
  ExpectAllBlocksFree(*engine);

  // A prompt sharing three full blocks with an earlier one reuses their latent rows.
  GenerateRequest a = MakeGenerate(9, 30, 4, false);
  GenerateRequest b = a;
  b.prompt.resize(26);
  b.prompt.push_back(3);
  ASSERT_TRUE(engine->Submit({a}, c.For(100)).ok());
  c.Wait(9);
  ASSERT_TRUE(engine->Submit({b}, c.For(101)).ok());
  c.Wait(10);
  EXPECT_EQ(c.outcomes()[101].finish.cached_prompt_tokens, 24);
  EXPECT_TRUE(c.outcomes()[101] == RunAlone(b)) << "a prefix hit changed the output";
  ExpectAllBlocksFree(*engine);
}

}  // namespace
}  // namespace glmserve
