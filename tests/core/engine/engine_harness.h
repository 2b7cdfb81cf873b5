// The request harness shared by the engine's tests (engine_test.cc, engine_forced_test.cc,
// cuda/engine_kv_fp8_cuda_test.cc): their model's weights, what a request produced, a
// collector of many requests' events, a deterministic generate request, a request run alone,
// the preemption and prefix-hit scenarios, and a pair of drafted requests (the MTP tests).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/checkpoint.h"
#include "core/model/config.h"

namespace glmserve::testing {

// The engine tests' weights: `preset` with 512 positions, random bf16 weights (seed 7, stddev
// 0.1: a model that still decodes deterministic, varied tokens), over `span`.
inline ModelWeights EngineTestWeights(const std::string& preset = "tiny", LayerSpan span = {}) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_TRUE(config.ok()) << config.status();
  config->max_position_embeddings = 512;
  RandomWeightOptions options;
  options.seed = 7;
  options.stddev = 0.1;
  absl::StatusOr<ModelWeights> w = RandomWeights(*config, options, span);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

// Everything a request produced.
struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  ForwardOutput forward;
  FinishEvent finish;
  int finishes = 0;
  // The tokens and their logprobs only.
  bool SameTokens(const Outcome& o) const { return tokens == o.tokens && logprobs == o.logprobs; }
  bool operator==(const Outcome& o) const {
    if (tokens != o.tokens || logprobs != o.logprobs || top.size() != o.top.size()) return false;
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t j = 0; j < top[i].size(); ++j) {
        if (top[i][j].token != o.top[i][j].token || top[i][j].logprob != o.top[i][j].logprob)
          return false;
      }
    }
    return forward.hidden == o.forward.hidden && forward.logits == o.forward.logits;
  }
};

// Collects events of many requests; Wait() returns once every submitted one finished.
class Collector {
 public:
  EventCallback For(int key) {
    return [this, key](Event&& e) {
      std::lock_guard<std::mutex> lock(mu_);
      Outcome& o = outcomes_[key];
      if (auto* t = std::get_if<TokenEvent>(&e.body)) {
        o.tokens.push_back(t->token);
        o.logprobs.push_back(t->logprob);
        o.top.push_back(t->top);
      } else if (auto* f = std::get_if<ForwardOutput>(&e.body)) {
        o.forward = std::move(*f);
      } else {
        o.finish = std::get<FinishEvent>(e.body);
        ++o.finishes;
        ++finished_;
        cv_.notify_all();
      }
    };
  }
  void Wait(int count) {
    std::unique_lock<std::mutex> lock(mu_);
    // Generous: on the emulated CUDA runner (engine_kv_fp8_cuda_test) 8 requests take about a
    // minute of CPU, and a loaded 2-core machine can stretch that past 60 s of wall time. A
    // hang still fails, later.
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(300), [&] { return finished_ >= count; }))
        << finished_ << " of " << count << " finished";
  }
  std::map<int, Outcome>& outcomes() { return outcomes_; }
  Outcome& operator[](int key) { return outcomes_[key]; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Outcome> outcomes_;
  int finished_ = 0;
};

// A prompt of `prompt_len` ids derived from `key`, max_new tokens past eos, logprobs with 3
// alternatives; when `sample`, temperature/top-k/top-p/penalty sampling seeded by `key`.
inline GenerateRequest MakeGenerate(int key, int prompt_len, int max_new, bool sample) {
  GenerateRequest g;
  for (int i = 0; i < prompt_len; ++i) g.prompt.push_back((key * 31 + i * 17 + 5) % 250);
  g.stop.max_new_tokens = max_new;
  g.stop.ignore_eos = true;
  g.logprobs = true;
  g.top_logprobs = 3;
  if (sample) {
    g.sampling.temperature = 0.9f;
    g.sampling.top_k = 40;
    g.sampling.top_p = 0.95f;
    g.sampling.repetition_penalty = 1.1f;
    g.sampling.seed = 1000 + key;
  }
  return g;
}

