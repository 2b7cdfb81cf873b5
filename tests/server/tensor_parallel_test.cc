// glm-server --tensor_parallel (docs/parallel.md): the default model served by a group of CPU
// ranks gives the tokens a single rank gives, says so in ModelInfo, and the flag's misuse is
// refused at start-up with the reason.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

std::vector<int32_t> GreedyFrom(const std::string& target) {
  std::unique_ptr<Client> client = testing::Connect(target);
  std::vector<int32_t> tokens;
  const absl::StatusOr<v1::Finished> done = client->GenerateChunks(
      testing::GreedyRequest({5, 100, 200, 300, 42, 7, 9}, 24),
      [&](const v1::GenerateResponse& r) {
        for (const auto& t : r.tokens()) tokens.push_back(t.token_id());
      });
  EXPECT_TRUE(done.ok()) << done.status();
  return tokens;
}

TEST(GlmServerTensorParallelTest, TwoCpuRanksServeTheSingleRanksTokens) {
  std::string target;
  auto one = testing::StartServerProcess({"--device=cpu"}, &target, /*default_model=*/true);
  const std::vector<int32_t> want = GreedyFrom(target);
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
  r = testing::RunCommand(absl::StrCat(GLM_SERVER_PATH,
                                       " --port=0 --metrics_port=-1 --tensor_parallel=2 "
                                       "--device=cuda"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensor_parallel > 1 runs CPU ranks"), std::string::npos) << r.output;
  r = testing::RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --tensor_parallel=-1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace glmserve
