// The glm-server binary: SIGTERM / SIGINT drain readiness, refuse new calls, let calls in
// flight finish, and exit 0.
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using grpc::health::v1::HealthCheckResponse;
using testing::Connect;
using testing::GreedyRequest;
using testing::StartServerProcess;
using testing::WaitUntil;

TEST(DrainTest, SigtermFinishesCallsInFlightRefusesNewOnesAndExitsZero) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> server =
      StartServerProcess({"--drain_grace=30s"}, &target);
  ClientOptions options;
  options.max_attempts = 1;  // see UNAVAILABLE itself, not a retry
  std::unique_ptr<Client> client = Connect(target, options);
  ASSERT_EQ(*client->Health(kReadinessService), HealthCheckResponse::SERVING);

  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  const std::vector<int32_t> expected = testing::GlmRunGreedy(prompt, 500);
  std::unique_ptr<GenerateStream> stream = client->StartGenerate(GreedyRequest(prompt, 500));
  std::vector<int32_t> tokens;
  v1::GeneratedToken t;
  ASSERT_TRUE(stream->Next(&t));
  tokens.push_back(t.token_id());

  server->Signal(SIGTERM);
  EXPECT_TRUE(WaitUntil([&] {
    absl::StatusOr<HealthStatus> s = client->Health(kReadinessService);
    return s.ok() && *s == HealthCheckResponse::NOT_SERVING;
  }));
  EXPECT_EQ(client->Generate(GreedyRequest({1}, 2), nullptr).status().code(),
            absl::StatusCode::kUnavailable);

  while (stream->Next(&t)) tokens.push_back(t.token_id());
  absl::StatusOr<v1::Finished> finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(server->Wait(absl::Seconds(20)), 0) << server->output();
}

TEST(DrainTest, SigintWhenIdleExitsZeroPromptly) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> server = StartServerProcess({}, &target);
  server->Signal(SIGINT);
  EXPECT_EQ(server->Wait(absl::Seconds(5)), 0);
}

TEST(DrainTest, CallsStillRunningAfterTheGraceAreCancelledAndTheServerExitsZero) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> server =
      StartServerProcess({"--drain_grace=1ms"}, &target);
  ClientOptions options;
  options.max_attempts = 1;
  std::unique_ptr<Client> client = Connect(target, options);
  std::unique_ptr<GenerateStream> stream = client->StartGenerate(GreedyRequest({1, 2}, 1000));
  v1::GeneratedToken t;
  ASSERT_TRUE(stream->Next(&t));
  server->Signal(SIGTERM);
  while (stream->Next(&t)) {
  }
  const absl::StatusCode code = stream->Finish().status().code();
  EXPECT_EQ(code, absl::StatusCode::kUnavailable) << "a retryable code, as docs/api.md says";
  EXPECT_EQ(server->Wait(absl::Seconds(10)), 0) << server->output();
}

}  // namespace
}  // namespace glmserve
