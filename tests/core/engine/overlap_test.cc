// Overlapped steps (core/engine/step_executor.h, docs/engine.md): the engine builds step N + 1
// while step N runs, its decodes taking step N's tokens as pending inputs. Checked here with
// runners that take time: outputs equal the engine's without overlap, request for request and
// logprob for logprob (greedy, seeded sampling with a repetition penalty, min-p, a vocabulary
// limit, forced tokens, stop tokens, Forward calls, preemption, cancellation and deadlines);
// the host's per-step work is hidden behind the runner's; a cancelled request's blocks come
// back while a step that holds it runs; a failed step fails only its own requests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/instant_runner.h"
#include "core/cpu/cpu_model.h"
#include "core/engine/engine.h"
#include "core/engine/host_sampling_runner.h"
#include "core/engine/sampler.h"
#include "core/engine/step_executor.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve {
namespace {

using testing::Collector;
using testing::MakeGenerate;
using testing::Outcome;

// Delegates to `inner`, sleeping `delay` per step (a device that takes time), and checking that
// steps never overlap inside the runner. Optionally fails the step whose inputs contain
// `fail_token`, and holds the first step at a gate until Open().
class SlowRunner final : public ModelRunner {
 public:
  SlowRunner(std::unique_ptr<ModelRunner> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t layer_begin() const override { return inner_->layer_begin(); }
  int64_t layer_end() const override { return inner_->layer_end(); }
  bool supports_sub_spans() const override { return inner_->supports_sub_spans(); }
  bool samples_tokens() const override { return inner_->samples_tokens(); }
  std::string device_name() const override { return "slow"; }
  int64_t weight_bytes() const override { return 0; }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t blocks, int64_t size) override {
    return inner_->CreateCache(blocks, size);
  }
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override {
    if (inside_.fetch_add(1) != 0) *overlapped_inside_ = true;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++steps_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return open_; });
    }
    std::this_thread::sleep_for(delay_);
    absl::Status s;
    if (fail_token_ >= 0 && std::find(batch.token_ids.begin(), batch.token_ids.end(),
                                      fail_token_) != batch.token_ids.end()) {
      s = absl::InternalError("injected failure");
    } else {
      s = inner_->Forward(batch, cache, options, result);
    }
    inside_.fetch_sub(1);
    return s;
  }

  void set_fail_token(int32_t token) { fail_token_ = token; }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void WaitForSteps(int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return steps_ >= n; });
  }
  // Whether two steps ever ran inside it at once; outlives the runner (the engine owns it).
  std::shared_ptr<std::atomic<bool>> overlapped_inside() const { return overlapped_inside_; }

 private:
  std::unique_ptr<ModelRunner> inner_;
  std::chrono::milliseconds delay_;
  std::atomic<int> inside_{0};
  std::shared_ptr<std::atomic<bool>> overlapped_inside_ =
      std::make_shared<std::atomic<bool>>(false);
  int32_t fail_token_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int64_t steps_ = 0;
};

// The engine tests' tiny CPU model, sampling after each step (a sampling runner), slowed down.
std::unique_ptr<SlowRunner> CpuRunner(std::chrono::milliseconds delay) {
  auto model = std::make_unique<CpuModel>(testing::EngineTestWeights(), CpuMath::kExact);
  return std::make_unique<SlowRunner>(std::make_unique<HostSamplingRunner>(std::move(model)),
                                      delay);
}

