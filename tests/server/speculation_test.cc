// Speculative decoding through the server (docs/mtp.md): the trained default model's MTP
// layer on by default, reported by GetModelInfo, chosen per request over glmserve.v1, its
// counters on /metrics, and the refusals where there is no MTP layer.
#include <gtest/gtest.h>

#include <fstream>

#include "client/scrape.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::WaitUntil;

std::unique_ptr<GlmServer> KjvServer(int32_t mtp_draft_tokens) {
  ServerOptions options = testing::TinyOptions();
  options.metrics_port = 0;
  options.model_name = "glm-4.5-kjv";
  options.mtp_draft_tokens = mtp_draft_tokens;
  options.engine.kv_capacity_tokens = 4096;
  std::unique_ptr<GlmServer> server = testing::StartServer(options, /*serve=*/false);
  if (server == nullptr) return nullptr;
  absl::StatusOr<ModelWeights> w = LoadModel(testing::ModelDir("glm-4.5-kjv"));
  EXPECT_TRUE(w.ok()) << w.status();
  const DType dtype = w->weight_dtype;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(*std::move(w), DeviceKind::kCpu);
  EXPECT_TRUE(runner.ok());
  const absl::Status s = server->Serve(*std::move(runner), dtype);
  EXPECT_TRUE(s.ok()) << s;
  return server;
}

std::vector<int32_t> Tokens(Client& client, const v1::GenerateRequest& request,
                            absl::Status* status = nullptr) {
  std::vector<int32_t> tokens;
  const absl::Status s = client
                             .GenerateChunks(request,
                                             [&](const v1::GenerateResponse& r) {
                                               for (const auto& t : r.tokens())
                                                 tokens.push_back(t.token_id());
                                             })
                             .status();
  if (status != nullptr) *status = s;
  EXPECT_TRUE(status != nullptr || s.ok()) << s;
  return tokens;
}

double Metric(const GlmServer& server, const std::string& name) {
  absl::StatusOr<std::string> page =
      HttpGet(absl::StrCat("127.0.0.1:", server.metrics_port()), "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  absl::StatusOr<double> v = SampleValue(page.ok() ? *page : "", name);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status();
  return v.ok() ? *v : -1;
}

// --mtp_draft_tokens=-1 measures the step costs on the loaded model and says why it chose
// what it did; either choice is 0 or 1.
TEST(SpeculationServerTest, AutoChoosesByMeasuredCosts) {
  std::unique_ptr<GlmServer> server = KjvServer(/*mtp_draft_tokens=*/-1);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<v1::ModelInfo> info = Connect(*server)->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->has_mtp_layer());
  EXPECT_GE(info->mtp_draft_tokens(), 0);
  EXPECT_LE(info->mtp_draft_tokens(), 1);
  const std::string summary = server->StartupSummary();
  EXPECT_NE(summary.find("(auto, a verify step costs "), std::string::npos) << summary;
  EXPECT_NE(summary.find(info->mtp_draft_tokens() == 1 ? "speculation MTP layer, 1 draft token"
                                                       : "speculation off (the model has an MTP"),
            std::string::npos)
      << summary;
}

TEST(SpeculationServerTest, OnWithTheTrainedModelAndOutputsUnchanged) {
  std::unique_ptr<GlmServer> server = KjvServer(/*mtp_draft_tokens=*/1);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->mtp_draft_tokens(), 1);
  EXPECT_TRUE(info->has_mtp_layer());
  EXPECT_NE(server->StartupSummary().find("speculation MTP layer, 1 draft token per step\n"),
            std::string::npos)
      << server->StartupSummary();

  // Transformers' greedy reply to the golden prompt, whatever the drafts per step.
  std::ifstream f(testing::GoldenDir("kjv") + "/prompt.json");
  const nlohmann::json golden = nlohmann::json::parse(f);
  v1::GenerateRequest request;
  for (int32_t id : golden["ids"].get<std::vector<int32_t>>()) request.add_prompt_token_ids(id);
  request.mutable_stop()->set_max_new_tokens(64);
  request.mutable_stop()->set_ignore_eos(true);
  const std::vector<int32_t> want = golden["greedy_64"].get<std::vector<int32_t>>();
  EXPECT_EQ(Tokens(*client, request), want) << "the server's setting";
  for (int k : {0, 3, 8}) {
    request.set_mtp_draft_tokens(k);
    EXPECT_EQ(Tokens(*client, request), want) << "mtp_draft_tokens " << k;
  }
  request.set_mtp_draft_tokens(9);
  absl::Status s;
  Tokens(*client, request, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  // The counters, named as the field names them: verify steps, drafts, accepted drafts, and
  // one acceptance length per verify step.
  EXPECT_TRUE(WaitUntil(
      [&] { return Metric(*server, "glmserve_spec_decode_num_accepted_tokens_total") > 0; }));
  const double drafts = Metric(*server, "glmserve_spec_decode_num_drafts_total");
  EXPECT_GT(drafts, 0);
  EXPECT_GE(Metric(*server, "glmserve_spec_decode_num_draft_tokens_total"), drafts);
  EXPECT_EQ(Metric(*server, "glmserve_spec_decode_acceptance_length_count"), drafts);
  const double sum = Metric(*server, "glmserve_spec_decode_acceptance_length_sum");
  EXPECT_EQ(sum, drafts + Metric(*server, "glmserve_spec_decode_num_accepted_tokens_total"));
}

TEST(SpeculationServerTest, OffByFlagAndRefusedWithoutAnMtpLayer) {
  std::unique_ptr<GlmServer> off = KjvServer(/*mtp_draft_tokens=*/0);
  ASSERT_NE(off, nullptr);
  std::unique_ptr<Client> client = Connect(*off);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->mtp_draft_tokens(), 0);
  EXPECT_TRUE(info->has_mtp_layer());
  v1::GenerateRequest request;
  request.add_prompt_token_ids(5);
  request.set_mtp_draft_tokens(1);
  absl::Status s;
  Tokens(*client, request, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  // The tiny preset has no MTP layer: the default resolves to off; asking for it fails Serve.
  std::unique_ptr<GlmServer> tiny = testing::StartServer();
  ASSERT_NE(tiny, nullptr);
  absl::StatusOr<v1::ModelInfo> tiny_info = Connect(*tiny)->Info();
  ASSERT_TRUE(tiny_info.ok());
  EXPECT_EQ(tiny_info->mtp_draft_tokens(), 0);
  EXPECT_FALSE(tiny_info->has_mtp_layer());
  ServerOptions options = testing::TinyOptions();
  options.mtp_draft_tokens = 2;
  std::unique_ptr<GlmServer> asks = testing::StartServer(options, /*serve=*/false);
  ASSERT_NE(asks, nullptr);
  DType dtype;
  EXPECT_EQ(asks->Serve(testing::TinyRunner(&dtype), dtype).code(),
            absl::StatusCode::kFailedPrecondition);
  options.mtp_draft_tokens = 9;
  EXPECT_EQ(ValidateServerOptions(options).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace glmserve
