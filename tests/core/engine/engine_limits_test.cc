// What keeps one client from hurting others: sessions belong to their owner and hold a
// bounded share of the KV cache, idle sessions give way to waiting requests, non-finite
// model outputs fail the request instead of inventing tokens, and engine options are
// range-checked before any size is computed from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/cpu/cpu_model.h"
#include "core/engine/engine.h"
#include "core/model/checkpoint.h"
#include "core/model/kv_cache.h"

namespace glmserve {
namespace {

ModelWeights TinyWeights() {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok());
  config->max_position_embeddings = 512;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, {.seed = 7, .stddev = 0.1});
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

// Engine::Stats() is published after each step, a moment after the step's events: poll.
template <typename Pred>
bool Eventually(const Engine& engine, Pred pred) {
  for (int i = 0; i < 400; ++i) {
    if (pred(engine.Stats())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::unique_ptr<Engine> MakeEngine(EngineOptions options, ModelWeights weights = TinyWeights()) {
  options.check_invariants = true;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<CpuModel>(std::move(weights)), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// Runs requests to completion, one FinishEvent (and output) per key.
class Runner {
 public:
  explicit Runner(Engine* engine) : engine_(engine) {}

  absl::Status Submit(int key, Request request) {
    absl::StatusOr<RequestId> id = engine_->Submit(std::move(request), [this, key](Event&& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto* t = std::get_if<TokenEvent>(&e.body)) tokens_[key].push_back(t->token);
      if (auto* f = std::get_if<FinishEvent>(&e.body)) {
        finish_[key] = *f;
        cv_.notify_all();
      }
    });
    return id.status();
  }
  // The request's final status (waits up to 30 s).
  absl::Status Wait(int key) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return finish_.count(key) > 0; })) {
      return absl::DeadlineExceededError("test timeout: no FinishEvent");
    }
    return finish_[key].status;
  }
  absl::Status Run(int key, Request request) {
    RETURN_IF_ERROR(Submit(key, std::move(request)));
    return Wait(key);
  }
  std::vector<int32_t> tokens(int key) {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_[key];
  }

 private:
  Engine* engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, FinishEvent> finish_;
  std::map<int, std::vector<int32_t>> tokens_;
};

ForwardRequest SessionCall(const std::string& id, int tokens, bool create,
                           const std::string& owner = "") {
  ForwardRequest f;
  for (int i = 0; i < tokens; ++i) f.token_ids.push_back((i * 7 + 3) % 250);
  f.session_id = id;
  f.create_session = create;
  f.session_owner = owner;
  f.return_hidden = true;
  return f;
}

GenerateRequest Generate(int prompt_len, int max_new) {
  GenerateRequest g;
  for (int i = 0; i < prompt_len; ++i) g.prompt.push_back((i * 11 + 1) % 250);
  g.stop.max_new_tokens = max_new;
  g.stop.ignore_eos = true;
  return g;
}

TEST(EngineLimitsTest, SessionsBelongToTheirOwner) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  Runner run(engine.get());
  ASSERT_TRUE(run.Run(1, SessionCall("s", 4, true, "token#0")).ok());
  // Another owner sees no session "s": continuing, closing and probing are all NOT_FOUND /
  // a fresh session of its own, never the first owner's.
  EXPECT_EQ(run.Run(2, SessionCall("s", 2, false, "token#1")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->CloseSession("s", "token#1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->CloseSession("s").code(), absl::StatusCode::kNotFound);  // anonymous
  ASSERT_TRUE(run.Run(3, SessionCall("s", 3, true, "token#1")).ok());        // its own "s"
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) { return s.sessions == 2; }));
  EXPECT_TRUE(engine->CloseSession("s", "token#1").ok());
  // The first owner's session is intact and continues where it stopped.
  ASSERT_TRUE(run.Run(4, SessionCall("s", 2, false, "token#0")).ok());
  EXPECT_TRUE(engine->CloseSession("s", "token#0").ok());
}

