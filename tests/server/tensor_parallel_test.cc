// glm-server --tensor_parallel (docs/parallel.md): the default model served by a group of CPU
// ranks gives the tokens a single rank gives, says so in ModelInfo, and the flag's misuse is
// refused at start-up with the reason.
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cpu/cpu_model.h"
#include "core/cuda/runner.h"
#include "core/model/checkpoint.h"
#include "core/model/rank_group.h"
#include "core/model/weight_shard.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

std::vector<int32_t> GreedyFrom(const std::string& target) {
  std::unique_ptr<Client> client = testing::Connect(target);
  std::vector<int32_t> tokens;
  const absl::StatusOr<v1::Finished> done = client->GenerateChunks(
      testing::GreedyRequest({5, 100, 200, 300, 42, 7, 9}, 24), [&](const v1::GenerateResponse& r) {
        for (const auto& t : r.tokens()) tokens.push_back(t.token_id());
      });
  EXPECT_TRUE(done.ok()) << done.status();
  return tokens;
}

TEST(GlmServerTensorParallelTest, TwoCpuRanksServeTheSingleRanksTokens) {
  std::string target;
  auto one = testing::StartServerProcess({"--device=cpu"}, &target, /*default_model=*/true);
  const std::vector<int32_t> want = GreedyFrom(target);
  absl::StatusOr<v1::ModelInfo> one_info = testing::Connect(target)->Info();
  ASSERT_TRUE(one_info.ok());
  one->Signal(SIGTERM);
  EXPECT_EQ(one->Wait(absl::Seconds(30)), 0);
  ASSERT_EQ(want.size(), 24u);

  auto group = testing::StartServerProcess({"--device=cpu", "--tensor_parallel=2", "--threads=2"},
                                           &target, /*default_model=*/true);
  EXPECT_NE(group->output().find("glm-server: 2 CPU ranks: "), std::string::npos)
      << group->output();
  absl::StatusOr<v1::ModelInfo> info = testing::Connect(target)->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(info->device().find("x2 ranks"), std::string::npos) << info->device();
  EXPECT_NE(info->compute().find("tensor parallel 2"), std::string::npos) << info->compute();
  // Two KV heads, one a rank: the group's KV bytes per token are one rank's twice.
  EXPECT_EQ(info->kv_bytes_per_token(), one_info->kv_bytes_per_token());
  // Every rank's weights together: the model once plus the replicated parts (norms, routers).
  EXPECT_GT(info->weight_bytes(), one_info->weight_bytes());
  EXPECT_LT(info->weight_bytes(), one_info->weight_bytes() * 11 / 10);
  EXPECT_EQ(GreedyFrom(target), want);
  group->Signal(SIGTERM);
  EXPECT_EQ(group->Wait(absl::Seconds(30)), 0);
}

TEST(GlmServerTensorParallelTest, MisuseIsRefusedAtStartUp) {
  // The default model has 4 attention heads: 3 ranks cannot share them.
  testing::CommandResult r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --tensor_parallel=3"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("4 attention heads do not split evenly"), std::string::npos) << r.output;
  // CUDA ranks need a CUDA build and as many GPUs (this test's machines have none).
  if (!CudaDeviceAvailable()) {
    r = testing::RunCommand(absl::StrCat(GLM_SERVER_PATH,
                                         " --port=0 --metrics_port=-1 --tensor_parallel=2 "
                                         "--device=cuda"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--device=cuda"), std::string::npos) << r.output;
  }
  // Several processes: evenly shared ranks, a leader address, CPU ranks.
  r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --tensor_parallel=2 --nodes=2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--leader_address"), std::string::npos) << r.output;
  r = testing::RunCommand(absl::StrCat(GLM_SERVER_PATH,
                                       " --port=0 --metrics_port=-1 --tensor_parallel=2 --nodes=4 "
                                       "--leader_address=127.0.0.1:1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot be shared evenly"), std::string::npos) << r.output;
  r = testing::RunCommand(absl::StrCat(GLM_SERVER_PATH,
                                       " --port=0 --metrics_port=-1 --tensor_parallel=2 --nodes=2 "
                                       "--node_rank=2 --leader_address=127.0.0.1:1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("node_rank"), std::string::npos) << r.output;
  r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --tensor_parallel=-1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(GlmServerTensorParallelTest, ALeaderAndAWorkerProcessServeTheSingleRanksTokens) {
  // Two glm-server processes, as two pods of a LeaderWorkerSet: the worker (node 1) holds rank
  // 1, the leader rank 0 and the front ends. The tokens are one process's; a worker that dies
  // takes the leader out of readiness with the reason.
  std::string target;
  auto one = testing::StartServerProcess({"--device=cpu"}, &target, /*default_model=*/true);
  const std::vector<int32_t> want = GreedyFrom(target);
  one->Signal(SIGTERM);
  EXPECT_EQ(one->Wait(absl::Seconds(30)), 0);

  const int leader_port = testing::FreePortPair();  // the leader takes port and port + 1
  ASSERT_NE(leader_port, 0);
  const std::string leader = absl::StrCat("127.0.0.1:", leader_port);
  const std::vector<std::string> group = {
      "--device=cpu", "--tensor_parallel=2",        "--nodes=2",
      "--threads=1",  "--leader_address=" + leader, "--group_token=test"};
  std::vector<std::string> worker_argv = {GLM_SERVER_PATH};
  worker_argv.insert(worker_argv.end(), group.begin(), group.end());
  worker_argv.push_back("--node_rank=1");
  testing::ChildProcess worker(worker_argv);
  EXPECT_FALSE(worker.ReadUntil("joining the leader").empty()) << worker.output();
  std::vector<std::string> leader_flags = group;
  leader_flags.push_back("--node_rank=0");
  auto server = testing::StartServerProcess(leader_flags, &target, /*default_model=*/true);
  absl::StatusOr<v1::ModelInfo> info = testing::Connect(target)->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(info->device().find("node 1"), std::string::npos) << info->device();
  EXPECT_EQ(GreedyFrom(target), want);

  worker.Signal(SIGKILL);
  worker.Wait(absl::Seconds(10));
  std::unique_ptr<Client> client = testing::Connect(target);
  const absl::StatusOr<v1::Finished> failed = client->GenerateChunks(
      testing::GreedyRequest({1, 2, 3}, 4), [](const v1::GenerateResponse&) {});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return *client->Health("") == grpc::health::v1::HealthCheckResponse::NOT_SERVING; }));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(30)), 0);
}

