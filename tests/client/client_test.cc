// glmserve::Client against the real server: retries (UNAVAILABLE only, with backoff),
// round-robin over every address of the target, and the benchmark library.
#include <gtest/gtest.h>

#include <thread>

#include "client/bench.h"
#include "client/scrape.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::GreedyRequest;
using testing::StartServer;
using testing::TinyOptions;

double Count(GlmServer& server, const std::string& rpc, const std::string& code) {
  absl::StatusOr<double> v =
      SampleValue(server.metrics().Scrape(), "glmserve_requests_total",
                  absl::StrCat("{api=\"glmserve\",code=\"", code, "\",rpc=\"", rpc, "\"}"));
  return v.ok() ? *v : 0;
}

ClientOptions FastRetries(int attempts) {
  ClientOptions o;
  o.max_attempts = attempts;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(80);
  return o;
}

TEST(ClientTest, RetriesUnavailableUntilTheServerIsReady) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  std::unique_ptr<Client> client = Connect(*server, FastRetries(100));
  std::thread loader([&] {
    absl::SleepFor(absl::Milliseconds(300));
    glmserve::DType dtype;
    std::unique_ptr<glmserve::ModelRunner> runner = testing::TinyRunner(&dtype);
    ASSERT_TRUE(server->Serve(std::move(runner), dtype).ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  loader.join();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_GE(Count(*server, "GetModelInfo", "UNAVAILABLE"), 1);
}

TEST(ClientTest, GivesUpAfterMaxAttemptsAndNeverRetriesOtherCodes) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  std::unique_ptr<Client> client = Connect(*server, FastRetries(3));
  EXPECT_EQ(client->Info().status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(testing::WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  EXPECT_EQ(Count(*server, "GetModelInfo", "UNAVAILABLE"), 3);

  glmserve::DType dtype;
  std::unique_ptr<glmserve::ModelRunner> runner = testing::TinyRunner(&dtype);
  ASSERT_TRUE(server->Serve(std::move(runner), dtype).ok());
  EXPECT_EQ(client->Generate(GreedyRequest({}, 3), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(testing::WaitUntil([&] { return server->service().calls_in_flight() == 0; }));
  EXPECT_EQ(Count(*server, "Generate", "INVALID_ARGUMENT"), 1);
}

TEST(ClientTest, UnreachableServerIsUnavailable) {
  ClientOptions o = FastRetries(2);
  o.timeout = absl::Seconds(5);
  std::unique_ptr<Client> client = Connect("127.0.0.1:1", o);
  EXPECT_EQ(client->Info().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ClientTest, RoundRobinSpreadsCallsOverEveryAddress) {
  std::unique_ptr<GlmServer> a = StartServer();
  std::unique_ptr<GlmServer> b = StartServer();
  // Two addresses behind one target, as a headless Service's DNS name gives.
  const std::string target = absl::StrCat("ipv4:127.0.0.1:", a->port(), ",127.0.0.1:", b->port());
  std::unique_ptr<Client> client = Connect(target);
  // round_robin connects to every address, and sends each call to the next READY one; on a
  // loaded machine the second connection can come up a little after the first calls.
  int calls = 0;
  const auto both_served = [&] {
    return Count(*a, "GetModelInfo", "OK") >= 5 && Count(*b, "GetModelInfo", "OK") >= 5;
  };
  while (!both_served() && calls < 500) {
    ASSERT_TRUE(client->Info().ok());
    ++calls;
  }
  EXPECT_TRUE(both_served()) << calls << " calls";

  // pick_first (round_robin off) keeps to one server.
  ClientOptions sticky;
  sticky.round_robin = false;
  client = Connect(target, sticky);
  // A call's metric is recorded when the server finishes it, which can trail the client's
  // view of the response: let the round-robin phase's last calls land before the baseline.
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return a->service().calls_in_flight() == 0 && b->service().calls_in_flight() == 0; }));
  const double a0 = Count(*a, "GetModelInfo", "OK"), b0 = Count(*b, "GetModelInfo", "OK");
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client->Info().ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return a->service().calls_in_flight() == 0 && b->service().calls_in_flight() == 0; }));
  const double da = Count(*a, "GetModelInfo", "OK") - a0, db = Count(*b, "GetModelInfo", "OK") - b0;
  EXPECT_TRUE((da == 10 && db == 0) || (da == 0 && db == 10)) << da << " " << db;
}