std::unique_ptr<Engine> MakeEngine(std::unique_ptr<ModelRunner> runner, EngineOptions options) {
  options.check_invariants = true;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(std::move(runner), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

TEST(AddPenalisedIdTest, InsertsInOrderAndShiftsLaterRanges) {
  ForwardOptions o;
  o.sample.resize(3);
  for (auto& r : o.sample) r.sample = true;
  o.penalised_ids = {2, 9, 1, 5, 7, 3};  // entry 0: {2, 9}; entry 1: {1, 5, 7}; entry 2: {3}
  o.sample[0].params.penalised_count = 2;
  o.sample[1].params.penalised_begin = 2;
  o.sample[1].params.penalised_count = 3;
  o.sample[1].params.columns = 8;
  o.sample[2].params.penalised_begin = 5;
  o.sample[2].params.penalised_count = 1;
  AddPenalisedId(&o, 1, 6, 100);
  EXPECT_EQ(o.penalised_ids, (std::vector<int32_t>{2, 9, 1, 5, 6, 7, 3}));
  EXPECT_EQ(o.sample[1].params.penalised_count, 4);
  EXPECT_EQ(o.sample[2].params.penalised_begin, 6);
  AddPenalisedId(&o, 1, 5, 100);  // there already
  AddPenalisedId(&o, 1, 8, 100);  // beyond its columns
  AddPenalisedId(&o, 1, -1, 100);
  EXPECT_EQ(o.penalised_ids, (std::vector<int32_t>{2, 9, 1, 5, 6, 7, 3}));
  AddPenalisedId(&o, 0, 0, 100);  // first position
  EXPECT_EQ(o.penalised_ids, (std::vector<int32_t>{0, 2, 9, 1, 5, 6, 7, 3}));
  EXPECT_EQ(o.sample[1].params.penalised_begin, 3);
  EXPECT_EQ(o.sample[2].params.penalised_begin, 7);
  // As PenalisedIds of the history with the token added.
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  EXPECT_EQ(PenalisedIds(p, {7, 3, 5, 1, 6}, 8), (std::vector<int32_t>{1, 3, 5, 6, 7}));
}

std::vector<Outcome> RunAll(std::unique_ptr<ModelRunner> runner, EngineOptions options,
                            const std::vector<Request>& requests, EngineStats* stats) {
  std::unique_ptr<Engine> engine = MakeEngine(std::move(runner), options);
  Collector c;
  for (size_t k = 0; k < requests.size(); ++k) {
    EXPECT_TRUE(engine->Submit(requests[k], c.For(static_cast<int>(k))).ok());
  }
  c.Wait(static_cast<int>(requests.size()));
  testing::ExpectAllBlocksFree(*engine);
  *stats = engine->Stats();
  std::vector<Outcome> out;
  for (size_t k = 0; k < requests.size(); ++k) out.push_back(c[static_cast<int>(k)]);
  return out;
}

void ExpectSameOutcomes(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_TRUE(got[k] == want[k]) << "request " << k;
    EXPECT_EQ(got[k].finish.reason, want[k].finish.reason) << "request " << k;
    EXPECT_EQ(got[k].finish.status, want[k].finish.status) << "request " << k;
    EXPECT_EQ(got[k].finishes, 1) << "request " << k;
  }
}

// The token `g` generates at output index `index` on its own (a stop or trigger token that
// ends or forces some requests after a step that already holds their next decode).
int32_t GeneratedToken(const GenerateRequest& g, int index) {
  EngineStats stats;
  const std::vector<Outcome> o =
      RunAll(CpuRunner(std::chrono::milliseconds(0)), {}, {Request{g}}, &stats);
  return o[0].tokens.at(index);
}

// Every path a request can take: greedy and seeded sampling with a repetition penalty (the
// pending token must join its penalised ids), min-p over the whole row, a vocabulary limit,
// forced tokens from the start and after a trigger token (the pending token may be it),
// logprobs, a stop token found by a first run, a length limit of one, and Forward calls with
// logits.
std::vector<Request> MixedRequests(int32_t stop_token) {
  std::vector<Request> out;
  for (int k = 0; k < 14; ++k) {
    GenerateRequest g = MakeGenerate(k, 2 + (k * 5) % 23, 1 + (k * 7) % 17, k % 3 != 0);
    g.logprobs = k % 2 == 0;
    g.top_logprobs = k % 4 == 0 ? 3 : 0;
    if (k % 5 == 2) {
      g.sampling.top_k = 0;
      g.sampling.top_p = 1.0f;
      g.sampling.min_p = 0.05f;
    }
    if (k == 4) g.sample_vocab_limit = 60;
    if (k == 7) g.forced.tokens = {3, 1, 4};
    if (k == 9 || k == 12) {  // forced after a token the request generates on its own
      g.forced.tokens = {5, 6};
      g.forced.after_token = GeneratedToken(g, 2);
    }
    if (k % 4 == 1 && k != 9) g.stop.stop_token_ids = {stop_token};
    out.push_back(Request{g});
  }
  for (int k = 0; k < 3; ++k) {
    ForwardRequest f;
    for (int i = 0; i < 9 + 4 * k; ++i) f.token_ids.push_back((k * 13 + i * 3) % 200);
    f.logits = k == 1 ? LogitsRows::kAll : LogitsRows::kLast;
    out.push_back(Request{f});
  }
  return out;
}

TEST(OverlapTest, SameOutputsAsStepsInSequence) {
  const int32_t stop = GeneratedToken(MakeGenerate(1, 7, 6, true), 2);
  const std::vector<Request> requests = MixedRequests(stop);
  for (int64_t budget : {7, 64}) {
    EngineOptions options;
    options.max_batch_tokens = budget;
    options.max_running = 8;
    options.overlap_steps = false;
    EngineStats sequential_stats, overlap_stats;
    const std::vector<Outcome> want =
        RunAll(CpuRunner(std::chrono::milliseconds(0)), options, requests, &sequential_stats);
    options.overlap_steps = true;
    auto runner = CpuRunner(std::chrono::milliseconds(2));
    const std::shared_ptr<std::atomic<bool>> inside = runner->overlapped_inside();
    const std::vector<Outcome> got = RunAll(std::move(runner), options, requests, &overlap_stats);
    ExpectSameOutcomes(got, want);
    EXPECT_EQ(sequential_stats.overlapped_steps, 0);
    EXPECT_GT(overlap_stats.overlapped_steps, overlap_stats.steps / 2) << "budget " << budget;
    EXPECT_FALSE(*inside) << "two steps ran in the runner at once";
    int stopped = 0;
    for (const Outcome& o : want) stopped += o.finish.reason == FinishReason::kStop;
    EXPECT_GT(stopped, 0) << "no request met its stop token: the case is not exercised";
    // A trigger met: the forced tokens follow it in the reference.
    int triggered = 0;
    for (int k : {9, 12}) {
      const std::vector<int32_t>& t = want[k].tokens;
      for (size_t i = 0; i + 2 < t.size(); ++i) {
        triggered += t[i] == std::get<GenerateRequest>(requests[k].body).forced.after_token &&
                     t[i + 1] == 5 && t[i + 2] == 6;
      }
    }
    EXPECT_GT(triggered, 0) << "no forced part started after its trigger: not exercised";
  }
}

TEST(OverlapTest, PreemptionUnderATightCacheGivesTheSameOutputs) {
  // 6 blocks of 16 for 8 growing requests (engine_harness.h PreemptionScenario): overlapped
  // builds never preempt, they wait for the running step and build again.
  std::vector<Request> requests;
  for (int k = 0; k < 8; ++k) requests.push_back(Request{MakeGenerate(k, 4, 40, k % 2 == 0)});
  EngineOptions options;
  options.kv_capacity_tokens = 96;
  options.block_size = 16;
  options.max_running = 8;
  options.overlap_steps = false;
  EngineStats sequential_stats, overlap_stats;
  const std::vector<Outcome> want =
      RunAll(CpuRunner(std::chrono::milliseconds(0)), options, requests, &sequential_stats);
  options.overlap_steps = true;
  const std::vector<Outcome> got =
      RunAll(CpuRunner(std::chrono::milliseconds(1)), options, requests, &overlap_stats);
  ExpectSameOutcomes(got, want);
  EXPECT_GT(overlap_stats.preemptions, 0);
  EXPECT_GT(overlap_stats.overlapped_steps, 0);
}

TEST(OverlapTest, HostWorkHidesBehindTheRunner) {
  // A device step of 20 ms, and 15 ms of host work per step on the engine thread (the step
  // observer): in sequence a step takes both, overlapped about the longer of the two.
  auto time_it = [](bool overlap) {
    auto inner = std::make_unique<InstantRunner>(testing::EngineTestWeights().config);
    inner->set_device_sampling(true);
    EngineOptions options;
    options.overlap_steps = overlap;
    std::unique_ptr<Engine> engine = MakeEngine(
        std::make_unique<SlowRunner>(std::move(inner), std::chrono::milliseconds(20)), options);
    engine->SetStepObserver(
        [](const StepReport&) { std::this_thread::sleep_for(std::chrono::milliseconds(15)); });
    Collector c;
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(engine->Submit({MakeGenerate(k, 5, 20, k % 2 == 1)}, c.For(k)).ok());
    }
    c.Wait(4);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<Outcome> out;
    for (int k = 0; k < 4; ++k) out.push_back(c[k]);
    return std::make_pair(seconds, out);
  };
  const auto [sequential, want] = time_it(false);
  const auto [overlapped, got] = time_it(true);
  ExpectSameOutcomes(got, want);
  EXPECT_LT(overlapped, 0.8 * sequential)
      << "overlapped " << overlapped << " s, in sequence " << sequential << " s";
}

