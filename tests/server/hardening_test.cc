// What a hostile client or a careless operator could do to the server, each refused with a
// precise status (or exit code) before it costs anything: replies larger than the message
// limit, outputs beyond the in-flight budget, other callers' sessions, giant session ids,
// out-of-range flags, NaN weights.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "core/engine/runner_factory.h"
#include "core/model/checkpoint.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::RunCommand;
using testing::StartServer;
using testing::TinyOptions;

v1::ForwardRequest LogitsRequest(int tokens, v1::DataType dtype = v1::DATA_TYPE_FP32) {
  v1::ForwardRequest request;
  for (int i = 0; i < tokens; ++i) request.mutable_token_ids()->add_ids((i * 5 + 1) % 250);
  request.set_return_hidden_states(true);
  request.set_return_logits(true);
  request.set_output_dtype(dtype);
  return request;
}

// Engine steps run so far, once the loop has published its stats.
int64_t StepsSettled(GlmServer& server) {
  absl::SleepFor(absl::Milliseconds(100));
  return server.engine()->Stats().steps;
}

TEST(HardeningTest, ForwardReplyIsBoundedFromItsShapeBeforeAnyWork) {
  ServerOptions options = TinyOptions();
  options.max_message_bytes = 64 << 10;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  const int64_t steps = StepsSettled(*server);
  // 100 positions x (64 hidden + 256 logits) x 4 bytes: 128 KB, twice the limit.
  absl::StatusOr<v1::ForwardResponse> big = client->Forward(LogitsRequest(100));
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_NE(big.status().message().find("129024 bytes"), std::string::npos) << big.status();
  EXPECT_NE(big.status().message().find("65536"), std::string::npos) << big.status();
  EXPECT_EQ(StepsSettled(*server), steps) << "the refused call must not reach the engine";
  // The same positions asking for the last row only fit.
  v1::ForwardRequest last = LogitsRequest(100);
  last.set_last_position_only(true);
  EXPECT_TRUE(client->Forward(last).ok());
}

TEST(HardeningTest, OutputsInFlightStayWithinTheBudget) {
  ServerOptions options = TinyOptions();
  options.max_message_bytes = 64 << 10;
  options.service.max_output_bytes_in_flight = 64 << 10;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  // 30 rows: the engine holds 38400 fp32 bytes and the fp32 reply is 39424 (under the message
  // limit), together over the 65536-byte budget.
  absl::StatusOr<v1::ForwardResponse> fp32 = client->Forward(LogitsRequest(30));
  ASSERT_EQ(fp32.status().code(), absl::StatusCode::kResourceExhausted) << fp32.status();
  EXPECT_NE(fp32.status().message().find("in flight"), std::string::npos) << fp32.status();
  // In bf16 the reply halves and the call fits; the budget comes back after each call.
  for (int i = 0; i < 3; ++i) {
    // A call's reservation returns when its reactor is done, just after the client has the
    // reply: wait for it, which also shows nothing leaks.
    ASSERT_TRUE(
        testing::WaitUntil([&] { return server->service().output_bytes_in_flight() == 0; }));
    absl::StatusOr<v1::ForwardResponse> bf16 =
        client->Forward(LogitsRequest(30, v1::DATA_TYPE_BF16));
    EXPECT_TRUE(bf16.ok()) << bf16.status();
  }
}

TEST(HardeningTest, SessionsAreInvisibleToOtherTokens) {
  const std::string dir = glmserve::testing::MakeTempDir("glmserve_sessions");
  const std::string token_file = dir + "/tokens";
  std::ofstream(token_file) << "token-a\ntoken-b\n";
  ServerOptions options = TinyOptions();
  options.auth_token_file = token_file;
  std::unique_ptr<GlmServer> server = StartServer(options);
  ClientOptions a_options, b_options;
  a_options.token = "token-a";
  b_options.token = "token-b";
  std::unique_ptr<Client> a = Connect(*server, a_options);
  std::unique_ptr<Client> b = Connect(*server, b_options);

  v1::ForwardRequest create = LogitsRequest(3);
  create.set_return_logits(false);
  create.set_session_id("shared-name");
  create.set_create_session(true);
  ASSERT_TRUE(a->Forward(create).ok());
  v1::ForwardRequest next = create;
  next.set_create_session(false);
  EXPECT_EQ(b->Forward(next).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->CloseSession("shared-name").code(), absl::StatusCode::kNotFound);
  // B's own session of the same name is a different session.
  ASSERT_TRUE(b->Forward(create).ok());
  EXPECT_TRUE(b->CloseSession("shared-name").ok());
  absl::StatusOr<v1::ForwardResponse> continued = a->Forward(next);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_EQ(continued->start_position(), 3);
  EXPECT_TRUE(a->CloseSession("shared-name").ok());
}

