// The TCP communicator (core/model/socket_communicator.h) over real localhost sockets: ranks as
// threads of this process, and as forked processes. Mirrors communicator_test.cc, and checks
// the sums bit for bit against CreateThreadGroup's.
#include "core/model/socket_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace glmserve {
namespace {

using Comms = std::vector<std::unique_ptr<Communicator>>;

SocketGroupOptions Options(int rank, int size, int port) {
  SocketGroupOptions o;
  o.rank = rank;
  o.size = size;
  o.leader_address = absl::StrCat("127.0.0.1:", port);
  o.token = "test-group";
  o.connect_timeout = absl::Seconds(20);
  o.collective_timeout = absl::Seconds(20);
  return o;
}

Socket EphemeralListener() {
  absl::StatusOr<Socket> listener = Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  return std::move(*listener);
}

// A group of `size` ranks, each created on its own thread (rank 0 on an ephemeral port).
Comms CreateGroup(int size, absl::Duration collective_timeout = absl::Seconds(20)) {
  Socket listener = EphemeralListener();
  const int port = listener.local_port();
  Comms comms(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      SocketGroupOptions o = Options(r, size, port);
      o.collective_timeout = collective_timeout;
      auto comm =
          r == 0 ? CreateSocketCommunicator(o, std::move(listener)) : CreateSocketCommunicator(o);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
      comms[r] = *std::move(comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// Runs body(rank, comm) on one thread per rank and waits for all.
void RunRanks(Comms& comms, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *comms[r]); });
  }
  for (std::thread& t : threads) t.join();
}

// Values whose float sum depends on the order of the ranks.
float Value(int r, int64_t i) {
  const float big[] = {1e8f, 3.f, -1e8f, 0.25f, 7e7f, -5.f, 1.f, -7e7f};
  return big[(r + i) % 8] * (1.f + 0.001f * static_cast<float>(i % 13));
}

