// The access log (server/access_log.h): line formats, and one line per call with the right
// request id, RPC, code, token counts and timings from the real server. Also the start-up
// summary glm-server prints once ready.
#include "server/access_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::GreedyRequest;
using testing::StartServer;
using testing::TinyOptions;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name, ".", getpid());
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(AccessLogTest, FormatsTextAndJson) {
  AccessRecord r;
  r.time = absl::FromUnixMillis(1700000000123);
  r.rpc = "Generate";
  r.code = "OK";
  r.request_id = "a b\"c";  // client input: quoted and escaped in text
  r.peer = "ipv4:127.0.0.1:5000";
  r.prompt_tokens = 3;
  r.generated_tokens = 4;
  r.queue_ms = 0.25;
  r.ttft_ms = 1.5;
  r.total_ms = 7.125;
  EXPECT_EQ(FormatAccessRecord(r, LogFormat::kText),
            "2023-11-14T22:13:20.123Z rpc=Generate code=OK request_id=\"a b\\\"c\" "
            "peer=ipv4:127.0.0.1:5000 prompt_tokens=3 generated_tokens=4 queue_ms=0.250 "
            "ttft_ms=1.500 total_ms=7.125");
  const nlohmann::json j = nlohmann::json::parse(FormatAccessRecord(r, LogFormat::kJson));
  EXPECT_EQ(j["time"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(j["request_id"], "a b\"c");
  EXPECT_EQ(j["generated_tokens"], 4);
  EXPECT_EQ(j["ttft_ms"], 1.5);

  AccessRecord bare;  // no id, never reached the engine
  bare.rpc = "GetModelInfo";
  bare.code = "UNAVAILABLE";
  const std::string text = FormatAccessRecord(bare, LogFormat::kText);
  EXPECT_NE(text.find(" request_id=- peer=- prompt_tokens=0 generated_tokens=0 queue_ms=- "
                      "ttft_ms=- total_ms=0.000"),
            std::string::npos)
      << text;
  EXPECT_TRUE(
      nlohmann::json::parse(FormatAccessRecord(bare, LogFormat::kJson))["queue_ms"].is_null());
  bare.request_id = std::string("\xff\xfe", 2);  // invalid UTF-8 must not throw
  EXPECT_FALSE(FormatAccessRecord(bare, LogFormat::kJson).empty());

  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AccessLog::Open("/nonexistent-dir/x.log", LogFormat::kText).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AccessLogTest, OneLinePerCallFromTheServer) {
  const std::string path = TempPath("access_log");
  std::remove(path.c_str());
  ServerOptions options = TinyOptions();
  options.access_log = path;
  options.log_format = LogFormat::kJson;
  std::unique_ptr<GlmServer> server = StartServer(options);
  ASSERT_NE(server->access_log(), nullptr);
  std::unique_ptr<Client> client = Connect(*server);

  v1::GenerateRequest generate = GreedyRequest({5, 6, 7}, 4);
  generate.set_request_id("gen-1");
  ASSERT_TRUE(client->Generate(generate, [](const v1::GeneratedToken&) {}).ok());
  v1::ForwardRequest forward;
  testing::SetIds(forward.mutable_token_ids()->mutable_ids(), {1, 2, 3, 4, 5});
  forward.set_return_logits(true);
  forward.set_request_id("fwd-1");
  ASSERT_TRUE(client->Forward(forward).ok());
  ASSERT_TRUE(client->Info().ok());
  v1::GenerateRequest bad = GreedyRequest({999}, 1);  // beyond the tiny vocabulary
  bad.set_request_id("bad-1");
  EXPECT_FALSE(client->Generate(bad, [](const v1::GeneratedToken&) {}).ok());

  // The client has its answer before the server's OnDone logs the call.
  ASSERT_TRUE(testing::WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  server->access_log()->Flush();
  std::map<std::string, nlohmann::json> by_rpc_id;
  const std::vector<std::string> lines = ReadLines(path);
  // The warm-up runs inside the engine, not through gRPC: four calls, four lines.
  ASSERT_EQ(lines.size(), 4u) << absl::StrJoin(lines, "\n");
  for (const std::string& line : lines) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    by_rpc_id[absl::StrCat(j["rpc"].get<std::string>(), "/", j["request_id"].get<std::string>())] =
        j;
  }
  for (const char* key : {"Generate/gen-1", "Forward/fwd-1", "GetModelInfo/", "Generate/bad-1"}) {
    ASSERT_EQ(by_rpc_id.count(key), 1u) << key << "\n" << absl::StrJoin(lines, "\n");
  }
  const nlohmann::json& g = by_rpc_id["Generate/gen-1"];
  EXPECT_EQ(g["code"], "OK");
  EXPECT_EQ(g["prompt_tokens"], 3);
  EXPECT_EQ(g["generated_tokens"], 4);
  EXPECT_GE(g["queue_ms"].get<double>(), 0);
  EXPECT_GE(g["ttft_ms"].get<double>(), g["queue_ms"].get<double>());
  EXPECT_GE(g["total_ms"].get<double>(), g["ttft_ms"].get<double>());
  EXPECT_NE(g["peer"].get<std::string>().find("127.0.0.1"), std::string::npos) << g;

  const nlohmann::json& f = by_rpc_id["Forward/fwd-1"];
  EXPECT_EQ(f["code"], "OK");
  EXPECT_EQ(f["prompt_tokens"], 5);
  EXPECT_EQ(f["generated_tokens"], 0);
  EXPECT_TRUE(f["ttft_ms"].is_null());
  EXPECT_FALSE(f["queue_ms"].is_null());

  const nlohmann::json& info = by_rpc_id["GetModelInfo/"];
  EXPECT_EQ(info["code"], "OK");
  EXPECT_TRUE(info["queue_ms"].is_null());

  const nlohmann::json& b = by_rpc_id["Generate/bad-1"];
  EXPECT_EQ(b["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(b["generated_tokens"], 0);
  server.reset();
  std::remove(path.c_str());
}

TEST(AccessLogTest, GlmServerPrintsTheSummaryAndTextLines) {
  const std::string path = TempPath("access_log_text");
  std::remove(path.c_str());
  std::unique_ptr<GlmServer> server;
  {
    ServerOptions options = TinyOptions();
    options.access_log = path;
    options.engine.kv_capacity_tokens = 4096;
    server = StartServer(options);
  }
  const std::string summary = server->StartupSummary();
  EXPECT_NE(summary.find("model       tiny (3 layers"), std::string::npos) << summary;
  EXPECT_NE(summary.find("device      cpu"), std::string::npos) << summary;
  EXPECT_NE(summary.find("kv cache    4096 tokens in blocks of 16"), std::string::npos) << summary;
  EXPECT_NE(summary.find(" KV cache = "), std::string::npos) << summary;
  EXPECT_NE(summary.find("max_running 64"), std::string::npos) << summary;
  EXPECT_NE(summary.find(absl::StrCat("access log ", path, " (text)")), std::string::npos)
      << summary;
  std::unique_ptr<Client> client = Connect(*server);
  ASSERT_TRUE(client->CloseSession("nope").code() == absl::StatusCode::kNotFound);
  ASSERT_TRUE(testing::WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  server->access_log()->Flush();
  const std::vector<std::string> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(" rpc=CloseSession code=NOT_FOUND request_id=- "), std::string::npos)
      << lines[0];
  server.reset();
  std::remove(path.c_str());
}

// The glm-server binary on the 5-shard golden checkpoint: progress lines while it reads the
// shards, the start-up summary, then access log lines on stdout.
TEST(AccessLogTest, GlmServerBinaryLogsProgressSummaryAndCalls) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> child = testing::StartServerProcess(
      {absl::StrCat("--model=", glmserve::testing::GoldenDir("sharded_fp32")), "--access_log=-",
       "--log_format=json"},
      &target);
  const std::string& out = child->output();
  EXPECT_NE(out.find("sharded_fp32: 0.0 of 0.8 MB (0.0%)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("sharded_fp32: 0.8 of 0.8 MB (100.0%)"), std::string::npos) << out;
  EXPECT_LT(out.find("(100.0%)"), out.find("\nmodel       ")) << out;
  EXPECT_NE(out.find("\nkv cache    32768 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("\nlogging     access log stdout (json)\n"), std::string::npos) << out;
  std::unique_ptr<Client> client = Connect(target);
  v1::GenerateRequest request = GreedyRequest({1, 2}, 3);
  request.set_request_id("from-the-binary");
  ASSERT_TRUE(client->Generate(request, [](const v1::GeneratedToken&) {}).ok());
  const std::string line = child->ReadUntil("from-the-binary");
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << line;
  EXPECT_EQ(j["rpc"], "Generate");
  EXPECT_EQ(j["generated_tokens"], 3);
  child->Signal(SIGTERM);
  EXPECT_EQ(child->Wait(absl::Seconds(30)), 0);
}

}  // namespace
}  // namespace glmserve