// Waits for the engine to go idle (the loop publishes stats after each step), then checks
// that every KV block came back and the invariant checker found nothing.
inline void ExpectAllBlocksFree(Engine& engine) {
  for (int i = 0; i < 200 && !engine.Idle(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << "blocks leaked";
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.invariant_error, "");
}

using MakeEngineFn = std::function<std::unique_ptr<Engine>(EngineOptions)>;

// `g` alone on a fresh engine from `make` (prefix caching off): the reference a request's
// output in a busy engine is held to.
inline Outcome RunAlone(const MakeEngineFn& make, const GenerateRequest& g,
                        EngineOptions options = {}) {
  options.prefix_caching = false;
  std::unique_ptr<Engine> engine = make(options);
  Collector c;
  EXPECT_TRUE(engine->Submit({g}, c.For(0)).ok());
  c.Wait(1);
  return c.outcomes()[0];
}

// What the two scenarios below need from a test: an engine with the given options (a
// request run alone on one is the reference, RunAlone), and the contract an output is held to
// against another (`greedy`: the request decodes greedily). The CPU holds every output
// bit-identical; a real GPU its own, looser contract (cuda/engine_kv_fp8_cuda_test.cc).
struct EngineScenario {
  MakeEngineFn make;
  std::function<void(const Outcome& got, const Outcome& want, bool greedy, const std::string& what)>
      expect_same;
};

// 6 blocks of 16 for 8 requests that start in one block and end needing 3: admission (one
// spare block per running sequence) lets 3 in, and their growth forces preemptions; every
// output must still be the request's alone.
inline void PreemptionScenario(const EngineScenario& t) {
  EngineOptions options;
  options.kv_capacity_tokens = 96;
  options.block_size = 16;
  options.max_running = 8;
  std::unique_ptr<Engine> engine = t.make(options);
  Collector c;
  std::vector<GenerateRequest> requests;
  for (int k = 0; k < 8; ++k) {
    requests.push_back(MakeGenerate(k, 4, 40, /*sample=*/k % 2 == 0));
    ASSERT_TRUE(engine->Submit({requests.back()}, c.For(k)).ok());
  }
  c.Wait(8);
  int64_t preempted = 0;
  for (int k = 0; k < 8; ++k) {
    const Outcome& got = c.outcomes()[k];
    EXPECT_TRUE(got.finish.status.ok()) << got.finish.status;
    EXPECT_EQ(got.tokens.size(), 40u);
    t.expect_same(got, RunAlone(t.make, requests[k]), k % 2 == 1, "request " + std::to_string(k));
    preempted += got.finish.preemptions;
  }
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().preemptions, preempted);
  ExpectAllBlocksFree(*engine);
}

// A prompt sharing 3 full blocks with an earlier one computes only its tail and gives the
// output it gives alone; the same prompt again hits all but its last block.
inline void PrefixHitScenario(const EngineScenario& t) {
  EngineOptions options;
  options.block_size = 8;
  std::unique_ptr<Engine> engine = t.make(options);
  GenerateRequest a = MakeGenerate(1, 35, 4, false);
  GenerateRequest b = a;
  b.prompt.resize(30);  // shares the first 3 full blocks (24 tokens) with a
  b.prompt.push_back(9);
  b.sampling.temperature = 0.7f;
  b.sampling.seed = 5;
  Collector c;
  ASSERT_TRUE(engine->Submit({a}, c.For(0)).ok());
  c.Wait(1);
  const int64_t computed_before = engine->Stats().prompt_tokens_computed;
  ASSERT_TRUE(engine->Submit({b}, c.For(1)).ok());
  c.Wait(2);
  const EngineStats s = engine->Stats();
  EXPECT_EQ(c.outcomes()[1].finish.cached_prompt_tokens, 24);
  EXPECT_EQ(s.prompt_tokens_computed - computed_before, 31 - 24);  // only the tail computed
  EXPECT_GE(s.prefix_hits, 3);
  t.expect_same(c.outcomes()[1], RunAlone(t.make, b), /*greedy=*/false, "a prefix hit");
  ASSERT_TRUE(engine->Submit({a}, c.For(2)).ok());
  c.Wait(3);
  EXPECT_EQ(c.outcomes()[2].finish.cached_prompt_tokens, 32);
  t.expect_same(c.outcomes()[2], c.outcomes()[0], /*greedy=*/true, "the same prompt again");
  t.expect_same(c.outcomes()[0], RunAlone(t.make, a), /*greedy=*/true, "a alone");
  ExpectAllBlocksFree(*engine);
}

// Two greedy requests with logprobs, submitted together to an engine over `runner` drafting `k`
// tokens per step (EngineOptions::mtp_draft_tokens; the invariant checker on): one continues
// `greedy` from its first 12 tokens (the model's own text: its drafts are accepted), one is 9
// arbitrary ids (its drafts mostly rejected). With k > 0 it expects verify steps and prints the
// acceptance under `label`. The speculation tests compare k > 0 with k = 0.
inline std::vector<Outcome> RunDraftedPair(std::unique_ptr<ModelRunner> runner, int32_t k,
                                           const std::vector<int32_t>& greedy, int max_new_tokens,
                                           const std::string& label) {
  EngineOptions options;
  options.mtp_draft_tokens = k;
  options.check_invariants = true;
  options.kv_capacity_tokens = 1024;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(std::move(runner), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  Collector c;
  for (int key = 0; key < 2; ++key) {
    GenerateRequest g;
    if (key == 0) {
      g.prompt.assign(greedy.begin(), greedy.begin() + 12);
    } else {
      for (int i = 0; i < 9; ++i) g.prompt.push_back(100 + 37 * i);
    }
    g.stop.max_new_tokens = max_new_tokens;
    g.stop.ignore_eos = true;
    g.logprobs = true;
    EXPECT_TRUE((*engine)->Submit({g}, c.For(key)).ok());
  }
  c.Wait(2);
  if (k > 0) {
    const EngineStats s = (*engine)->Stats();
    EXPECT_GT(s.spec_verify_steps, 0);
    std::printf("%s k=%d: %lld of %lld drafts accepted\n", label.c_str(), k,
                static_cast<long long>(s.spec_accepted_tokens),
                static_cast<long long>(s.spec_draft_tokens));
  }
  return {c[0], c[1]};
}

}  // namespace glmserve::testing
