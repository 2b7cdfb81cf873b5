// RankGroup (core/model/rank_group.h) with stand-in ranks: every rank runs each step, rank 0's
// result is the step's, a refusal every rank makes alike leaves the group healthy, and a rank
// that fails alone (or never arrives) poisons the group instead of hanging it.
#include "core/model/rank_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "core/base/parallel.h"
#include "core/model/config.h"

namespace glmserve {
namespace {

// A runner whose step sums (rank + 1) over the group and reports it as logits row [1]. Steps
// with a token id of -1 are refused before any collective (as a malformed batch is); with
// `fail_at_step` the rank fails on its own at that step.
class SumRunner final : public ModelRunner {
 public:
  SumRunner(const ModelConfig& c, Communicator* comm, int fail_at_step)
      : config_(c), comm_(comm), fail_at_step_(fail_at_step) {}
  const ModelConfig& config() const override { return config_; }
  int64_t layer_begin() const override { return 0; }
  int64_t layer_end() const override { return config_.num_hidden_layers; }
  std::string device_name() const override { return "sum"; }
  int64_t weight_bytes() const override { return 100; }
  int64_t kv_bytes_per_token() const override { return 10; }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t blocks, int64_t size) override {
    KvCacheShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 1;
    shape.block_size = size;
    shape.num_blocks = blocks;
    return std::make_unique<KvCache>(shape);
  }
  absl::Status Forward(const ForwardBatch& batch, KvCache*, const ForwardOptions&,
                       ForwardResult* result) override {
    ++steps_;
    threads_seen_ = NumThreads();
    if (!batch.token_ids.empty() && batch.token_ids[0] == -1) {
      return absl::InvalidArgumentError("token id -1");
    }
    if (steps_ == fail_at_step_) return absl::InternalError("out of memory on this rank");
    float x = static_cast<float>(comm_->rank() + 1);
    if (absl::Status s = comm_->AllReduceSum(&x, 1); !s.ok()) return s;
    result->logits = {x};
    return absl::OkStatus();
  }
  int threads_seen_ = 0;

 private:
  ModelConfig config_;
  Communicator* comm_;
  int fail_at_step_;
  int steps_ = 0;
};

std::unique_ptr<RankGroup> MakeGroup(int n, int failing_rank, int fail_at_step,
                                     std::vector<SumRunner*>* runners = nullptr) {
  const ModelConfig c = *PresetConfig("tiny");
  ParallelConfig parallel;
  parallel.tensor_parallel = n;
  RankGroupOptions options;
  options.threads_per_rank = 2;
  options.failure_grace = absl::Milliseconds(100);
  if (runners != nullptr) runners->assign(n, nullptr);
  auto group = RankGroup::Create(
      c, parallel, options, CreateThreadGroup(n, absl::Seconds(600)),
      [&](int r, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        auto runner = std::make_unique<SumRunner>(c, comm, r == failing_rank ? fail_at_step : -1);
        if (runners != nullptr) (*runners)[r] = runner.get();
        return std::unique_ptr<ModelRunner>(std::move(runner));
      });
  EXPECT_TRUE(group.ok()) << group.status();
  return *std::move(group);
}

absl::Status Step(RankGroup& group, KvCache* cache, int32_t token, ForwardResult* result) {
  const std::vector<int32_t> ids = {token};
  BlockTable table;
  ForwardBatch batch;
  batch.token_ids = ids;
  return group.Forward(batch, cache, ForwardOptions{}, result);
}

TEST(RankGroupTest, EveryRankRunsEachStepOnItsOwnPool) {
  std::vector<SumRunner*> runners;
  auto group = MakeGroup(3, -1, -1, &runners);
  auto cache = group->CreateCache(4, 4);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->num_ranks(), 3);
  ForwardResult result;
  for (int step = 0; step < 50; ++step) {
    ASSERT_TRUE(Step(*group, cache->get(), 1, &result).ok());
    EXPECT_EQ(result.logits, std::vector<float>{6.f});  // 1 + 2 + 3
  }
  for (SumRunner* r : runners)
    EXPECT_EQ(r->threads_seen_, 2);  // the rank's pool, not the process's
  EXPECT_EQ(group->weight_bytes(), 300);
  EXPECT_EQ(group->kv_bytes_per_token(), 30);
}

