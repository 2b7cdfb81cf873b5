// Ranks in another process (core/model/remote_ranks.h), with the process boundary played by a
// real TCP connection inside one test process: the leader's group holds rank 0 and a
// RemoteRanks member whose steps travel over the socket to a "worker" thread serving rank 1.
// (The ranks' sums go through the in-process communicator here; the socket communicator has
// its own tests, and tests/server/multi_node_test.sh runs real processes.)
#include "core/model/remote_ranks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "core/cpu/cpu_model.h"
#include "core/model/checkpoint.h"
#include "core/model/rank_group.h"
#include "core/model/weight_shard.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

ModelWeights Weights() {
  ModelConfig c = *PresetConfig("tiny");
  RandomWeightOptions options;
  options.seed = 5;
  options.stddev = 0.1;
  return *RandomWeights(c, options);
}

std::vector<std::vector<float>> Greedy(ModelRunner& runner, int steps, absl::Status* failure) {
  const int64_t vocab = runner.config().vocab_size;
  auto cache = runner.CreateCache(16, 4);
  if (!cache.ok()) {  // the caller checks
    *failure = cache.status();
    return {};
  }
  std::vector<std::vector<int32_t>> seqs = {{3, 17, 42, 9}, {1, 2, 3, 4, 5, 6, 7}};
  std::vector<BlockTable> tables(2);
  std::vector<int64_t> done(2, 0);
  std::vector<std::vector<float>> out;
  for (int step = 0; step <= steps; ++step) {
    ForwardBatch batch;
    std::vector<int32_t> ids;
    for (int s = 0; s < 2; ++s) {
      const int64_t n = static_cast<int64_t>(seqs[s].size()) - done[s];
      EXPECT_TRUE((*cache)->Reserve(&tables[s], done[s] + n).ok());
      batch.sequences.push_back({n, done[s], &tables[s]});
      ids.insert(ids.end(), seqs[s].begin() + done[s], seqs[s].end());
    }
    batch.token_ids = ids;
    ForwardResult result;
    *failure = runner.Forward(batch, cache->get(), ForwardOptions{}, &result);
    if (!failure->ok()) return out;
    out.push_back(result.logits);
    for (int s = 0; s < 2; ++s) {
      done[s] = static_cast<int64_t>(seqs[s].size());
      const float* row = result.logits.data() + s * vocab;
      seqs[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  return out;
}

// A leader group of two ranks whose rank 1 is served by a worker thread over TCP.
struct TwoProcesses {
  ModelWeights whole = Weights();
  ParallelConfig parallel{2, true};
  std::vector<std::unique_ptr<Communicator>> sums = CreateThreadGroup(2, absl::Seconds(20));
  std::unique_ptr<RankGroup> group;
  std::shared_ptr<RemoteChannel> worker_channel;
  absl::Status worker_stopped;
  std::thread worker;

  explicit TwoProcesses(const std::string& worker_token = "tok") {
    absl::StatusOr<Socket> listener = Listen("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.status();
    const std::string address = absl::StrCat("127.0.0.1:", listener->local_port());
    Communicator* rank1_sums = sums[1].get();
    worker = std::thread([this, address, rank1_sums, worker_token] {
      auto joined = ConnectToLeader(address, 1, worker_token, absl::Now() + absl::Seconds(20));
      if (!joined.ok()) {
        worker_stopped = joined.status();
        return;
      }
      worker_channel = joined->first;
      const RankLayout layout = LayoutOf(whole.config, parallel, 1);
      CpuModel rank1(*ShardWeights(whole, layout), CpuMath::kExact, layout, rank1_sums);
      WorkerInfo info;
      info.kv_bytes_per_token = rank1.kv_bytes_per_token();
      info.weight_bytes = rank1.weight_bytes();
      info.device_name = "cpu rank 1";
      worker_stopped = ServeLeader(*worker_channel, &rank1, info, StepLimits{});
    });
    auto channels = AcceptWorkers(*listener, 1, "tok", "", absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(channels.ok()) << channels.status();
    if (!channels.ok()) return;
    std::shared_ptr<RemoteChannel> channel = (*channels)[0];
    std::vector<std::unique_ptr<Communicator>> members;
    members.push_back(std::move(sums[0]));
    members.push_back(ChannelHandle(channel, 1, 2));
    auto made = RankGroup::Create(
        whole.config, parallel, RankGroupOptions{}, std::move(members),
        [&](int member, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
          if (member == 0) {
            const RankLayout layout = LayoutOf(whole.config, parallel, 0);
            return std::unique_ptr<ModelRunner>(std::make_unique<CpuModel>(
                *ShardWeights(whole, layout), CpuMath::kExact, layout, comm));
          }
          auto remote = RemoteRanks::Create(channel, whole.config, absl::Now() + absl::Seconds(20));
          if (!remote.ok()) return remote.status();
          return std::unique_ptr<ModelRunner>(*std::move(remote));
        });
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) group = *std::move(made);
  }
  ~TwoProcesses() {
    group.reset();  // closes the channel: the worker's ServeLeader returns
    if (worker_channel != nullptr) worker_channel->Abort(absl::CancelledError("test done"));
    worker.join();
  }
};

TEST(RemoteRanksTest, AWorkersRankOverTcpEqualsTheInProcessGroup) {
  TwoProcesses p;
  ASSERT_NE(p.group, nullptr);
  EXPECT_NE(p.group->device_name().find("cpu rank 1"), std::string::npos) << p.group->device_name();
  EXPECT_GT(p.group->kv_bytes_per_token(), p.group->rank_runner(0).kv_bytes_per_token());
  absl::Status failure;
  const auto got = Greedy(*p.group, 4, &failure);
  ASSERT_TRUE(failure.ok()) << failure;
  // The same two ranks in one process: the steps' bits must be identical.
  ParallelConfig parallel{2, true};
  auto local = RankGroup::Create(
      p.whole.config, parallel, RankGroupOptions{}, CreateThreadGroup(2),
      [&](int r, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        const RankLayout layout = LayoutOf(p.whole.config, parallel, r);
        return std::unique_ptr<ModelRunner>(std::make_unique<CpuModel>(
            *ShardWeights(p.whole, layout), CpuMath::kExact, layout, comm));
      });
  ASSERT_TRUE(local.ok()) << local.status();
  const auto want = Greedy(**local, 4, &failure);
  ASSERT_TRUE(failure.ok()) << failure;
  EXPECT_EQ(got, want);
  EXPECT_TRUE(p.group->health().ok());
}

TEST(RemoteRanksTest, AWorkerThatGoesAwayTakesTheGroupDown) {
  TwoProcesses p;
  ASSERT_NE(p.group, nullptr);
  absl::Status failure;
  std::vector<std::vector<float>> first = Greedy(*p.group, 1, &failure);
  ASSERT_EQ(first.size(), 2u) << failure;
  // A step in flight when the worker process dies (its end of the channel closes): the step
  // fails (rank 0, waiting at a sum for rank 1, is released within the group's grace), and
  // so does everything after it, CreateCache included, while health() says why.
  auto cache = *p.group->CreateCache(8, 4);
  BlockTable table;
  ASSERT_TRUE(cache->Reserve(&table, 3).ok());
  ForwardBatch batch;
  batch.sequences = {{3, 0, &table}};
  batch.token_ids = {1, 2, 3};
  ForwardResult result;
  p.worker_channel->Abort(absl::UnavailableError("worker killed"));
  const absl::Time start = absl::Now();
  failure = p.group->Forward(batch, cache.get(), ForwardOptions{}, &result);
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_NE(failure.message().find("node 1"), absl::string_view::npos) << failure;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the failure must not wait for a timeout";
  EXPECT_EQ(p.group->health().code(), absl::StatusCode::kUnavailable) << p.group->health();
  Greedy(*p.group, 1, &failure);
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
}

TEST(RemoteRanksTest, AnotherGroupsWorkerIsRefusedAndTheLeaderWaitsOn) {
  // A worker with the wrong token is told why; the leader keeps waiting for the right one.
  absl::StatusOr<Socket> listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const std::string address = absl::StrCat("127.0.0.1:", listener->local_port());
  absl::Status wrong, right;
  std::thread workers([&] {
    wrong = ConnectToLeader(address, 1, "other", absl::Now() + absl::Seconds(20)).status();
    right = ConnectToLeader(address, 1, "tok", absl::Now() + absl::Seconds(20)).status();
  });
  auto channels = AcceptWorkers(*listener, 1, "tok", "welcome", absl::Now() + absl::Seconds(20));
  workers.join();
  EXPECT_TRUE(channels.ok()) << channels.status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
  EXPECT_NE(wrong.message().find("token"), absl::string_view::npos) << wrong;
  EXPECT_TRUE(right.ok()) << right;
}

TEST(RemoteRanksTest, AMalformedStepStopsTheWorkerWithoutACrash) {
  absl::StatusOr<Socket> listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const std::string address = absl::StrCat("127.0.0.1:", listener->local_port());
  absl::Status served;
  std::thread worker([&] {
    auto joined = ConnectToLeader(address, 1, "tok", absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(joined.ok()) << joined.status();
    CpuModel model(Weights());
    WorkerInfo info;
    served = ServeLeader(*joined->first, &model, info, StepLimits{});
  });
  auto channels = AcceptWorkers(*listener, 1, "tok", "", absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(channels.ok()) << channels.status();
  ASSERT_TRUE((*channels)[0]->Receive(kFrameReady, absl::Now() + absl::Seconds(20)).ok());
  // A step whose payload is garbage: the worker refuses it and stops (the channel is unusable).
  const auto reply = (*channels)[0]->Call(static_cast<uint32_t>(StepCall::kForward), "garbage",
                                          absl::Now() + absl::Seconds(20));
  worker.join();
  EXPECT_EQ(served.code(), absl::StatusCode::kInvalidArgument) << served;
  EXPECT_FALSE(reply.ok());
}

}  // namespace
}  // namespace glmserve