TEST(HardeningTest, HugeSessionIdsAreRefusedWithoutEcho) {
  std::unique_ptr<GlmServer> server = StartServer();
  std::unique_ptr<Client> client = Connect(*server);
  const absl::Status s = client->CloseSession(std::string(1 << 20, 'z'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(s.message().size(), 200u);
  v1::ForwardRequest request = LogitsRequest(2);
  request.set_session_id(std::string(300, 'q'));
  request.set_create_session(true);
  EXPECT_EQ(client->Forward(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HardeningTest, FlagsOutsideTheirRangeExitWithCode2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--port=70000", "--port"},
      {"--port=-1", "--port"},
      {"--metrics_port=65536", "--metrics_port"},
      {"--max_message_bytes=0", "--max_message_bytes"},
      {"--max_message_bytes=-5", "--max_message_bytes"},
      {"--max_message_bytes=4294967296", "--max_message_bytes"},
      {"--block_size=1099511627776 --kv_capacity_tokens=18014398509481984", "block_size"},
      {"--kv_capacity_tokens=1099511627776", "kv_capacity_tokens"},
      {"--max_batch_tokens=0", "max_batch_tokens"},
      {"--threads=-3", "--threads"},
      {"--session_kv_fraction=1.5", "session_kv_fraction"},
      {"--default_max_new_tokens=100 --max_new_tokens=50", "--default_max_new_tokens"},
      {"--max_output_bytes_in_flight=1024", "--max_output_bytes_in_flight"},
      {"--verify_weights=sometimes", "--verify_weights"},
      {"--device=tpu", "tpu"},
      {"--layers=3", "--layers"},
      {"--drain_grace=-1s", "--drain_grace"},
      {"--log_format=xml", "--log_format"},
  };
  for (const auto& [flags, named] : cases) {
    const testing::CommandResult r =
        RunCommand(absl::StrCat(GLM_SERVER_PATH, " --model=tiny --metrics_port=-1 ", flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_NE(r.output.find("invalid flag"), std::string::npos) << flags << ": " << r.output;
    EXPECT_NE(r.output.find(named), std::string::npos) << flags << ": " << r.output;
  }
}

TEST(HardeningTest, TokenFileWithoutTlsWarns) {
  const std::string dir = glmserve::testing::MakeTempDir("glmserve_warn");
  std::ofstream(dir + "/tokens") << "t\n";
  // A model path that does not exist stops the server right after the warning.
  const testing::CommandResult r = RunCommand(
      absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --auth_token_file=", dir,
                   "/tokens --model=", dir, "/no-such-model"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("warning: --auth_token_file without --tls_cert"), std::string::npos)
      << r.output;
}

// A FIFO given as the token file (or a certificate) fails start-up at once instead of
// blocking it forever.
TEST(HardeningTest, SecretFilesMustBeRegularFiles) {
  const std::string dir = glmserve::testing::MakeTempDir("glmserve_fifo");
  ASSERT_EQ(::mkfifo((dir + "/tokens").c_str(), 0600), 0);
  ServerOptions options = TinyOptions();
  options.auth_token_file = dir + "/tokens";
  absl::StatusOr<std::unique_ptr<GlmServer>> server = GlmServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("not a regular file"), std::string::npos)
      << server.status();
}

// A checkpoint whose final norm holds a NaN.
std::string NanCheckpoint() {
  const std::string dir = glmserve::testing::MakeTempDir("glmserve_nan");
  absl::StatusOr<glmserve::ModelWeights> w = glmserve::LoadModel("tiny");
  EXPECT_TRUE(w.ok());
  w->final_norm[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(glmserve::SaveCheckpoint(*w, dir).ok());
  return dir;
}

TEST(HardeningTest, NonFiniteWeightsAreRefusedAtLoad) {
  const std::string dir = NanCheckpoint();
  const testing::CommandResult r =
      RunCommand(absl::StrCat(GLM_SERVER_PATH, " --port=0 --metrics_port=-1 --model=", dir));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tensor 'model.norm.weight' holds a non-finite value"), std::string::npos)
      << r.output;
}

TEST(HardeningTest, NonFiniteLogitsFailAsInternalNotInventedTokens) {
  const std::string dir = NanCheckpoint();
  absl::StatusOr<glmserve::ModelWeights> w =
      glmserve::LoadModel(dir, {}, {}, {.verify = glmserve::VerifyWeights::kOff});
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<GlmServer>> server = GlmServer::Start(TinyOptions());
  ASSERT_TRUE(server.ok());
  absl::StatusOr<std::unique_ptr<glmserve::ModelRunner>> runner =
      glmserve::CreateModelRunner(*std::move(w), glmserve::DeviceKind::kCpu);
  ASSERT_TRUE(runner.ok());
  // The warm-up request itself meets the NaN: serving must refuse to turn ready.
  const absl::Status serve = (*server)->Serve(*std::move(runner), glmserve::DType::kBF16);
  EXPECT_FALSE(serve.ok());
  EXPECT_NE(serve.message().find("non-finite"), std::string::npos) << serve;
  EXPECT_FALSE((*server)->ready());
}

}  // namespace
}  // namespace glmserve
