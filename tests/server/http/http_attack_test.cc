// The HTTP front end under attack (ctest label `attack`): what anyone who can open a socket
// could try, against the real server on loopback, bounded in count and time (well under a
// minute in all). Request smuggling and framing (RFC 9112), deadlines for the headers, the
// body and idle connections, the bound on connections, 1,000 idle connections and a
// 100-connection slowloris held while /v1/models, a chat completion, /metrics and gRPC each
// answer within 1 s, bodies whose parsing was quadratic, and the memory left by many refused
// 16 MiB bodies.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "tests/server/http/raw_http.h"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;
using testing::RawConnection;
using testing::RawResponse;

ServerOptions AttackOptions() {
  ServerOptions o = testing::TinyOptions();
  o.http.port = 0;
  o.metrics_port = 0;
  return o;
}

// Raises the descriptor limit to the hard one (the idle-connection test holds ~2,500).
size_t RaiseDescriptorLimit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  getrlimit(RLIMIT_NOFILE, &r);
  return static_cast<size_t>(r.rlim_cur);
}

// The process's CPU time (user + system), seconds: the in-process server's work included.
double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string Post(const std::string& path, const std::string& body,
                 const std::string& extra_fields = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n",
                      extra_fields, "Content-Length: ", body.size(), "\r\n\r\n", body);
}

const std::string kCompletion = R"({"model": "tiny", "prompt": "hi", "max_tokens": 1})";
const std::string kChat =
    R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})";

class HttpAttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ReturnLargeAllocationsToTheSystem();  // as glm-server's main does
    server_ = testing::StartTextServer(AttackOptions());
    ASSERT_NE(server_, nullptr);
    port_ = server_->http_port();
  }
  void TearDown() override {
    EXPECT_TRUE(testing::WaitUntil([&] { return testing::EngineDrained(server_->engine()); }));
  }
  RawResponse Exchange(const std::string& request, absl::Duration timeout = absl::Seconds(10)) {
    RawConnection c(port_);
    EXPECT_TRUE(c.ok());
    c.Send(request);
    return c.Read(timeout);
  }
  std::unique_ptr<GlmServer> server_;
  int port_ = 0;
};