TEST(EngineLimitsTest, SessionIdsAreLengthCheckedAndNeverEchoedWhole) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  Runner run(engine.get());
  const std::string huge(1 << 20, 'x');
  const absl::Status close = engine->CloseSession(huge);
  EXPECT_EQ(close.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(close.message().size(), 200u) << "the id must not be echoed";
  const absl::Status submit = run.Run(1, SessionCall(huge, 2, true));
  EXPECT_EQ(submit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(submit.message().size(), 200u);
  EXPECT_EQ(engine->CloseSession("").code(), absl::StatusCode::kInvalidArgument);
  // The longest id accepted; NOT_FOUND quotes only a prefix of it.
  const std::string longest(kMaxSessionIdBytes, 'y');
  const absl::Status missing = run.Run(2, SessionCall(longest, 2, false));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.message().size(), 200u);
  EXPECT_TRUE(run.Run(3, SessionCall(longest, 2, true)).ok());
}

TEST(EngineLimitsTest, SessionsHoldABoundedShareOfTheCache) {
  EngineOptions o;
  o.kv_capacity_tokens = 256;  // 16 blocks of 16
  o.block_size = 16;
  o.session_kv_fraction = 0.5;  // 8 blocks = 128 positions for all sessions
  o.max_session_tokens = 100;
  o.session_eviction_grace = absl::Hours(1);  // nothing is evictable here
  std::unique_ptr<Engine> engine = MakeEngine(o);
  Runner run(engine.get());
  // One session beyond its own limit: refused at submission, naming the limit.
  const absl::Status big = run.Run(1, SessionCall("a", 101, true));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("at most 100"), std::string::npos) << big;
  ASSERT_TRUE(run.Run(2, SessionCall("a", 64, true)).ok());  // 4 blocks
  ASSERT_TRUE(run.Run(3, SessionCall("b", 64, true)).ok());  // 4 blocks: the share is full
  const absl::Status third = run.Run(4, SessionCall("c", 16, true));
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  // A session whose creating call failed does not exist (nor hold a --max_sessions slot).
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) { return s.sessions == 2; }));
  EXPECT_EQ(run.Run(40, SessionCall("c", 1, false)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->Stats().sessions_evicted, 0);
  // Growing a session past the share fails the same way and keeps its earlier positions.
  EXPECT_EQ(run.Run(5, SessionCall("a", 16, false)).code(), absl::StatusCode::kResourceExhausted);
  // Generate still has the other half of the cache.
  EXPECT_TRUE(run.Run(6, Generate(100, 20)).ok());
  EXPECT_TRUE(engine->CloseSession("b").ok());
  EXPECT_TRUE(run.Run(7, SessionCall("a", 16, false)).ok());
  EXPECT_EQ(engine->Stats().invariant_error, "");
}

TEST(EngineLimitsTest, IdleSessionsAreEvictedLeastRecentlyUsedFirst) {
  EngineOptions o;
  o.kv_capacity_tokens = 256;
  o.block_size = 16;
  o.session_kv_fraction = 0.5;
  o.session_eviction_grace = absl::ZeroDuration();
  std::unique_ptr<Engine> engine = MakeEngine(o);
  Runner run(engine.get());
  ASSERT_TRUE(run.Run(1, SessionCall("old", 64, true)).ok());
  ASSERT_TRUE(run.Run(2, SessionCall("new", 64, true)).ok());
  ASSERT_TRUE(run.Run(3, SessionCall("third", 16, true)).ok());  // evicts "old"
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) { return s.sessions_evicted == 1; }));
  const absl::Status gone = run.Run(4, SessionCall("old", 1, false));
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.message().find("evicted"), std::string::npos) << gone;
  EXPECT_TRUE(run.Run(5, SessionCall("new", 1, false)).ok());
  EXPECT_EQ(engine->Stats().invariant_error, "");
}

