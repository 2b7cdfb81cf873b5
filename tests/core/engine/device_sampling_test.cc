// The engine with a runner that samples where the logits are (ForwardOptions::sample, the
// CUDA runner's contract; here bench/instant_runner.h in its device-sampling form, which
// answers with SampleToken as the device kernel does): every request's tokens, logprobs and
// alternatives equal those of the same engine sampling rows on the host; no row crosses, not
// even for logprobs or forced tokens; a row the runner flags non-finite fails its request
// alone.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/instant_runner.h"
#include "core/engine/engine.h"
#include "core/model/config.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve {
namespace {

using testing::Collector;
using testing::Outcome;

// Delegates to an instant runner, counting the logits rows that come back, and (optionally)
// flagging the first sampled row of the `poison_step`-th step as non-finite.
class CountingRunner final : public ModelRunner {
 public:
  CountingRunner(std::unique_ptr<InstantRunner> inner, int poison_step)
      : inner_(std::move(inner)), poison_step_(poison_step) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t layer_begin() const override { return inner_->layer_begin(); }
  int64_t layer_end() const override { return inner_->layer_end(); }
  bool supports_sub_spans() const override { return false; }
  bool samples_tokens() const override { return inner_->samples_tokens(); }
  std::string device_name() const override { return "counting"; }
  int64_t weight_bytes() const override { return 0; }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t blocks, int64_t size) override {
    return inner_->CreateCache(blocks, size);
  }
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override {
    absl::Status s = inner_->Forward(batch, cache, options, result);
    std::lock_guard<std::mutex> lock(mu_);
    rows_ += static_cast<int64_t>(result->logits.size()) / config().vocab_size;
    sampled_ += static_cast<int64_t>(result->tokens.size());
    if (++steps_ == poison_step_) {
      for (size_t i = 0; i < options.sample.size(); ++i) {
        if (options.sample[i].sample) {
          result->row_finite[i] = 0;
          poisoned_seed_ = options.sample[i].params.seed;
          break;
        }
      }
    }
    return s;
  }
  int64_t rows() {
    std::lock_guard<std::mutex> lock(mu_);
    return rows_;
  }
  int64_t sampled() {
    std::lock_guard<std::mutex> lock(mu_);
    return sampled_;
  }
  uint64_t poisoned_seed() {
    std::lock_guard<std::mutex> lock(mu_);
    return poisoned_seed_;
  }

 private:
  std::unique_ptr<InstantRunner> inner_;
  int poison_step_;
  std::mutex mu_;
  int64_t rows_ = 0, sampled_ = 0, steps_ = 0;
  uint64_t poisoned_seed_ = 0;
};

ModelConfig Config() {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  c->max_position_embeddings = 512;
  return *c;
}

// A mix of every sampling path, with and without logprobs, forced tokens and a vocabulary
// limit, all seeded by `k`.
std::vector<GenerateRequest> Requests() {
  std::vector<GenerateRequest> out;
  for (int k = 0; k < 12; ++k) {
    GenerateRequest g = testing::MakeGenerate(k, 3 + k, 12, /*sample=*/k % 4 != 0);
    g.logprobs = k % 3 == 0;
    g.top_logprobs = k % 6 == 0 ? 3 : 0;
    g.sampling.seed = 1000 + k;  // greedy ignores it; the poisoning test finds requests by it
    if (k % 4 == 2) {            // plain temperature with min-p: a whole-row draw
      g.sampling.top_k = 0;
      g.sampling.top_p = 1.0f;
      g.sampling.min_p = 0.05f;
      g.sampling.temperature = 1.3f;
    }
    if (k == 5) g.sample_vocab_limit = 100;
    if (k == 7) g.forced.tokens = {3, 1, 4};
    out.push_back(g);
  }
  return out;
}

struct EngineRun {
  std::vector<Outcome> outcomes;
  int64_t rows = 0, sampled = 0;
  uint64_t poisoned_seed = 0;
};

EngineRun RunAll(bool device_sampling, int poison_step = -1) {
  auto inner = std::make_unique<InstantRunner>(Config());
  inner->set_device_sampling(device_sampling);
  auto owned = std::make_unique<CountingRunner>(std::move(inner), poison_step);
  CountingRunner* runner = owned.get();
  EngineOptions options;
  options.max_running = 6;  // two waves: batches mix fresh prefills and decodes
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(std::move(owned), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  Collector c;
  const std::vector<GenerateRequest> requests = Requests();
  for (size_t k = 0; k < requests.size(); ++k) {
    EXPECT_TRUE((*engine)->Submit(requests[k], c.For(static_cast<int>(k))).ok());
  }
  c.Wait(static_cast<int>(requests.size()));
  testing::ExpectAllBlocksFree(**engine);
  EngineRun run;
  for (size_t k = 0; k < requests.size(); ++k) run.outcomes.push_back(c[static_cast<int>(k)]);
  run.rows = runner->rows();
  run.sampled = runner->sampled();
  run.poisoned_seed = runner->poisoned_seed();
  return run;
}

TEST(DeviceSamplingTest, SameTokensAndLogprobsAsSamplingOnTheHost) {
  const EngineRun host = RunAll(false), device = RunAll(true);
  ASSERT_EQ(host.outcomes.size(), device.outcomes.size());
  for (size_t k = 0; k < host.outcomes.size(); ++k) {
    SCOPED_TRACE("request " + std::to_string(k));
    EXPECT_TRUE(device.outcomes[k].finish.status.ok()) << device.outcomes[k].finish.status;
    EXPECT_EQ(device.outcomes[k].tokens.size(), 12u);
    EXPECT_TRUE(device.outcomes[k] == host.outcomes[k]);
  }
  EXPECT_EQ(host.outcomes[7].tokens[0], 3);  // forced
  for (int32_t t : host.outcomes[5].tokens) EXPECT_LT(t, 100);
}

TEST(DeviceSamplingTest, NoRowCrossesLogprobsIncluded) {
  const EngineRun device = RunAll(true);
  const std::vector<GenerateRequest> requests = Requests();
  int64_t tokens = 0, with_logprobs = 0;
  for (size_t k = 0; k < requests.size(); ++k) {
    tokens += static_cast<int64_t>(device.outcomes[k].tokens.size());
    if (requests[k].logprobs || requests[k].top_logprobs > 0) ++with_logprobs;
  }
  EXPECT_GT(with_logprobs, 0);
  EXPECT_EQ(device.rows, 0);          // logprobs and forced tokens come from the runner too
  EXPECT_EQ(device.sampled, tokens);  // one request per next-token row, none for the rest
  const EngineRun host = RunAll(false);
  EXPECT_EQ(host.rows, tokens);
}

TEST(DeviceSamplingTest, ANonFiniteRowFailsOnlyItsRequest) {
  const EngineRun device = RunAll(true, /*poison_step=*/4);
  const std::vector<GenerateRequest> requests = Requests();
  int failed = 0;
  for (size_t k = 0; k < requests.size(); ++k) {
    const Outcome& o = device.outcomes[k];
    if (requests[k].sampling.seed == device.poisoned_seed && !o.finish.status.ok()) {
      ++failed;
      EXPECT_EQ(o.finish.status.code(), absl::StatusCode::kInternal);
      EXPECT_NE(o.finish.status.message().find("non-finite"), std::string::npos);
    } else {
      EXPECT_TRUE(o.finish.status.ok()) << "request " << k << ": " << o.finish.status;
    }
  }
  EXPECT_EQ(failed, 1);
}

}  // namespace
}  // namespace glmserve
