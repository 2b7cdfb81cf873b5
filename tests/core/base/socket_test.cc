// The TCP helpers (core/base/socket.h) over real localhost sockets: frames, limits, deadlines,
// connect retries and Shutdown.
#include "core/base/socket.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace glmserve {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// A connected pair: (client, server side).
std::pair<Socket, Socket> ConnectedPair() {
  absl::StatusOr<Socket> listener = Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  const std::string address = absl::StrCat("127.0.0.1:", listener->local_port());
  absl::StatusOr<Socket> client = Connect(address, In(absl::Seconds(5)));
  EXPECT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Socket> server = listener->Accept(In(absl::Seconds(5)));
  EXPECT_TRUE(server.ok()) << server.status();
  return {std::move(*client), std::move(*server)};
}

TEST(SocketTest, ParsesAddresses) {
  auto a = ParseHostPort("glm-0.glm:29500");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "glm-0.glm");
  EXPECT_EQ(a->port, 29500);
  auto b = ParseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  for (const char* bad :
       {"host", "host:", ":80", "host:65536", "host:-1", "host:8x", "::1:80", "[::1:80"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(Connect(bad, In(absl::Seconds(1))).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(SocketTest, FramesRoundTrip) {
  auto [client, server] = ConnectedPair();
  const std::string big(1 << 20, 'x');
  for (const std::string& payload : {std::string(), std::string("hello"), big}) {
    std::thread sender(
        [&, &c = client] { EXPECT_TRUE(SendFrame(c, 7, payload, In(absl::Seconds(5))).ok()); });
    absl::StatusOr<Frame> frame = RecvFrame(server, big.size(), In(absl::Seconds(5)));
    sender.join();
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(frame->type, 7u);
    EXPECT_EQ(frame->payload, payload);
  }
}

TEST(SocketTest, RefusesAnOversizedFrameBeforeReadingIt) {
  auto [client, server] = ConnectedPair();
  // A header claiming 2^62 bytes: refused from the header alone (no allocation, no wait).
  char header[kFrameHeaderSize] = {'G', 'L', 'M', 'F', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40};
  ASSERT_TRUE(client.SendAll(header, In(absl::Seconds(1))).ok());
  absl::StatusOr<Frame> frame = RecvFrame(server, 1024, In(absl::Seconds(5)));
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kResourceExhausted) << frame.status();
  // A wrong magic is another protocol talking.
  auto [c2, s2] = ConnectedPair();
  ASSERT_TRUE(c2.SendAll(std::string(kFrameHeaderSize, 'Z'), In(absl::Seconds(1))).ok());
  EXPECT_EQ(RecvFrame(s2, 1024, In(absl::Seconds(5))).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SocketTest, ConnectRetriesUntilALateListenerAppears) {
  // A free port: bound, then released.
  int port = 0;
  {
    absl::StatusOr<Socket> probe = Listen("127.0.0.1", 0);
    ASSERT_TRUE(probe.ok()) << probe.status();
    port = probe->local_port();
  }
  absl::StatusOr<Socket> client = absl::UnknownError("not run");
  std::thread connector(
      [&] { client = Connect(absl::StrCat("localhost:", port), In(absl::Seconds(10))); });
  absl::SleepFor(absl::Milliseconds(300));  // the connector is refused meanwhile
  absl::StatusOr<Socket> listener = Listen("127.0.0.1", port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> server = listener->Accept(In(absl::Seconds(10)));
  connector.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(SendFrame(*client, 1, std::string("hi"), In(absl::Seconds(1))).ok());
  absl::StatusOr<Frame> frame = RecvFrame(*server, 16, In(absl::Seconds(5)));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->payload, "hi");
}

TEST(SocketTest, ConnectGivesUpAtTheDeadline) {
  int port = 0;
  {
    absl::StatusOr<Socket> probe = Listen("127.0.0.1", 0);
    ASSERT_TRUE(probe.ok()) << probe.status();
    port = probe->local_port();
  }
  const absl::Time start = absl::Now();
  const absl::Status s =
      Connect(absl::StrCat("127.0.0.1:", port), In(absl::Milliseconds(300))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(SocketTest, ASilentPeerMeetsTheDeadline) {
  auto [client, server] = ConnectedPair();
  char buffer[4];
  const absl::Time start = absl::Now();
  const absl::Status s = server.RecvAll(buffer, In(absl::Milliseconds(200)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // So does an accept nobody connects to.
  absl::StatusOr<Socket> listener = Listen("", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_EQ(listener->Accept(In(absl::Milliseconds(100))).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(SocketTest, AClosedPeerIsUnavailableAndNamed) {
  auto [client, server] = ConnectedPair();
  client.Close();
  char buffer[4];
  const absl::Status s = server.RecvAll(buffer, In(absl::Seconds(5)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("127.0.0.1:"), absl::string_view::npos) << s;
  // Sending into a closed connection fails too (and raises no SIGPIPE): the first send may
  // still be buffered, a later one sees the reset.
  absl::Status sent;
  for (int i = 0; i < 100 && sent.ok(); ++i) {
    sent = server.SendAll(std::string(4096, 'x'), In(absl::Seconds(1)));
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
}

TEST(SocketTest, ShutdownWakesABlockedRecv) {
  auto [client, server] = ConnectedPair();
  absl::Status received;
  std::thread reader([&, &s = server] {
    char buffer[4];
    received = s.RecvAll(buffer, In(absl::Seconds(600)));
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  server.Shutdown();
  reader.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;
  // The peer sees the connection closed.
  char buffer[4];
  EXPECT_EQ(client.RecvAll(buffer, In(absl::Seconds(5))).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace glmserve