TEST_F(HttpAttackTest, EveryFramingCaseIsRefusedWithItsStatusAndTheConnectionClosed) {
  const std::string h = "Host: t\r\n";
  // A complete second request hidden in a body: if a refused request's bytes were ever read
  // as the next request, it would be answered (200).
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n";
  std::string many_fields;
  for (int i = 0; i < 101; ++i) absl::StrAppend(&many_fields, "X-F", i, ": 1\r\n");
  struct Case {
    std::string what, request;
    int status;
    bool framing = true;  // a framing refusal closes the connection; a body's JSON does not
  };
  const int64_t steps = server_->engine()->Stats().steps;
  const std::string nul(1, '\0');
  const std::vector<Case> cases = {
      {"Content-Length and Transfer-Encoding",
       "POST /v1/completions HTTP/1.1\r\n" + h +
           "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
       400},
      {"Transfer-Encoding and Content-Length",
       "POST /v1/completions HTTP/1.1\r\n" + h +
           "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled,
       400},
      {"two different lengths",
       "POST /v1/completions HTTP/1.1\r\n" + h +
           "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}" + smuggled,
       400},
      {"the same length twice",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
       400},
      {"a list of lengths",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: 2, 2\r\n\r\n{}", 400},
      {"+N", "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: +2\r\n\r\n{}", 400},
      {"a negative length", "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\n",
       400},
      {"HTTP/1.1 without Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"101 header fields", "GET /v1/models HTTP/1.1\r\n" + h + many_fields + "\r\n", 431},
      {"a 20 KB header field",
       "GET /v1/models HTTP/1.1\r\n" + h + "X-Big: " + std::string(20000, 'a') + "\r\n\r\n", 431},
      {"NUL in a field", "GET /v1/models HTTP/1.1\r\n" + h + "X-Nul: a" + nul + "b\r\n\r\n", 400},
      {"NUL in the target", "GET /v1/mod" + nul + "els HTTP/1.1\r\n" + h + "\r\n", 400},
      {"NUL in the body",
       Post("/v1/completions", R"({"model": "tiny", "prompt": "a)" + nul + "\"}"), 400, false},
      {"bytes after the JSON value", Post("/v1/completions", kCompletion + " x"), 400, false},
      {"gzip, chunked",
       "POST /v1/completions HTTP/1.1\r\n" + h +
           "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
       501},
      {"chunked, gzip",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, gzip\r\n\r\n" +
           smuggled,
       400},
      {"gzip alone",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\n\r\n" + smuggled, 400},
      {"Transfer-Encoding on HTTP/1.0",
       "POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"a malformed chunk size",
       "POST /v1/completions HTTP/1.1\r\n" + h +
           "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
       400},
      {"HTTP/2.0 request line", "GET /v1/models HTTP/2.0\r\n" + h + "\r\n", 505},
      {"an obsolete line folding into Content-Length",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: 2\r\n 3\r\n\r\n{}", 400},
      {"GET *", "GET * HTTP/1.1\r\n" + h + "\r\n", 400},
      {"authority-form", "CONNECT t:443 HTTP/1.1\r\n" + h + "\r\n", 400},
      {"an Expect other than 100-continue",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
       417},
      {"a body over the limit (refused from its length)",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Content-Length: 17000000\r\n\r\n", 413},
      {"a chunked body over the limit",
       "POST /v1/completions HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n1100000\r\n" +
           std::string(17 << 20, ' '),
       413},
  };
  for (const Case& c : cases) {
    RawConnection conn(port_);
    ASSERT_TRUE(conn.ok());
    conn.Send(c.request);
    const RawResponse r = conn.Read();
    EXPECT_EQ(r.status, c.status) << c.what << ": " << r.body;
    EXPECT_TRUE(Json::parse(r.body, nullptr, false).contains("error")) << c.what << ": " << r.body;
    if (!c.framing) continue;
    EXPECT_EQ(r.field("connection"), "close") << c.what;
    // Closed after the refusal, with nothing answered after it.
    EXPECT_TRUE(conn.ClosedWithin(absl::Seconds(5))) << c.what;
    EXPECT_EQ(conn.extra(), "") << c.what;
  }
  EXPECT_EQ(server_->engine()->Stats().steps, steps);  // nothing reached the engine
}

TEST_F(HttpAttackTest, WellFormedEdgeCasesAreAnsweredByTheRfc) {
  // Chunk extensions are allowed (RFC 9112 7.1.1) and ignored.
  {
    const std::string a = kCompletion.substr(0, 10), b = kCompletion.substr(10);
    const std::string request = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
        absl::Hex(a.size()), ";ext=1\r\n", a, "\r\n", absl::Hex(b.size()), ";name=\"q v\"\r\n", b,
        "\r\n0\r\n\r\n");
    const RawResponse r = Exchange(request);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // Expect: 100-continue: the interim response comes before the client sends its body.
  {
    RawConnection c(port_);
    c.Send(absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n",
                        "Content-Length: ", kCompletion.size(), "\r\n\r\n"));
    EXPECT_EQ(c.Read(absl::Seconds(2)).status, 100);
    c.Send(kCompletion);
    EXPECT_EQ(c.Read().status, 200);
  }
  // HEAD: the fields of GET (its Content-Length), no body: the next response on the same
  // connection starts right after them.
  {
    RawConnection c(port_);
    c.Send("HEAD /v1/models HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n");
    const RawResponse head = c.Read(absl::Seconds(10), /*head=*/true);
    EXPECT_EQ(head.status, 200);
    const RawResponse get = c.Read();
    EXPECT_EQ(get.status, 200);
    EXPECT_EQ(head.field("content-length"), std::to_string(get.body.size()));
    EXPECT_GT(get.body.size(), 0u);
  }
  // 405 names what the route takes; OPTIONS answers the same.
  {
    const RawResponse r = Exchange(Post("/v1/models", ""));
    EXPECT_EQ(r.status, 405);
    EXPECT_EQ(r.field("allow"), "GET, HEAD, OPTIONS");
    const RawResponse get = Exchange("GET /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(get.status, 405);
    EXPECT_EQ(get.field("allow"), "POST, OPTIONS");
    const RawResponse options = Exchange("OPTIONS /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(options.status, 200);
    EXPECT_EQ(options.field("allow"), "POST, OPTIONS");
  }
  // The asterisk form (OPTIONS only) and the absolute form (its Host is ignored, RFC 9112
  // 3.2.2); HTTP/1.0 needs no Host.
  EXPECT_EQ(Exchange("OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n").field("allow"),
            "GET, HEAD, POST, OPTIONS");
  EXPECT_EQ(
      Exchange("GET http://127.0.0.1/v1/models?x=1 HTTP/1.1\r\nHost: elsewhere\r\n\r\n").status,
      200);
  EXPECT_EQ(Exchange("GET /v1/models HTTP/1.0\r\n\r\n").status, 200);
  // Keep-alive and pipelining: three requests in one write, three answers in order.
  {
    RawConnection c(port_);
    c.Send(Post("/v1/completions", kCompletion) + "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n" +
           Post("/v1/chat/completions", kChat));
    EXPECT_EQ(Json::parse(c.Read().body)["object"], "text_completion");
    EXPECT_EQ(Json::parse(c.Read().body)["object"], "list");
    EXPECT_EQ(Json::parse(c.Read().body)["object"], "chat.completion");
  }
}

TEST(HttpDeadlineTest, HeadersBodiesIdleConnectionsAndTheConnectionBound) {
  ServerOptions o = AttackOptions();
  o.http.header_timeout = absl::Seconds(1);
  o.http.body_timeout = absl::Seconds(1);
  o.http.idle_timeout = absl::Seconds(1);
  o.http.max_connections = 8;
  std::unique_ptr<GlmServer> server = testing::StartTextServer(o);
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  // Headers that never end: 408 at the header deadline, then closed.
  {
    RawConnection c(port);
    const absl::Time start = absl::Now();
    c.Send("GET /v1/models HTTP/1.1\r\nHo");
    const RawResponse r = c.Read(absl::Seconds(5));
    EXPECT_EQ(r.status, 408);
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    EXPECT_TRUE(c.ClosedWithin(absl::Seconds(5)));
  }
  // A body shorter than its Content-Length: 408 at the body deadline (not processed).
  {
    RawConnection c(port);
    c.Send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"model\"");
    const RawResponse r = c.Read(absl::Seconds(5));
    EXPECT_EQ(r.status, 408) << r.body;
    EXPECT_NE(r.body.find("whole request body"), std::string::npos) << r.body;
  }
  // A slow body (a byte every 300 ms) is bounded by the same deadline, however it trickles.
  {
    RawConnection c(port);
    c.Send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n");
    const absl::Time start = absl::Now();
    RawResponse r;
    for (int i = 0; i < 20 && r.status == 0; ++i) {
      c.Send("{");
      r = c.Read(absl::Milliseconds(300));
    }
    EXPECT_EQ(r.status, 408);
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  }
  // An idle connection is closed at the idle deadline, without a response.
  {
    RawConnection c(port);
    EXPECT_TRUE(c.ClosedWithin(absl::Seconds(4)));
    EXPECT_EQ(c.extra(), "");
  }
  // At most 8 connections: the 9th gets 503 at once and is closed; a freed slot serves again.
  {
    std::vector<std::unique_ptr<RawConnection>> held;
    for (int i = 0; i < 8; ++i) held.push_back(std::make_unique<RawConnection>(port));
    absl::SleepFor(absl::Milliseconds(100));  // accepted
    RawConnection ninth(port);
    const RawResponse r = ninth.Read(absl::Seconds(2));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.field("retry-after"), "1");
    held.clear();
    EXPECT_TRUE(testing::WaitUntil([&] {
      RawConnection c(port);
      c.Send("GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n");
      return c.Read(absl::Seconds(2)).status == 200;
    }));
  }
}

TEST(HttpBodyBudgetTest, BodiesInFlightAreBoundedTogether) {
  ServerOptions o = AttackOptions();
  o.http.max_body_bytes = 1 << 20;
  o.http.max_body_bytes_in_flight = 2 << 20;  // two largest bodies
  std::unique_ptr<GlmServer> server = testing::StartTextServer(o);
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const std::string body = kCompletion + std::string((1 << 20) - kCompletion.size(), ' ');
  const std::string head = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: t\r\n",
                                        "Content-Length: ", body.size(), "\r\n\r\n");
  // Two slow uploads of the largest body hold the whole budget...
  RawConnection first(port), second(port);
  first.Send(head);
  second.Send(head);
  absl::SleepFor(absl::Milliseconds(200));
  // ...so a third is refused before its body is read (load shedding: 429, retried later).
  RawConnection third(port);
  third.Send(head);
  const RawResponse refused = third.Read(absl::Seconds(5));
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.body.find("over the server's budget"), std::string::npos) << refused.body;
  // Once one of them is served, its share is free again.
  first.Send(body);
  EXPECT_EQ(first.Read().status, 200);
  EXPECT_TRUE(testing::WaitUntil([&] {
    RawConnection c(port);
    c.Send(head + body);
    return c.Read().status == 200;
  }));
}

TEST(HttpIdleAndSlowlorisTest, ThousandsOfIdleAndSlowConnectionsDoNotStopTheService) {
  constexpr int kIdle = 1000, kSlow = 100, kMetricsIdle = 100, kMetricsSlow = 20;
  ASSERT_GE(RaiseDescriptorLimit(), 2 * (kIdle + kSlow + kMetricsIdle + kMetricsSlow) + 200u)
      << "the test needs that many descriptors (ulimit -n)";
  std::unique_ptr<GlmServer> server = testing::StartTextServer(AttackOptions());
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const int metrics_port = server->metrics_port();
  std::vector<std::unique_ptr<RawConnection>> idle, slow;
  for (int i = 0; i < kIdle; ++i) idle.push_back(std::make_unique<RawConnection>(port));
  for (int i = 0; i < kMetricsIdle; ++i)
    idle.push_back(std::make_unique<RawConnection>(metrics_port));
  for (int i = 0; i < kSlow + kMetricsSlow; ++i) {
    slow.push_back(std::make_unique<RawConnection>(i < kSlow ? port : metrics_port));
    slow.back()->Send("GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Slow: ");
  }
  for (const auto& c : idle) ASSERT_TRUE(c->ok());
  // The slowloris: one more header byte per connection every 200 ms, for as long as the
  // test runs (the header deadline, 10 s, is longer than the test).
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    while (!stop.load()) {
      for (const auto& c : slow) c->Send("a");
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  std::unique_ptr<Client> client = testing::Connect(*server);
  const auto timed = [](auto f) {
    const absl::Time start = absl::Now();
    const bool ok = f();
    return ok ? absl::Now() - start : absl::InfiniteDuration();
  };
  for (int round = 0; round < 3; ++round) {
    const absl::Duration models = timed([&] {
      RawConnection c(port);
      c.Send("GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n");
      return c.Read(absl::Seconds(5)).status == 200;
    });
    const absl::Duration chat = timed([&] {
      RawConnection c(port);
      c.Send(Post("/v1/chat/completions", kChat));
      return c.Read(absl::Seconds(5)).status == 200;
    });
    const absl::Duration metrics = timed([&] {
      RawConnection c(metrics_port);
      c.Send("GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
      const RawResponse r = c.Read(absl::Seconds(5));
      return r.status == 200 && absl::StrContains(r.body, "glmserve_requests_total");
    });
    const absl::Duration grpc = timed([&] { return client->Info().ok(); });
    EXPECT_LT(models, absl::Seconds(1)) << "round " << round;
    EXPECT_LT(chat, absl::Seconds(1)) << "round " << round;
    EXPECT_LT(metrics, absl::Seconds(1)) << "round " << round;
    EXPECT_LT(grpc, absl::Seconds(1)) << "round " << round;
    std::printf("round %d: /v1/models %s, chat %s, /metrics %s, gRPC Info %s\n", round,
                absl::FormatDuration(models).c_str(), absl::FormatDuration(chat).c_str(),
                absl::FormatDuration(metrics).c_str(), absl::FormatDuration(grpc).c_str());
    absl::SleepFor(absl::Milliseconds(300));
  }
  stop.store(true);
  drip.join();
  // The held connections were never dropped or answered: they cost no worker.
  for (size_t i = 0; i < 10; ++i) EXPECT_FALSE(idle[i]->ClosedWithin(absl::Milliseconds(1)));
}

TEST_F(HttpAttackTest, BodiesOfAnyShapeAreRefusedOrParsedInLinearTime) {
  struct Case {
    std::string what, path, body, message;
  };
  const auto array_of = [](const std::string& item, size_t bytes) {
    std::string out = R"({"model": "tiny", "user": [)";
    while (out.size() + item.size() + 3 < bytes) absl::StrAppend(&out, item, ",");
    return out + item + "]}";
  };
  std::string quadratic = R"({"model": "x", "user": [)";
  for (int i = 0; i < 320000; ++i) absl::StrAppend(&quadratic, i ? ",{}" : "{}");
  quadratic += "]}";
  const size_t k16 = (16 << 20) - 64;
  std::string words;
  while (words.size() < k16 - 200) words += "hello world ";
  const std::vector<Case> cases = {
      {"320,000 objects (the issue's case)", "/v1/chat/completions", quadratic,
       "'messages' is required"},
      {"16 MiB of {}", "/v1/chat/completions", array_of("{}", k16), "more than 1048576 values"},
      {"16 MiB of [[[", "/v1/chat/completions", std::string(k16, '['), "nested deeper than 64"},
      {"16 MiB of token ids", "/v1/completions", array_of("1", k16), "more than 1048576 values"},
      {"16 MiB of one word", "/v1/completions",
       absl::StrCat(R"({"model": "tiny", "prompt": ")", std::string(k16 - 100, 'a'), "\"}"),
       "encodes to more than"},
      {"16 MiB of words in a chat", "/v1/chat/completions",
       Json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", words}}}}}.dump(),
       "encodes to more than"},
  };
  for (const Case& c : cases) {
    RawConnection conn(port_);
    const std::string request = Post(c.path, c.body);
    const double cpu = CpuSeconds();
    conn.Send(request);
    const RawResponse r = conn.Read(absl::Seconds(30));
    const double used = CpuSeconds() - cpu;
    EXPECT_EQ(r.status, 400) << c.what << ": " << r.body.substr(0, 300);
    EXPECT_NE(r.body.find(c.message), std::string::npos) << c.what << ": " << r.body.substr(0, 300);
    EXPECT_LE(used, 0.5) << c.what;
    std::printf("%s (%zu bytes): %d in %.3f s of CPU\n", c.what.c_str(), c.body.size(), r.status,
                used);
  }
}

TEST_F(HttpAttackTest, RefusedLargeBodiesLeaveTheMemoryWhereItWas) {
  std::string text;
  while (text.size() < (16 << 20) - 4096) text += "The quick brown fox jumps over the lazy dog. ";
  const std::string body =
      Json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", text}}}}}.dump();
  const std::string request = Post("/v1/chat/completions", body);
  const auto refuse = [&] {
    RawConnection c(port_);
    c.Send(request);
    const RawResponse r = c.Read(absl::Seconds(30));
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("encodes to more than"), std::string::npos) << r.body.substr(0, 300);
  };
  refuse();  // warm-up: per-thread caches, the allocator's first arenas
  const int64_t before = RssBytes();
  for (int i = 0; i < 50; ++i) refuse();
  const int64_t after = RssBytes();
  std::printf("RSS %lld MB before, %lld MB after 50 refused %zu-byte bodies\n",
              static_cast<long long>(before >> 20), static_cast<long long>(after >> 20),
              body.size());
  EXPECT_LE(after - before, int64_t{100} << 20);
}

}  // namespace
}  // namespace glmserve