TEST(SocketCommunicatorTest, SumsAreTheThreadGroupsBits) {
  for (const int n : {2, 3, 4}) {
    Comms sockets = CreateGroup(n);
    ASSERT_EQ(sockets.size(), static_cast<size_t>(n));
    for (auto& c : sockets) ASSERT_NE(c, nullptr);
    Comms threads = CreateThreadGroup(n);
    for (const int64_t count : {1, 5, 64, 1000}) {
      std::vector<std::vector<float>> a(n, std::vector<float>(count)), b = a;
      RunRanks(sockets, [&](int r, Communicator& comm) {
        for (int64_t i = 0; i < count; ++i) a[r][i] = Value(r, i);
        ASSERT_TRUE(comm.AllReduceSum(a[r].data(), count).ok());
      });
      RunRanks(threads, [&](int r, Communicator& comm) {
        for (int64_t i = 0; i < count; ++i) b[r][i] = Value(r, i);
        ASSERT_TRUE(comm.AllReduceSum(b[r].data(), count).ok());
      });
      for (int64_t i = 0; i < count; ++i) {
        float expect = Value(0, i);
        for (int r = 1; r < n; ++r) expect += Value(r, i);  // rank order
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(std::memcmp(&a[r][i], &b[r][i], sizeof(float)), 0)
              << "n " << n << " count " << count << " element " << i << " rank " << r;
          ASSERT_EQ(std::memcmp(&a[r][i], &expect, sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(SocketCommunicatorTest, RepeatedCollectivesOfVaryingSizes) {
  const int n = 3;
  Comms comms = CreateGroup(n);
  for (const int64_t count : {int64_t{0}, int64_t{7}, int64_t{4} << 20, int64_t{0}, int64_t{3}}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    RunRanks(comms, [&](int r, Communicator& comm) {
      for (int64_t i = 0; i < count; ++i) data[r][i] = static_cast<float>(r + 1) * (i % 1000);
      ASSERT_TRUE(comm.AllReduceSum(data[r].data(), count).ok()) << "count " << count;
    });
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; i += 997) {
        ASSERT_EQ(data[r][i], 6.f * (i % 1000)) << "count " << count << " rank " << r;
      }
    }
  }
}

TEST(SocketCommunicatorTest, GathersUnevenBlocksInRankOrder) {
  const int n = 3;
  Comms comms = CreateGroup(n);
  const std::vector<int64_t> counts = {2, 0, 3};
  std::vector<std::vector<float>> out(n, std::vector<float>(5, -1.f));
  RunRanks(comms, [&](int r, Communicator& comm) {
    std::vector<float> mine(counts[r]);
    for (int64_t i = 0; i < counts[r]; ++i) mine[i] = 10.f * r + i;
    ASSERT_TRUE(comm.AllGather(mine.data(), counts, out[r].data()).ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], (std::vector<float>{0, 1, 20, 21, 22}));
}

TEST(SocketCommunicatorTest, GathersOnTheRootOnly) {
  const int n = 3;
  const std::vector<int64_t> counts = {2, 0, 3};
  Comms comms = CreateGroup(n);
  for (const int root : {0, 2, 1, 0}) {
    std::vector<std::vector<float>> out(n, std::vector<float>(5, -1.f));
    RunRanks(comms, [&](int r, Communicator& comm) {
      std::vector<float> mine(counts[r]);
      for (int64_t i = 0; i < counts[r]; ++i) mine[i] = 10.f * r + i;
      ASSERT_TRUE(comm.Gather(mine.data(), counts, r == root ? out[r].data() : nullptr, root).ok());
    });
    const std::vector<float> gathered = {0, 1, 20, 21, 22}, untouched(5, -1.f);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[r], r == root ? gathered : untouched) << "root " << root << " rank " << r;
    }
  }
  const float one = 1.f;
  EXPECT_EQ(comms[0]->Gather(&one, std::vector<int64_t>{1, 0, 0}, nullptr, 3).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SocketCommunicatorTest, MismatchedCountsPoisonTheGroup) {
  Comms comms = CreateGroup(2);
  std::vector<absl::Status> got(2);
  RunRanks(comms, [&](int r, Communicator& comm) {
    std::vector<float> data(r == 0 ? 4 : 5, 1.f);
    got[r] = comm.AllReduceSum(data.data(), static_cast<int64_t>(data.size()));
  });
  EXPECT_EQ(got[0].code(), absl::StatusCode::kFailedPrecondition) << got[0];
  EXPECT_NE(got[0].message().find("different steps"), absl::string_view::npos) << got[0];
  EXPECT_EQ(got[1].code(), absl::StatusCode::kUnavailable) << got[1];
  EXPECT_NE(got[1].message().find("different steps"), absl::string_view::npos) << got[1];
  EXPECT_FALSE(comms[0]->health().ok());
  EXPECT_FALSE(comms[1]->health().ok());
}

TEST(SocketCommunicatorTest, RefusesAnotherGroupsTokenAndADuplicateRank) {
  const int n = 3;
  Socket listener = EphemeralListener();
  const int port = listener.local_port();
  absl::StatusOr<std::unique_ptr<Communicator>> leader, first, second;
  std::thread t0(
      [&] { leader = CreateSocketCommunicator(Options(0, n, port), std::move(listener)); });
  SocketGroupOptions stranger = Options(2, n, port);
  stranger.token = "another-group";
  const absl::Status refused = CreateSocketCommunicator(stranger).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("token"), absl::string_view::npos) << refused;
  SocketGroupOptions wrong_size = Options(1, n + 1, port);
  EXPECT_EQ(CreateSocketCommunicator(wrong_size).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::thread t1([&] { first = CreateSocketCommunicator(Options(1, n, port)); });
  // The duplicate comes once rank 1 has joined (rank 0 then sees it taken).
  absl::Status duplicate;
  for (int attempt = 0; attempt < 100; ++attempt) {
    absl::SleepFor(absl::Milliseconds(20));
    duplicate = CreateSocketCommunicator(Options(1, n, port)).status();
    if (duplicate.message().find("already joined") != absl::string_view::npos) break;
  }
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kFailedPrecondition) << duplicate;
  EXPECT_NE(duplicate.message().find("already joined"), absl::string_view::npos) << duplicate;
  // Rank 0 kept waiting for the right peers.
  std::thread t2([&] { second = CreateSocketCommunicator(Options(2, n, port)); });
  t0.join();
  t1.join();
  t2.join();
  ASSERT_TRUE(leader.ok()) << leader.status();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  Comms comms;
  comms.push_back(*std::move(leader));
  comms.push_back(*std::move(first));
  comms.push_back(*std::move(second));
  RunRanks(comms, [&](int r, Communicator& comm) {
    float x = static_cast<float>(r);
    ASSERT_TRUE(comm.AllReduceSum(&x, 1).ok());
    EXPECT_EQ(x, 3.f);
  });
}

TEST(SocketCommunicatorTest, ARankThatLeavesFailsTheOthersFast) {
  for (const int leaving : {2, 1, 0}) {
    Comms comms = CreateGroup(3, absl::Seconds(60));
    RunRanks(comms, [&](int, Communicator& comm) {
      float x = 1.f;
      ASSERT_TRUE(comm.AllReduceSum(&x, 1).ok());
    });
    comms[leaving].reset();  // closes its connections, as an exiting process would
    const absl::Time start = absl::Now();
    std::vector<absl::Status> got(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      if (r == leaving) continue;
      threads.emplace_back([&, r] {
        float x = 1.f;
        got[r] = comms[r]->AllReduceSum(&x, 1);
      });
    }
    for (std::thread& t : threads) t.join();
    // Well under the 60 s collective timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    for (int r = 0; r < 3; ++r) {
      if (r == leaving) continue;
      EXPECT_EQ(got[r].code(), absl::StatusCode::kUnavailable) << got[r];
      EXPECT_NE(got[r].message().find(absl::StrCat("rank ", leaving)), absl::string_view::npos)
          << "rank " << r << ": " << got[r];
      EXPECT_FALSE(comms[r]->health().ok());
    }
  }
}

TEST(SocketCommunicatorTest, AbortWakesARankBlockedInACollective) {
  // Abort on the blocked rank's own communicator (another thread), and on another rank's (in
  // another process, in real life): both release it long before the 600 s timeout.
  for (const int aborter : {0, 1}) {
    Comms comms = CreateGroup(2, absl::Seconds(600));
    absl::Status waited;
    std::thread waiter([&] {
      float x = 1.f;
      waited = comms[0]->AllReduceSum(&x, 1);  // rank 1 never arrives
    });
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time start = absl::Now();
    comms[aborter]->Abort(absl::InternalError("rank 1 crashed"));
    waiter.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
    EXPECT_NE(waited.message().find("rank 1 crashed"), absl::string_view::npos) << waited;
    float x = 1.f;
    EXPECT_EQ(comms[1]->AllReduceSum(&x, 1).code(), absl::StatusCode::kUnavailable);
  }
}

TEST(SocketCommunicatorTest, AMissingRankTimesOutAndPoisonsTheGroup) {
  const int n = 3;
  Comms comms = CreateGroup(n, absl::Milliseconds(300));
  std::vector<absl::Status> got(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    threads.emplace_back([&, r] {
      float x = 1.f;
      got[r] = comms[r]->AllReduceSum(&x, 1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got[0].code(), absl::StatusCode::kDeadlineExceeded) << got[0];
  EXPECT_NE(got[0].message().find("waited"), absl::string_view::npos) << got[0];
  EXPECT_FALSE(got[1].ok());
  // Every later collective of every rank fails, at once.
  for (int r = 0; r < n; ++r) {
    const absl::Time start = absl::Now();
    float x = 1.f;
    const absl::Status s = comms[r]->AllReduceSum(&x, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << "rank " << r << ": " << s;
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(250)) << "rank " << r;
    EXPECT_FALSE(comms[r]->health().ok());
  }
}

// ---- Ranks in separate processes: a forked child is rank 1.

constexpr int kChildSums = 5;

// The child's whole life: join, run the sums (checking them), then exit or wait to be killed.
// Exit codes: 0 fine, 2 no group, 3 a sum failed, 4 a wrong result.
[[noreturn]] void ChildRank(int port, bool linger) {
  auto comm = CreateSocketCommunicator(Options(1, 2, port));
  if (!comm.ok()) _exit(2);
  for (int step = 0; step < kChildSums; ++step) {
    std::vector<float> data(100, static_cast<float>(step));
    if (!(*comm)->AllReduceSum(data.data(), 100).ok()) _exit(3);
    for (float v : data) {
      if (v != 1.f + 2.f * step) _exit(4);  // rank 0 holds 1 + step
    }
  }
  while (linger) pause();
  _exit(0);
}

std::unique_ptr<Communicator> LeaderOfChild(Socket listener) {
  auto comm = CreateSocketCommunicator(Options(0, 2, 0), std::move(listener));
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

void RunLeaderSums(Communicator& comm) {
  for (int step = 0; step < kChildSums; ++step) {
    std::vector<float> data(100, 1.f + step);
    ASSERT_TRUE(comm.AllReduceSum(data.data(), 100).ok());
    for (float v : data) ASSERT_EQ(v, 1.f + 2.f * step);
  }
}

TEST(SocketCommunicatorTest, RanksInSeparateProcesses) {
  Socket listener = EphemeralListener();
  const int port = listener.local_port();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) ChildRank(port, /*linger=*/false);
  std::unique_ptr<Communicator> comm = LeaderOfChild(std::move(listener));
  ASSERT_NE(comm, nullptr);
  RunLeaderSums(*comm);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SocketCommunicatorTest, AKilledProcessFailsTheNextCollective) {
  Socket listener = EphemeralListener();
  const int port = listener.local_port();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) ChildRank(port, /*linger=*/true);
  std::unique_ptr<Communicator> comm = LeaderOfChild(std::move(listener));
  if (comm == nullptr) kill(child, SIGKILL);
  ASSERT_NE(comm, nullptr);
  RunLeaderSums(*comm);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const absl::Time start = absl::Now();
  float x = 1.f;
  const absl::Status s = comm->AllReduceSum(&x, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 1"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace glmserve