TEST(BenchTest, ReportsThroughputLatencyPercentilesAndStepTime) {
  ServerOptions options = TinyOptions();
  options.metrics_port = 0;
  std::unique_ptr<GlmServer> server = StartServer(options);
  std::unique_ptr<Client> client = Connect(*server);
  BenchOptions o;
  o.concurrency = 4;
  o.requests = 20;
  o.prompt_tokens = 8;
  o.max_new_tokens = 6;
  o.metrics_address = absl::StrCat("127.0.0.1:", server->metrics_port());
  absl::StatusOr<BenchReport> r = RunBench(*client, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 20);
  EXPECT_TRUE(r->errors.empty());
  EXPECT_EQ(r->tokens, 20 * 6);
  EXPECT_EQ(r->e2e.count, 20);
  EXPECT_EQ(r->ttft.count, 20);
  EXPECT_EQ(r->inter_token.count, 20 * 5);
  EXPECT_LE(r->e2e.p50, r->e2e.p90);
  EXPECT_LE(r->e2e.p90, r->e2e.p99);
  EXPECT_GT(r->steps, 0);
  EXPECT_GT(r->step_mean, 0);
  EXPECT_GT(r->server_engine_mean, 0);
  EXPECT_NE(FormatBenchReport(o, *r).find("p99"), std::string::npos);

  o.rpc = BenchOptions::Rpc::kForward;
  r = RunBench(*client, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 20);
  EXPECT_EQ(r->ttft.count, 0);

  // Errors are counted by code, not fatal.
  o.prompt_tokens = 2000;  // beyond the tiny model's 1024 positions
  r = RunBench(*client, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 0);
  EXPECT_EQ(r->errors["INVALID_ARGUMENT"], 20);
}

TEST(BenchTest, BacksOffWhenTheServerGoesAway) {
  std::unique_ptr<GlmServer> server = StartServer();
  ClientOptions client_options;
  client_options.max_attempts = 1;  // as glm-client bench runs
  std::unique_ptr<Client> client = Connect(*server, client_options);
  BenchOptions o;
  o.concurrency = 4;
  o.duration = absl::Seconds(3);
  o.prompt_tokens = 4;
  o.max_new_tokens = 2;
  o.max_consecutive_failures = 0;  // never give up: the backoff alone must bound the calls
  absl::StatusOr<BenchReport> r;
  std::thread bench([&] { r = RunBench(*client, o); });
  absl::SleepFor(absl::Milliseconds(500));
  server->Shutdown();  // the server goes away mid-run
  bench.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->ok, 0);
  ASSERT_GT(r->errors["UNAVAILABLE"], 0);
  // ~2.5 s without a server: per worker one call cut off by the shutdown, then UNAVAILABLE
  // calls at 0, 50, 150, 350, 750 and 1550 ms (the wait doubles from 50 ms): 7, bounded here
  // at 10 for scheduling slack. Without the backoff it was tens of thousands.
  EXPECT_LE(r->failed, 4 * 10) << FormatBenchReport(o, *r);
  EXPECT_FALSE(r->stopped_on_failures);
  EXPECT_DOUBLE_EQ(r->failure_rate, static_cast<double>(r->failed) / (r->ok + r->failed));
  EXPECT_NE(FormatBenchReport(o, *r).find("calls failed"), std::string::npos);

  // Options are checked.
  o.initial_backoff = absl::ZeroDuration();
  EXPECT_EQ(RunBench(*client, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.initial_backoff = absl::Seconds(3);
  EXPECT_EQ(RunBench(*client, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.initial_backoff = absl::Milliseconds(50);
  o.max_consecutive_failures = -1;
  EXPECT_EQ(RunBench(*client, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BenchTest, PercentilesInterpolate) {
  std::vector<double> v = {4, 1, 3, 2, 5};
  const Percentiles p = Summarize(&v);
  EXPECT_EQ(p.count, 5);
  EXPECT_DOUBLE_EQ(p.mean, 3);
  EXPECT_DOUBLE_EQ(p.p50, 3);
  EXPECT_DOUBLE_EQ(p.p90, 4.6);
  EXPECT_DOUBLE_EQ(p.p99, 4.96);
}

}  // namespace
}  // namespace glmserve
