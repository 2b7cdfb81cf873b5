// Overlapped steps through the server (docs/engine.md): the trained default model served by a
// runner that samples after each step (HostSamplingRunner, what the CUDA runner does on the
// device), so the engine builds each step while the one before it runs. Transformers' greedy
// reply is unchanged; concurrent sampled, logprob and stop-string streams get the replies of a
// server whose steps run in sequence (a stop string cancels a request while a step that holds
// it runs); the overlap is counted on /metrics.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "client/scrape.h"
#include "core/engine/host_sampling_runner.h"
#include "core/text/text_assets.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::WaitUntil;

std::unique_ptr<GlmServer> KjvServer(bool overlap) {
  ServerOptions options = testing::TinyOptions();
  options.metrics_port = 0;
  options.model_name = "glm-4.5-kjv";
  options.mtp_draft_tokens = 0;  // the MTP passes keep steps in sequence
  options.engine.kv_capacity_tokens = 4096;
  options.engine.overlap_steps = overlap;
  std::unique_ptr<GlmServer> server = testing::StartServer(options, /*serve=*/false);
  if (server == nullptr) return nullptr;
  absl::StatusOr<ModelWeights> w = LoadModel(testing::ModelDir("glm-4.5-kjv"));
  absl::StatusOr<TextAssets> text = LoadTextAssets(testing::ModelDir("glm-4.5-kjv"));
  EXPECT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(w.ok()) << w.status();
  const DType dtype = w->weight_dtype;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      CreateModelRunner(*std::move(w), DeviceKind::kCpu);
  EXPECT_TRUE(runner.ok());
  const absl::Status s = server->Serve(std::make_unique<HostSamplingRunner>(*std::move(runner)),
                                       dtype, text.ok() ? *std::move(text) : TextAssets{});
  EXPECT_TRUE(s.ok()) << s;
  return server;
}

struct Reply {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  std::string stop_string;
  absl::Status status;
  bool operator==(const Reply& o) const {
    return tokens == o.tokens && logprobs == o.logprobs && text == o.text && reason == o.reason &&
           stop_string == o.stop_string && status == o.status;
  }
};

Reply Generate(Client& client, const v1::GenerateRequest& request) {
  Reply reply;
  absl::StatusOr<v1::Finished> finished =
      client.GenerateChunks(request, [&](const v1::GenerateResponse& r) {
        for (const auto& t : r.tokens()) {
          reply.tokens.push_back(t.token_id());
          reply.logprobs.push_back(t.logprob());
        }
        reply.text += r.text();
      });
  reply.status = finished.status();
  if (finished.ok()) {
    reply.reason = finished->reason();
    reply.stop_string = finished->stop_string();
  }
  return reply;
}

double Metric(const GlmServer& server, const std::string& name) {
  absl::StatusOr<std::string> page =
      HttpGet(absl::StrCat("127.0.0.1:", server.metrics_port()), "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  absl::StatusOr<double> v = SampleValue(page.ok() ? *page : "", name);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status();
  return v.ok() ? *v : -1;
}

// Request k of a mix: text prompts, greedy and seeded top-p sampling with a repetition
// penalty, logprobs, stop strings that end some replies early.
v1::GenerateRequest MixedRequest(int k) {
  static const char* kPrompts[] = {"In the beginning", "And God said", "The LORD is my shepherd",
                                   "And it came to pass", "Blessed are the"};
  v1::GenerateRequest r;
  r.set_prompt_text(kPrompts[k % 5]);
  r.mutable_stop()->set_max_new_tokens(24 + 3 * k);
  r.mutable_stop()->set_ignore_eos(true);
  if (k % 2 == 1) {
    r.mutable_sampling()->set_temperature(0.8f);
    r.mutable_sampling()->set_top_p(0.95f);
    r.mutable_sampling()->set_repetition_penalty(1.1f);
    r.mutable_sampling()->set_seed(100 + k);
  }
  if (k % 3 == 0) r.mutable_logprobs()->set_enabled(true);
  if (k % 4 == 2) r.mutable_stop()->add_stop_strings(" and");
  return r;
}

TEST(OverlapServerTest, SameRepliesAsStepsInSequence) {
  std::unique_ptr<GlmServer> overlapped = KjvServer(true), sequential = KjvServer(false);
  ASSERT_NE(overlapped, nullptr);
  ASSERT_NE(sequential, nullptr);

  // Transformers' greedy reply to the golden prompt.
  std::ifstream f(testing::GoldenDir("kjv") + "/prompt.json");
  const nlohmann::json golden = nlohmann::json::parse(f);
  v1::GenerateRequest request;
  for (int32_t id : golden["ids"].get<std::vector<int32_t>>()) request.add_prompt_token_ids(id);
  request.mutable_stop()->set_max_new_tokens(64);
  request.mutable_stop()->set_ignore_eos(true);
  EXPECT_EQ(Generate(*Connect(*overlapped), request).tokens,
            golden["greedy_64"].get<std::vector<int32_t>>());

  // Eight streams at once on each server.
  constexpr int kStreams = 8;
  auto run_all = [&](const GlmServer& server) {
    std::vector<Reply> replies(kStreams);
    std::vector<std::thread> threads;
    for (int k = 0; k < kStreams; ++k) {
      threads.emplace_back([&, k] { replies[k] = Generate(*Connect(server), MixedRequest(k)); });
    }
    for (std::thread& t : threads) t.join();
    return replies;
  };
  const std::vector<Reply> got = run_all(*overlapped), want = run_all(*sequential);
  int stopped = 0;
  for (int k = 0; k < kStreams; ++k) {
    EXPECT_TRUE(got[k].status.ok()) << "stream " << k << ": " << got[k].status;
    EXPECT_TRUE(got[k] == want[k])
        << "stream " << k << ": '" << got[k].text << "' against '" << want[k].text << "'";
    stopped += !want[k].stop_string.empty();
  }
  EXPECT_GT(stopped, 0) << "no stop string matched: that case is not exercised";

  EXPECT_TRUE(
      WaitUntil([&] { return Metric(*overlapped, "glmserve_steps_overlapped_total") > 0; }));
  EXPECT_EQ(Metric(*sequential, "glmserve_steps_overlapped_total"), 0);
}

}  // namespace
}  // namespace glmserve