// A rank that runs normally until told to fail (as a rank whose device or memory died).
class BreakableRank final : public ModelRunner {
 public:
  BreakableRank(std::unique_ptr<ModelRunner> inner, std::atomic<bool>* broken)
      : inner_(std::move(inner)), broken_(broken) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t layer_begin() const override { return inner_->layer_begin(); }
  int64_t layer_end() const override { return inner_->layer_end(); }
  std::string device_name() const override { return inner_->device_name(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  absl::StatusOr<std::unique_ptr<KvCache>> CreateCache(int64_t blocks, int64_t size) override {
    return inner_->CreateCache(blocks, size);
  }
  absl::Status Forward(const ForwardBatch& batch, KvCache* cache, const ForwardOptions& options,
                       ForwardResult* result) override {
    if (broken_->load()) return absl::InternalError("rank 1's memory is gone");
    return inner_->Forward(batch, cache, options, result);
  }

 private:
  std::unique_ptr<ModelRunner> inner_;
  std::atomic<bool>* broken_;
};

TEST(GlmServerTensorParallelTest, ARankFailureTakesTheServerOutOfReadiness) {
  absl::StatusOr<ModelWeights> weights = LoadModel("tiny");
  ASSERT_TRUE(weights.ok());
  ParallelConfig parallel;
  parallel.tensor_parallel = 2;
  RankGroupOptions group_options;
  group_options.failure_grace = absl::Milliseconds(100);
  std::atomic<bool> broken{false};
  auto group = RankGroup::Create(
      weights->config, parallel, group_options, CreateThreadGroup(2),
      [&](int r, Communicator* comm) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        const RankLayout layout = LayoutOf(weights->config, parallel, r);
        absl::StatusOr<ModelWeights> mine = ShardWeights(*weights, layout);
        if (!mine.ok()) return mine.status();
        auto model = std::make_unique<CpuModel>(*std::move(mine), CpuMath::kExact, layout, comm);
        if (r == 0) return std::unique_ptr<ModelRunner>(std::move(model));
        return std::unique_ptr<ModelRunner>(
            std::make_unique<BreakableRank>(std::move(model), &broken));
      });
  ASSERT_TRUE(group.ok()) << group.status();
  auto server = GlmServer::Start(testing::TinyOptions());
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->Serve(*std::move(group), weights->weight_dtype).ok());
  std::unique_ptr<Client> client = testing::Connect(**server);
  EXPECT_EQ(*client->Health(""), grpc::health::v1::HealthCheckResponse::SERVING);
  auto generate = [&] {
    return client->GenerateChunks(testing::GreedyRequest({1, 2, 3}, 4),
                                  [](const v1::GenerateResponse&) {});
  };
  ASSERT_TRUE(generate().ok());
  broken = true;
  const absl::StatusOr<v1::Finished> failed = generate();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_NE(failed.status().message().find("rank 1"), std::string::npos) << failed.status();
  // Out of readiness, with the reason; new requests are refused at once.
  EXPECT_TRUE(testing::WaitUntil([&] { return !(*server)->ready(); }));
  EXPECT_EQ(*client->Health(""), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(generate().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace glmserve