// The scenario: idle sessions pin nearly the whole cache; a long Generate and a short
// one queued behind it must both run (the sessions give way) instead of waiting for the
// sessions' idle timeout. Outputs equal the same requests on an empty engine.
TEST(EngineLimitsTest, IdleSessionsDoNotStarveGenerateOrBlockTheQueue) {
  EngineOptions o;
  o.kv_capacity_tokens = 256;
  o.block_size = 16;
  o.session_kv_fraction = 1.0;
  o.session_eviction_grace = absl::ZeroDuration();
  o.prefix_caching = false;
  std::unique_ptr<Engine> engine = MakeEngine(o);
  Runner run(engine.get());
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(run.Run(s, SessionCall(absl::StrCat("s", s), 62, true)).ok());
  }
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) {
    return s.kv_blocks_sessions == 16;  // every block pinned
  }));
  const auto t0 = std::chrono::steady_clock::now();
  Request big(Generate(150, 40));
  big.deadline = t0 + std::chrono::seconds(20);
  Request small(Generate(3, 5));
  small.deadline = t0 + std::chrono::seconds(20);
  ASSERT_TRUE(run.Submit(10, std::move(big)).ok());
  ASSERT_TRUE(run.Submit(11, std::move(small)).ok());
  EXPECT_TRUE(run.Wait(10).ok());
  EXPECT_TRUE(run.Wait(11).ok());
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) { return s.sessions_evicted >= 3; }));

  std::unique_ptr<Engine> fresh = MakeEngine(o);
  Runner alone(fresh.get());
  ASSERT_TRUE(alone.Run(10, Generate(150, 40)).ok());
  ASSERT_TRUE(alone.Run(11, Generate(3, 5)).ok());
  EXPECT_EQ(run.tokens(10), alone.tokens(10));
  EXPECT_EQ(run.tokens(11), alone.tokens(11));
  EXPECT_EQ(engine->Stats().invariant_error, "");
}