TEST(RankGroupTest, ARefusalEveryRankMakesIsThatStepsErrorOnly) {
  auto group = MakeGroup(2, -1, -1);
  auto cache = group->CreateCache(4, 4);
  ASSERT_TRUE(cache.ok());
  ForwardResult result;
  EXPECT_EQ(Step(*group, cache->get(), -1, &result).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(group->health().ok());
  EXPECT_TRUE(Step(*group, cache->get(), 1, &result).ok());
}

TEST(RankGroupTest, ARankFailingAlonePoisonsTheGroupWithoutAHang) {
  auto group = MakeGroup(3, /*failing_rank=*/2, /*fail_at_step=*/3);
  auto cache = group->CreateCache(4, 4);
  ASSERT_TRUE(cache.ok());
  ForwardResult result;
  ASSERT_TRUE(Step(*group, cache->get(), 1, &result).ok());
  ASSERT_TRUE(Step(*group, cache->get(), 1, &result).ok());
  // Step 3: rank 2 fails before its collective; ranks 0 and 1 wait there until the group's
  // grace (100 ms) ends and it aborts them, far sooner than their 600 s timeout.
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = Step(*group, cache->get(), 1, &result);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 2 of 3 failed"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("out of memory on this rank"), absl::string_view::npos) << s;
  EXPECT_LT(seconds, 30.0);
  // The group stays down with the reason; later steps fail at once.
  EXPECT_EQ(group->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(group->health().message().find("rank 2"), absl::string_view::npos);
  EXPECT_EQ(Step(*group, cache->get(), 1, &result).code(), absl::StatusCode::kUnavailable);
}

// A rank that hangs outside any collective (a device that stopped answering) until released.
class HangingRunner final : public ModelRunner {
 public:
  HangingRunner(const ModelConfig& c, absl::Notification* release) : c_(c), release_(release) {}
  const ModelConfig& config() const override { return c_; }
  int64_t layer_begin() const override { return 0; }
  int64_t layer_end() const override { return c_.num_hidden_layers; }
  std::string device_name() const override { return "hangs"; }
  int64_t weight_bytes() const override { return 0; }
  int64_t kv_bytes_per_token() const override { return 0; }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t blocks, int64_t size) override {
    KvCacheShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 1;
    shape.block_size = size;
    shape.num_blocks = blocks;
    return std::make_unique<KvCache>(shape);
  }
  absl::Status Forward(const ForwardBatch&, KvCache*, const ForwardOptions&,
                       ForwardResult*) override {
    release_->WaitForNotification();
    return absl::OkStatus();
  }

 private:
  ModelConfig c_;
  absl::Notification* release_;
};

TEST(RankGroupTest, ARankThatHangsOutsideACollectiveTimesTheStepOut) {
  // Rank 1 hangs where no collective timeout reaches it; rank 0 waits at its sum (600 s). The
  // step timeout (300 ms here) declares the group dead and aborts rank 0's wait.
  const ModelConfig c = *PresetConfig("tiny");
  ParallelConfig parallel;
  parallel.tensor_parallel = 2;
  RankGroupOptions options;
  options.failure_grace = absl::Milliseconds(100);
  options.step_timeout = absl::Milliseconds(300);
  absl::Notification release;
  auto group = RankGroup::Create(
      c, parallel, options, CreateThreadGroup(2, absl::Seconds(600)),
      [&](int r, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        if (r == 1)
          return std::unique_ptr<ModelRunner>(std::make_unique<HangingRunner>(c, &release));
        return std::unique_ptr<ModelRunner>(std::make_unique<SumRunner>(c, comm, -1));
      });
  ASSERT_TRUE(group.ok()) << group.status();
  auto cache = (*group)->CreateCache(4, 4);
  ASSERT_TRUE(cache.ok());
  ForwardResult result;
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = Step(**group, cache->get(), 1, &result);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("a rank hangs"), absl::string_view::npos) << s;
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE((*group)->health().ok());
  EXPECT_EQ(Step(**group, cache->get(), 1, &result).code(), absl::StatusCode::kUnavailable);
  // Let the hung rank's thread finish, and destroy the group (joining it) before the cache the
  // abandoned step still points to.
  release.Notify();
  group->reset();
}

TEST(RankGroupTest, AFailingFactoryFailsCreate) {
  const ModelConfig c = *PresetConfig("tiny");
  ParallelConfig parallel;
  parallel.tensor_parallel = 2;
  RankGroupOptions options;
  auto group = RankGroup::Create(
      c, parallel, options, CreateThreadGroup(2),
      [&](int r, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        if (r == 1) return absl::ResourceExhaustedError("rank 1: no memory for its slice");
        return std::unique_ptr<ModelRunner>(std::make_unique<SumRunner>(c, comm, -1));
      });
  EXPECT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("no memory for its slice"), absl::string_view::npos)
      << group.status();
}

}  // namespace
}  // namespace glmserve