TEST(OverlapTest, CancelWhileItsStepRunsFreesItsBlocks) {
  auto owned = CpuRunner(std::chrono::milliseconds(1));
  SlowRunner* runner = owned.get();
  std::unique_ptr<Engine> engine = MakeEngine(std::move(owned), {});
  Collector c;
  const GenerateRequest a = MakeGenerate(2, 20, 30, true), b = MakeGenerate(3, 9, 12, false);
  absl::StatusOr<RequestId> id = engine->Submit({a}, c.For(0));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(engine->Submit({b}, c.For(1)).ok());
  runner->WaitForSteps(4);
  runner->Close();  // a step of both holds at the gate; the next is built behind it
  runner->WaitForSteps(5);
  engine->Cancel(*id);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  runner->Open();
  c.Wait(2);
  EXPECT_EQ(c[0].finish.reason, FinishReason::kCancelled);
  EXPECT_LT(c[0].tokens.size(), 30u);
  EXPECT_TRUE(c[1].finish.status.ok()) << c[1].finish.status;
  EngineOptions alone;
  alone.overlap_steps = false;
  EngineStats stats;
  const std::vector<Outcome> want =
      RunAll(CpuRunner(std::chrono::milliseconds(0)), alone, {Request{b}}, &stats);
  EXPECT_TRUE(c[1] == want[0]);
  testing::ExpectAllBlocksFree(*engine);
}

