// The glm-client CLI against an in-process server: generate prints glm-run's tokens as they
// stream, and info / forward / health / bench work from a shell.
#include <gtest/gtest.h>

#include "google/protobuf/descriptor.h"
#include "nlohmann/json.hpp"
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

// Every field name of `descriptor`, nested messages' included.
void CollectFieldNames(const google::protobuf::Descriptor* descriptor,
                       std::vector<std::string>* names) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    names->push_back(descriptor->field(i)->name());
    if (descriptor->field(i)->message_type() != nullptr) {
      CollectFieldNames(descriptor->field(i)->message_type(), names);
    }
  }
}

TEST(CliTest, InfoPrintsEveryFieldZerosIncludedAndJson) {
  std::unique_ptr<GlmServer> server = StartServer();
  CommandResult r = Cli(server->target(), "info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Protobuf's text format dropped zero fields; every one is printed now.
  EXPECT_NE(r.output.find("\nlayer_begin: 0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  n_group: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("weight_dtype: DATA_TYPE_"), std::string::npos) << r.output;
  std::vector<std::string> names;
  CollectFieldNames(v1::ModelInfo::descriptor(), &names);
  for (const std::string& name : names) {
    EXPECT_NE(r.output.find(name + ":"), std::string::npos) << name << "\n" << r.output;
  }

  r = Cli(server->target(), "--json info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json info = nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(info.is_object()) << r.output;
  EXPECT_EQ(info["layer_begin"], 0);
  EXPECT_EQ(info["kv_capacity_tokens"], server->engine()->kv_capacity_tokens());
  EXPECT_EQ(info["model"], "tiny");
  EXPECT_TRUE(info["config"]["vocab_size"].is_number()) << r.output;  // not a quoted int64
  EXPECT_EQ(info["limits"]["max_running"], server->engine()->options().max_running);
}

TEST(CliTest, CloseSessionFreesAForwardSession) {
  std::unique_ptr<GlmServer> server = StartServer();
  const std::string target = server->target();
  CommandResult r = Cli(target, "--prompt=1,2,3 --session=s1 --create_session forward");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(server->engine()->Stats().sessions, 1);
  r = Cli(target, "--session=s1 close-session");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("closed session s1"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::WaitUntil([&] { return server->engine()->Stats().sessions == 0; }));
  // Gone: closing again is NOT_FOUND, and a call continuing it fails.
  r = Cli(target, "--session=s1 close-session");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("NOT_FOUND"), std::string::npos) << r.output;
  EXPECT_NE(Cli(target, "--prompt=4 --session=s1 forward").exit_code, 0);
  r = Cli(target, "close-session");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--session"), std::string::npos) << r.output;
  r = Cli(target, "--json --prompt=1,2 --session=s2 --create_session forward");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Cli(target, "--json --session=s2 close-session").output,
            "{\"closed\":true,\"session_id\":\"s2\"}\n");
}

TEST(CliTest, GenerateSendsEverySamplingFieldAndPrintsJson) {
  std::unique_ptr<GlmServer> server = StartServer();
  const std::string target = server->target();
  const std::vector<int32_t> expected = testing::GlmRunGreedy({11, 22, 33}, 8);
  // A stop id ends generation at its first occurrence (included).
  const int32_t stop = expected[3];
  const size_t stop_at = std::find(expected.begin(), expected.end(), stop) - expected.begin() + 1;
  CommandResult r = Cli(target, absl::StrCat("--prompt=11,22,33 --max_new_tokens=8 --ignore_eos "
                                             "--request_id=req-7 --json --stop_token_ids=",
                                             stop, " generate"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.output;
  ASSERT_EQ(out["tokens"].size(), stop_at) << r.output;
  for (size_t i = 0; i < stop_at; ++i) EXPECT_EQ(out["tokens"][i]["token_id"], expected[i]);
  EXPECT_EQ(out["finished"]["reason"], "FINISH_REASON_STOP");
  EXPECT_EQ(out["finished"]["request_id"], "req-7");
  EXPECT_EQ(out["finished"]["generated_tokens"], static_cast<int64_t>(stop_at));

  r = Cli(target, "--prompt=11,22,33 --request_id=req-8 generate");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(request req-8)"), std::string::npos) << r.output;
  // The sampling flags reach the server: out-of-range values come back naming the field.
  r = Cli(target, "--prompt=1,2 --min_p=1.5 generate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("min_p"), std::string::npos) << r.output;
  r = Cli(target, "--prompt=1,2 --repetition_penalty=0 generate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("repetition_penalty"), std::string::npos) << r.output;
  r = Cli(target, "--stop_token_ids=1,x generate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--stop_token_ids: 'x'"), std::string::npos) << r.output;
  // Valid values sample: seeded, so two runs agree.
  const std::string sampled =
      "--prompt=11,22,33 --max_new_tokens=6 --ignore_eos --temperature=0.9 --min_p=0.05 "
      "--repetition_penalty=1.3 --seed=5 --json generate";
  r = Cli(target, sampled);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"],
            nlohmann::json::parse(Cli(target, sampled).output)["tokens"]);
}

TEST(CliTest, ForwardHealthAndBenchPrintJson) {
  std::unique_ptr<GlmServer> server = StartServer();
  const std::string target = server->target();
  const std::vector<int32_t> greedy = testing::GlmRunGreedy({11, 22, 33}, 1);
  CommandResult r =
      Cli(target, "--json --prompt=11,22,33 --logits --last_only --request_id=f1 forward");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json out = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.output;
  EXPECT_EQ(out["rows"], 1);
  EXPECT_EQ(out["request_id"], "f1");
  EXPECT_EQ(out["logits"]["shape"], nlohmann::json::array({1, 256}));
  EXPECT_EQ(out["logits"]["argmax_last_row"], greedy[0]);
  EXPECT_FALSE(out.contains("hidden_states"));

  r = Cli(target, "--json health");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "{\"service\":\"readiness\",\"status\":\"SERVING\"}\n");

  // Every call fails (prompt beyond the model's positions): the bench stops after 3 in a row
  // instead of running for its minute, and reports the failure rate.
  r = Cli(target,
          "--json --duration=60s --concurrency=2 --prompt_len=2000 "
          "--max_consecutive_failures=3 bench");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  out = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.output;
  EXPECT_EQ(out["stopped_on_failures"], true);
  EXPECT_GE(out["failed"].get<int64_t>(), 3);
  EXPECT_LE(out["failed"].get<int64_t>(), 4);  // the other worker's call in flight
  EXPECT_EQ(out["failure_rate"], 1.0);
  EXPECT_LT(out["wall_seconds"].get<double>(), 30);
}

}  // namespace
}  // namespace glmserve
