// The glm-client CLI against an in-process server: generate prints glm-run's tokens as they
// stream, and info / forward / health / bench work from a shell.
#include <gtest/gtest.h>

#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::StartServer;
using testing::TinyOptions;

CommandResult Cli(const std::string& target, const std::string& args) {
  return RunCommand(absl::StrCat(GLM_CLIENT_PATH, " --target=", target, " ", args));
}

TEST(CliTest, GeneratePrintsTheSameTokensAsGlmRun) {
  std::unique_ptr<GlmServer> server = StartServer();
  const std::vector<int32_t> expected = testing::GlmRunGreedy({11, 22, 33}, 12);
  const CommandResult r =
      Cli(server->target(), "--prompt=11,22,33 --max_new_tokens=12 --ignore_eos generate");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(absl::StrJoin(expected, " ")), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FINISH_REASON_LENGTH"), std::string::npos) << r.output;
}

TEST(CliTest, InfoForwardHealthAndBench) {
  ServerOptions options = TinyOptions();
  options.metrics_port = 0;
  std::unique_ptr<GlmServer> server = StartServer(options);
  const std::string target = server->target();
  CommandResult r = Cli(target, "info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Glm4MoeForCausalLM"), std::string::npos) << r.output;

  const std::vector<int32_t> greedy = testing::GlmRunGreedy({11, 22, 33}, 1);
  r = Cli(target, "--prompt=11,22,33 --logits --last_only forward");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("logits [1, 256] FP32, argmax of last row ", greedy[0])),
            std::string::npos)
      << r.output;

  r = Cli(target, "health");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SERVING"), std::string::npos);

  r = Cli(target, absl::StrCat("--requests=12 --concurrency=3 --prompt_len=4 --max_new_tokens=4 "
                               "--metrics=127.0.0.1:",
                               server->metrics_port(), " bench"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("calls ok 12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TTFT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("engine steps"), std::string::npos) << r.output;

  EXPECT_NE(Cli(target, "frobnicate").exit_code, 0);
  EXPECT_NE(Cli(target, "--prompt=1,x generate").exit_code, 0);
}

TEST(CliTest, HealthReportsNotServingWhileLoading) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  const CommandResult r = Cli(server->target(), "--wait=200ms health");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("NOT_SERVING"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace glmserve
