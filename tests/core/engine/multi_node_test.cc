// The multi-process group's assembly (core/engine/multi_node.h) with CPU ranks, leader and
// worker as threads of this process over real localhost sockets. (tests/server/
// tensor_parallel_test.cc runs them as glm-server processes.)
#include "core/engine/multi_node.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/socket.h"
#include "core/cpu/cpu_model.h"
#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

ModelWeights Weights() {
  RandomWeightOptions options;
  options.seed = 11;
  options.stddev = 0.1;
  return *RandomWeights(*PresetConfig("tiny"), options);
}

NodeGroupOptions Node(int node, int port) {
  NodeGroupOptions o;
  o.nodes = 2;
  o.node = node;
  o.leader_address = absl::StrCat("127.0.0.1:", port);
  o.token = "multi-node-test";
  o.threads_per_rank = 1;
  o.join_timeout = absl::Seconds(30);
  o.collective_timeout = absl::Seconds(30);
  return o;
}

// One prefill step of two sequences: its logits.
std::vector<float> PrefillLogits(ModelRunner& runner) {
  auto cache = runner.CreateCache(16, 4);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  const std::vector<std::vector<int32_t>> seqs = {{3, 17, 42, 9}, {1, 2, 3, 4, 5, 6, 7}};
  std::vector<BlockTable> tables(seqs.size());
  ForwardBatch batch;
  std::vector<int32_t> ids;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto n = static_cast<int64_t>(seqs[s].size());
    EXPECT_TRUE((*cache)->Reserve(&tables[s], n).ok());
    batch.sequences.push_back({n, 0, &tables[s]});
    ids.insert(ids.end(), seqs[s].begin(), seqs[s].end());
  }
  batch.token_ids = ids;
  ForwardResult result;
  const absl::Status s = runner.Forward(batch, cache->get(), ForwardOptions{}, &result);
  EXPECT_TRUE(s.ok()) << s;
  return result.logits;
}

TEST(MultiNodeTest, TheLeaderTakesTheCollectivesPortBeforeAcceptingAnyWorker) {
  const ParallelConfig parallel{2, true};
  const int port = testing::FreePortPair();
  ASSERT_NE(port, 0);
  {
    // Port + 1 taken: the leader's backend says so at once, not after the workers joined.
    absl::StatusOr<Socket> squatter = Listen("", port + 1);
    ASSERT_TRUE(squatter.ok()) << squatter.status();
    const absl::StatusOr<RankBackend> refused =
        CpuRankBackend(parallel, CpuMath::kExact, Node(0, port));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    EXPECT_NE(refused.status().message().find(absl::StrCat(port + 1)), absl::string_view::npos)
        << refused.status();
  }
  // Free: the backend holds it from now on, and a worker's backend binds nothing.
  absl::StatusOr<RankBackend> leader = CpuRankBackend(parallel, CpuMath::kExact, Node(0, port));
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_FALSE(Listen("", port + 1).ok());
  absl::StatusOr<RankBackend> worker = CpuRankBackend(parallel, CpuMath::kExact, Node(1, port));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_TRUE(Listen("", port).ok());
}

TEST(MultiNodeTest, ALeaderAndAWorkerGiveTheInProcessGroupsBits) {
  const ParallelConfig parallel{2, true};
  const int port = testing::FreePortPair();
  ASSERT_NE(port, 0);
  absl::StatusOr<RankBackend> leader_backend =
      CpuRankBackend(parallel, CpuMath::kExact, Node(0, port));
  ASSERT_TRUE(leader_backend.ok()) << leader_backend.status();
  absl::Status worker_stopped;
  std::thread worker([&] {
    absl::StatusOr<RankBackend> backend = CpuRankBackend(parallel, CpuMath::kExact, Node(1, port));
    worker_stopped =
        backend.ok() ? RunWorker(Weights(), parallel, *backend, Node(1, port)) : backend.status();
  });
  std::string how;
  absl::StatusOr<std::unique_ptr<ModelRunner>> group =
      CreateLeaderRunner(Weights(), parallel, *leader_backend, Node(0, port), &how);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_NE(how.find("2 CPU ranks over 2 processes"), std::string::npos) << how;
  const std::vector<float> got = PrefillLogits(**group);
  EXPECT_FALSE(got.empty());

  // The same two ranks in one process, as glm-server --tensor_parallel=2 builds them.
  absl::StatusOr<std::unique_ptr<ModelRunner>> local =
      CreateCpuTensorParallelRunner(Weights(), parallel, CpuMath::kExact, /*threads_per_rank=*/1);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(got, PrefillLogits(**local));

  group->reset();  // the leader goes away: the worker stops, with the reason
  worker.join();
  EXPECT_FALSE(worker_stopped.ok());
}

}  // namespace
}  // namespace glmserve
