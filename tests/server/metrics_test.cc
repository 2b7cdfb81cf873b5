// /metrics scraped over HTTP: every documented family is present, and counters and
// histograms move by exactly the amounts known traffic implies.
#include <gtest/gtest.h>

#include <thread>

#include "client/scrape.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::EngineDrained;
using testing::GreedyRequest;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

class MetricsTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = TinyOptions()) {
    options.metrics_port = 0;
    server_ = StartServer(options);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->metrics_port(), 0);
    client_ = Connect(*server_);
  }
  std::string Scrape() {
    absl::StatusOr<std::string> page =
        HttpGet(absl::StrCat("127.0.0.1:", server_->metrics_port()), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? *page : "";
  }
  static double Value(const std::string& page, const std::string& name,
                      const std::string& labels = "") {
    absl::StatusOr<double> v = SampleValue(page, name, labels);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : -1;
  }

  std::unique_ptr<GlmServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(MetricsTest, EveryDocumentedFamilyIsExposed) {
  Start();
  const std::string page = Scrape();
  for (const char* name : {"glmserve_requests_total",
                           "glmserve_request_duration_seconds",
                           "glmserve_queue_duration_seconds",
                           "glmserve_time_to_first_token_seconds",
                           "glmserve_inter_token_latency_seconds",
                           "glmserve_prompt_tokens_total",
                           "glmserve_generation_tokens_total",
                           "glmserve_requests_running",
                           "glmserve_requests_waiting",
                           "glmserve_kv_cache_usage_ratio",
                           "glmserve_step_duration_seconds",
                           "glmserve_batch_tokens",
                           "glmserve_preemptions_total",
                           "glmserve_steps_overlapped_total",
                           "glmserve_prefix_cache_query_tokens_total",
                           "glmserve_prefix_cache_hit_tokens_total",
                           "glmserve_prefix_cache_query_blocks_total",
                           "glmserve_prefix_cache_hit_blocks_total",
                           "glmserve_request_success_total",
                           "glmserve_request_prompt_tokens",
                           "glmserve_request_generation_tokens",
                           "glmserve_request_prefill_time_seconds",
                           "glmserve_request_decode_time_seconds",
                           "glmserve_sessions_active",
                           "glmserve_build_info",
                           "process_resident_memory_bytes",
                           "process_virtual_memory_bytes",
                           "process_cpu_seconds_total",
                           "process_open_fds",
                           "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_NE(page.find(absl::StrCat("# TYPE ", name, " ")), std::string::npos) << name;
  }
  EXPECT_EQ(
      Value(page, "glmserve_build_info",
            absl::StrCat("{device=\"cpu\",model=\"tiny\",version=\"", ServerVersion(), "\"}")),
      1);
}

TEST_F(MetricsTest, CountersAndHistogramsMoveByTheRightAmounts) {
  Start();
  const std::string before = Scrape();
  // Three sequential greedy streams: 4 prompt tokens, 5 generated each (one prefill step and
  // four decode steps each: 4 + 4 tokens computed per request).
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client_->Generate(GreedyRequest({10 + i, 20, 30, 40}, 5), nullptr).ok());
  }
  v1::ForwardRequest forward;
  testing::SetIds(forward.mutable_token_ids()->mutable_ids(), {1, 2, 3});
  forward.set_return_logits(true);
  ASSERT_TRUE(client_->Forward(forward).ok());
  EXPECT_FALSE(client_->Generate(GreedyRequest({}, 5), nullptr).ok());  // INVALID_ARGUMENT
  // Call metrics are recorded when a call is done and step metrics right after the step's
  // events, both of which can trail the client's view slightly.
  ASSERT_TRUE(WaitUntil([&] { return server_->service().calls_in_flight() == 0; }));
  const auto steps = [](const std::string& page) {
    return SumSamples(page, "glmserve_step_duration_seconds_count");
  };
  std::string after;
  EXPECT_TRUE(WaitUntil([&] {
    after = Scrape();
    return steps(after) - steps(before) >= 3 * 5 + 1;
  }));

  const auto delta = [&](const std::string& name, const std::string& labels = "") {
    const absl::StatusOr<double> b = SampleValue(before, name, labels);
    return Value(after, name, labels) - (b.ok() ? *b : 0.0);
  };
  EXPECT_EQ(delta("glmserve_requests_total", "{api=\"glmserve\",code=\"OK\",rpc=\"Generate\"}"), 3);
  EXPECT_EQ(delta("glmserve_requests_total",
                  "{api=\"glmserve\",code=\"INVALID_ARGUMENT\",rpc=\"Generate\"}"),
            1);
  EXPECT_EQ(delta("glmserve_requests_total", "{api=\"glmserve\",code=\"OK\",rpc=\"Forward\"}"), 1);
  EXPECT_EQ(delta("glmserve_request_duration_seconds_count", "{api=\"glmserve\",rpc=\"Generate\"}"),
            4);
  EXPECT_EQ(delta("glmserve_request_duration_seconds_count", "{api=\"glmserve\",rpc=\"Forward\"}"),
            1);
  EXPECT_GT(delta("glmserve_request_duration_seconds_sum", "{api=\"glmserve\",rpc=\"Generate\"}"),
            0);
  EXPECT_EQ(delta("glmserve_queue_duration_seconds_count", "{rpc=\"Generate\"}"), 3);
  EXPECT_EQ(delta("glmserve_queue_duration_seconds_count", "{rpc=\"Forward\"}"), 1);
  EXPECT_EQ(delta("glmserve_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(delta("glmserve_inter_token_latency_seconds_count"), 12);
  EXPECT_EQ(delta("glmserve_prompt_tokens_total"), 3 * 4 + 3);
  EXPECT_EQ(delta("glmserve_generation_tokens_total"), 15);
  EXPECT_EQ(delta("glmserve_batch_tokens_sum"), 3 * (4 + 4) + 3);
  EXPECT_EQ(delta("glmserve_batch_tokens_count"), 3 * 5 + 1);
  EXPECT_EQ(steps(after) - steps(before), 3 * 5 + 1);
  EXPECT_EQ(delta("glmserve_step_duration_seconds_count", "{phase=\"decode\"}"), 12);
  EXPECT_GT(delta("glmserve_step_duration_seconds_sum", "{phase=\"decode\"}"), 0);
  // Bucket counts are cumulative: +inf holds every observation.
  EXPECT_EQ(delta("glmserve_inter_token_latency_seconds_bucket", "{le=\"+Inf\"}"), 12);
  EXPECT_EQ(Value(after, "glmserve_requests_running"), 0);
  EXPECT_EQ(Value(after, "glmserve_requests_waiting"), 0);
  EXPECT_EQ(Value(after, "glmserve_kv_cache_usage_ratio"), 0);
}

// The per-request families: one observation per successful engine call, with its own
// numbers; failed calls and calls that never reach the engine observe nothing.
TEST_F(MetricsTest, PerRequestHistogramsAndFinishedReasons) {
  Start();
  const std::string before = Scrape();
  // Two calls that run to max_new_tokens, one that stops at a stop token after 2 tokens.
  ASSERT_TRUE(client_->Generate(GreedyRequest({1, 2, 3}, 4), nullptr).ok());
  ASSERT_TRUE(client_->Generate(GreedyRequest({4, 5, 6, 7, 8}, 6), nullptr).ok());
  std::vector<int32_t> tokens;
  ASSERT_TRUE(client_
                  ->Generate(GreedyRequest({9, 10}, 8),
                             [&](const v1::GeneratedToken& t) { tokens.push_back(t.token_id()); })
                  .ok());
  v1::GenerateRequest stopping = GreedyRequest({9, 10}, 8);
  stopping.mutable_stop()->add_stop_token_ids(tokens[1]);
  const size_t stop_after = std::find(tokens.begin(), tokens.end(), tokens[1]) - tokens.begin() + 1;
  ASSERT_TRUE(client_->Generate(stopping, nullptr).ok());
  v1::ForwardRequest forward;
  testing::SetIds(forward.mutable_token_ids()->mutable_ids(), {1, 2, 3, 4, 5, 6, 7});
  forward.set_return_logits(true);
  ASSERT_TRUE(client_->Forward(forward).ok());
  EXPECT_FALSE(client_->Generate(GreedyRequest({}, 5), nullptr).ok());  // never reaches it
  ASSERT_TRUE(client_->Info().ok());
  ASSERT_TRUE(WaitUntil([&] { return server_->service().calls_in_flight() == 0; }));
  const std::string after = Scrape();
  const auto delta = [&](const std::string& name, const std::string& labels = "") {
    const absl::StatusOr<double> b = SampleValue(before, name, labels);
    return Value(after, name, labels) - (b.ok() ? *b : 0.0);
  };
  EXPECT_EQ(delta("glmserve_request_success_total", "{finished_reason=\"length\"}"), 3);
  EXPECT_EQ(delta("glmserve_request_success_total", "{finished_reason=\"stop\"}"), 1);
  EXPECT_EQ(delta("glmserve_request_success_total", "{finished_reason=\"forward\"}"), 1);
  EXPECT_EQ(delta("glmserve_request_prompt_tokens_count"), 5);
  EXPECT_EQ(delta("glmserve_request_prompt_tokens_sum"), 3 + 5 + 2 + 2 + 7);
  EXPECT_EQ(delta("glmserve_request_prompt_tokens_bucket", "{le=\"5\"}"), 4);  // all but 7
  EXPECT_EQ(delta("glmserve_request_generation_tokens_count"), 4);
  EXPECT_EQ(delta("glmserve_request_generation_tokens_sum"),
            4 + 6 + 8 + static_cast<double>(stop_after));
  EXPECT_EQ(delta("glmserve_request_prefill_time_seconds_count"), 4);
  EXPECT_EQ(delta("glmserve_request_decode_time_seconds_count"), 4);
  EXPECT_GT(delta("glmserve_request_decode_time_seconds_sum"), 0);
  // Only engine calls have a queue-time series; no empty series for the others.
  EXPECT_EQ(after.find("glmserve_queue_duration_seconds_count{rpc=\"GetModelInfo\"}"),
            std::string::npos);
  EXPECT_EQ(after.find("glmserve_queue_duration_seconds_count{rpc=\"CloseSession\"}"),
            std::string::npos);
  // The process: resident memory at least the model's weights' share, a start in the past.
  EXPECT_GT(Value(after, "process_resident_memory_bytes"), 1e6);
  EXPECT_GE(Value(after, "process_virtual_memory_bytes"),
            Value(after, "process_resident_memory_bytes"));
  EXPECT_GT(Value(after, "process_open_fds"), 3);
  EXPECT_GE(Value(after, "process_max_fds"), Value(after, "process_open_fds"));
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_LE(Value(after, "process_start_time_seconds"), now + 1);
  EXPECT_GT(Value(after, "process_start_time_seconds"), now - 3600);
  EXPECT_GE(Value(after, "process_cpu_seconds_total"), 0);
}

TEST_F(MetricsTest, GaugesFollowTheEngine) {
  Start();
  std::unique_ptr<GenerateStream> stream = client_->StartGenerate(GreedyRequest({1, 2, 3}, 900));
  v1::GeneratedToken t;
  ASSERT_TRUE(stream->Next(&t));
  // The engine publishes its gauges after each step: the first scrapes may predate the
  // step that produced the first token.
  std::string page;
  EXPECT_TRUE(WaitUntil([&] {
    page = Scrape();
    return Value(page, "glmserve_requests_running") == 1;
  }));
  EXPECT_GT(Value(page, "glmserve_kv_cache_usage_ratio"), 0);
  stream->Cancel();
  stream->Finish().status().IgnoreError();
  ASSERT_TRUE(WaitUntil([&] { return server_->service().calls_in_flight() == 0; }));
  page = Scrape();
  EXPECT_EQ(Value(page, "glmserve_requests_total",
                  "{api=\"glmserve\",code=\"CANCELLED\",rpc=\"Generate\"}"),
            1);
  ASSERT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
  EXPECT_EQ(Value(Scrape(), "glmserve_kv_cache_usage_ratio"), 0);

  v1::ForwardRequest forward;
  testing::SetIds(forward.mutable_token_ids()->mutable_ids(), {1, 2, 3});
  forward.set_session_id("m");
  forward.set_return_hidden_states(true);
  forward.set_create_session(true);
  absl::StatusOr<v1::ForwardResponse> r = client_->Forward(forward);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(WaitUntil([&] { return Value(Scrape(), "glmserve_sessions_active") == 1; }));
  ASSERT_TRUE(client_->CloseSession("m").ok());
  // The engine frees a closed session's blocks (and republishes its gauges) on its next
  // loop iteration.
  EXPECT_TRUE(WaitUntil([&] { return Value(Scrape(), "glmserve_sessions_active") == 0; }));
}

TEST_F(MetricsTest, PrefixCacheAndPreemptionCounters) {
  ServerOptions options = TinyOptions();
  options.engine.kv_capacity_tokens = 96;  // 6 blocks of 16
  Start(options);
  const std::string before = Scrape();
  // The same 40-token prompt twice: its two full blocks are found the second time.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 13 + 5) % 256);
  ASSERT_TRUE(client_->Generate(GreedyRequest(prompt, 1), nullptr).ok());
  ASSERT_TRUE(client_->Generate(GreedyRequest(prompt, 1), nullptr).ok());
  // The engine publishes its counters after each step, which can trail the call's end.
  // Two full blocks looked up each time, found the second time; tokens are blocks x 16.
  const auto delta = [&](const std::string& page, const std::string& name) {
    return Value(page, name) - *SampleValue(before, name);
  };
  std::string page;
  EXPECT_TRUE(WaitUntil([&] {
    page = Scrape();
    return delta(page, "glmserve_prefix_cache_hit_blocks_total") >= 2;
  }));
  EXPECT_EQ(delta(page, "glmserve_prefix_cache_query_blocks_total"), 4);
  EXPECT_EQ(delta(page, "glmserve_prefix_cache_hit_blocks_total"), 2);
  EXPECT_EQ(delta(page, "glmserve_prefix_cache_query_tokens_total"), 4 * 16);
  EXPECT_EQ(delta(page, "glmserve_prefix_cache_hit_tokens_total"), 2 * 16);

  // Three streams that each grow to 4 blocks cannot all fit in 6: someone is preempted
  // (and recomputed: every stream still completes).
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      if (client_->Generate(GreedyRequest({i + 1, 9, 9, 9}, 56), nullptr).ok()) ++ok;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 3);
  EXPECT_TRUE(WaitUntil([&] {
    page = Scrape();
    return Value(page, "glmserve_preemptions_total") >= 1;
  }));
  EXPECT_LE(Value(page, "glmserve_preemptions_total"), server_->engine()->Stats().preemptions);
}

}  // namespace
}  // namespace glmserve