TEST(OverlapTest, AFailedStepFailsItsRequestsAndTheOneBuiltOnItIsRunAgain) {
  // Request x's prompt holds the token the runner refuses; z arrives while x's first step is
  // held at the gate, so the overlapped step built next takes x's decode and z's prefill. x
  // fails; that step is skipped, and z is scheduled again and completes as alone.
  auto owned = CpuRunner(std::chrono::milliseconds(1));
  SlowRunner* runner = owned.get();
  runner->set_fail_token(249);
  EngineOptions options;
  options.max_batch_tokens = 8;
  std::unique_ptr<Engine> engine = MakeEngine(std::move(owned), options);
  Collector c;
  GenerateRequest x = MakeGenerate(4, 8, 5, false);
  x.prompt[3] = 249;
  const GenerateRequest z = MakeGenerate(5, 8, 6, true);
  runner->Close();
  ASSERT_TRUE(engine->Submit({x}, c.For(0)).ok());
  runner->WaitForSteps(1);
  ASSERT_TRUE(engine->Submit({z}, c.For(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  runner->Open();
  c.Wait(2);
  EXPECT_EQ(c[0].finish.reason, FinishReason::kError);
  EXPECT_EQ(c[0].finish.status.code(), absl::StatusCode::kInternal) << c[0].finish.status;
  EXPECT_TRUE(c[1].finish.status.ok()) << c[1].finish.status;
  EngineOptions alone;
  alone.overlap_steps = false;
  EngineStats stats;
  const std::vector<Outcome> want =
      RunAll(CpuRunner(std::chrono::milliseconds(0)), alone, {Request{z}}, &stats);
  EXPECT_TRUE(c[1] == want[0]);
  EXPECT_GT(engine->Stats().overlapped_steps, 0);
  testing::ExpectAllBlocksFree(*engine);
}

TEST(OverlapTest, RandomizedStressKeepsInvariants) {
  // Submissions, cancellations and deadlines at random against a small cache: every request
  // ends once, every block comes back, the invariant checker finds nothing.
  EngineOptions options;
  options.kv_capacity_tokens = 160;
  options.block_size = 8;
  options.max_batch_tokens = 24;
  options.max_running = 6;
  std::unique_ptr<Engine> engine = MakeEngine(CpuRunner(std::chrono::milliseconds(1)), options);
  Collector c;
  std::mt19937 rng(12);
  std::vector<RequestId> ids;
  int submitted = 0;
  for (int k = 0; k < 60; ++k) {
    GenerateRequest g = MakeGenerate(k % 10, 1 + rng() % 40, 1 + rng() % 30, rng() % 2);
    Request r{g};
    if (rng() % 7 == 0) {
      r.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 20000);
    }
    absl::StatusOr<RequestId> id = engine->Submit(std::move(r), c.For(k));
    if (id.ok()) {
      ids.push_back(*id);
      ++submitted;
    }
    if (rng() % 5 == 0 && !ids.empty()) engine->Cancel(ids[rng() % ids.size()]);
    if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  }
  c.Wait(submitted);
  for (auto& [key, o] : c.outcomes()) EXPECT_EQ(o.finishes, 1) << "request " << key;
  EXPECT_GT(engine->Stats().overlapped_steps, 0);
  testing::ExpectAllBlocksFree(*engine);
}

}  // namespace
}  // namespace glmserve
