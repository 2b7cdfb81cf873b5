// The request harness shared by the engine's tests (engine_test.cc, engine_forced_test.cc):
// what a request produced, a collector of many requests' events, and a deterministic
// generate request.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "core/engine.h"

namespace glmserve::testing {

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
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return finished_ >= count; }))
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

}  // namespace glmserve::testing