// With a grace period, a session used a moment ago is not evicted: the waiting request
// waits (here until its deadline) rather than destroying a live pipeline's cache.
TEST(EngineLimitsTest, RecentlyUsedSessionsAreSpared) {
  EngineOptions o;
  o.kv_capacity_tokens = 64;
  o.block_size = 16;
  o.session_kv_fraction = 1.0;
  o.session_eviction_grace = absl::Hours(1);
  std::unique_ptr<Engine> engine = MakeEngine(o);
  Runner run(engine.get());
  ASSERT_TRUE(run.Run(1, SessionCall("s", 60, true)).ok());
  Request g(Generate(20, 4));
  g.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  EXPECT_EQ(run.Run(2, std::move(g)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(engine->Stats().sessions_evicted, 0);
  EXPECT_TRUE(run.Run(3, SessionCall("s", 1, false)).ok());
}

TEST(EngineLimitsTest, NonFiniteOutputsFailTheRequest) {
  ModelWeights w = TinyWeights();
  // A NaN in the final norm: every logit is NaN, the hidden states before it are finite.
  w.final_norm[3] = std::numeric_limits<float>::quiet_NaN();
  std::unique_ptr<Engine> engine = MakeEngine({}, std::move(w));
  Runner run(engine.get());
  const absl::Status generate = run.Run(1, Generate(5, 4));
  EXPECT_EQ(generate.code(), absl::StatusCode::kInternal);
  EXPECT_NE(generate.message().find("non-finite logits"), std::string::npos) << generate;
  EXPECT_TRUE(run.tokens(1).empty()) << "no token may be made up from NaN logits";
  ForwardRequest logits;
  logits.token_ids = {1, 2, 3};
  logits.logits = LogitsRows::kAll;
  EXPECT_EQ(run.Run(2, logits).code(), absl::StatusCode::kInternal);
  ForwardRequest hidden;  // the residual stream itself is finite: served
  hidden.token_ids = {1, 2, 3};
  EXPECT_TRUE(run.Run(3, hidden).ok());
  EXPECT_TRUE(Eventually(*engine, [](const EngineStats& s) { return s.nonfinite_outputs == 2; }));
  EXPECT_EQ(engine->Stats().invariant_error, "");
}

TEST(EngineLimitsTest, SampleVocabLimitBoundsTheSampledIdsOnly) {
  std::unique_ptr<Engine> engine = MakeEngine({});
  Runner run(engine.get());
  // Greedy over the whole vocabulary, then bounded below the ids it picked: every token of
  // the bounded run is below the bound, and the bound is the only difference (the same
  // request with the bound at the vocabulary's size gives the unbounded tokens).
  ASSERT_TRUE(run.Run(1, Generate(5, 24)).ok());
  const std::vector<int32_t> free = run.tokens(1);
  const int32_t limit = *std::min_element(free.begin(), free.end());
  ASSERT_GT(limit, 1) << "the tiny model's greedy ids should not all be tiny";
  GenerateRequest bounded = Generate(5, 24);
  bounded.sample_vocab_limit = limit;
  ASSERT_TRUE(run.Run(2, bounded).ok());
  ASSERT_EQ(run.tokens(2).size(), 24u);
  for (int32_t id : run.tokens(2)) EXPECT_LT(id, limit);
  GenerateRequest whole = Generate(5, 24);
  whole.sample_vocab_limit = 256;
  ASSERT_TRUE(run.Run(3, whole).ok());
  EXPECT_EQ(run.tokens(3), free);
  for (int32_t bad : {-1, 257}) {
    GenerateRequest g = Generate(5, 4);
    g.sample_vocab_limit = bad;
    const absl::Status s = run.Submit(4, g);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("sample_vocab_limit"), std::string::npos) << s;
  }
}

TEST(EngineLimitsTest, OptionsAreRangeChecked) {
  const auto create = [](EngineOptions o) {
    return Engine::Create(std::make_unique<CpuModel>(TinyWeights()), o).status();
  };
  EngineOptions o;
  o.block_size = int64_t{1} << 40;
  o.kv_capacity_tokens = int64_t{1} << 54;
  absl::Status s = create(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_size"), std::string::npos) << s;
  o = {};
  o.kv_capacity_tokens = int64_t{1} << 40;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.session_kv_fraction = 1.5;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.max_batch_tokens = 0;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  // In range but more memory than the machine has: an error, not an abort or the OOM killer.
  o = {};
  o.kv_capacity_tokens = int64_t{1} << 34;
  s = create(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

// One limits struct: 0 means the model's positions, nothing resolves above them, the default
// max_new_tokens follows a lower cap, and Submit enforces what limits() reports.
TEST(EngineLimitsTest, RequestLimitsAreResolvedAgainstTheModel) {
  EngineOptions o;  // TinyWeights: 512 positions
  std::unique_ptr<Engine> engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->limits().max_prompt_tokens, 512);
  EXPECT_EQ(engine->limits().max_new_tokens, 512);
  EXPECT_EQ(engine->limits().default_max_new_tokens, 256);

  o.limits.max_prompt_tokens = 100000;  // above the model: clamped
  o.limits.max_new_tokens = 0;
  o.limits.default_max_new_tokens = 4096;  // above the resolved max_new_tokens: clamped
  engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->limits().max_prompt_tokens, 512);
  EXPECT_EQ(engine->limits().default_max_new_tokens, 512);

  o.limits = {.max_prompt_tokens = 4, .max_new_tokens = 3, .default_max_new_tokens = 2};
  engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  GenerateRequest g;
  g.prompt = {1, 2, 3, 4, 5};
  g.stop.max_new_tokens = 1;
  absl::StatusOr<RequestId> id = engine->Submit(Request{g}, [](Event&&) {});
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("limit is 4"), std::string::npos) << id.status();
  g.prompt = {1, 2};
  g.stop.max_new_tokens = 4;
  id = engine->Submit(Request{g}, [](Event&&) {});
  EXPECT_NE(id.status().message().find("[1, 3]"), std::string::npos) << id.status();

  // An explicit default above an explicit cap is a configuration error, named.
  o.limits = {.max_new_tokens = 50, .default_max_new_tokens = 100};
  absl::Status s = Engine::Create(std::make_unique<CpuModel>(TinyWeights()), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("default_max_new_tokens=100"), std::string::npos) << s;
}

TEST(KvCacheBytesTest, OverflowAndBadDimensionsAreErrors) {
  KvCacheShape shape{
      .num_layers = 92, .kv_heads = 8, .head_dim = 128, .block_size = 16, .num_blocks = 1024};
  absl::StatusOr<int64_t> bytes = KvCacheBytes(shape, 2);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, int64_t{2} * 2 * 92 * 8 * 128 * 16 * 1024);
  shape.block_size = int64_t{1} << 40;
  shape.num_blocks = int64_t{1} << 14;
  EXPECT_EQ(KvCacheBytes(shape, 4).status().code(), absl::StatusCode::kInvalidArgument);
  shape.block_size = 16;
  shape.num_blocks = int64_t{1} << 32;  // more blocks than int32 block ids
  EXPECT_EQ(KvCacheBytes(shape, 4).status().code(), absl::StatusCode::kInvalidArgument);
  shape.num_blocks = 0;
  EXPECT_EQ(KvCacheBytes(shape, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glmserve
