// The in-process communicator (core/model/communicator.h): rank-order sums, gathers,
// timeouts and aborts.
#include "core/model/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace glmserve {
namespace {

// Runs body(rank, comm) on one thread per rank and waits for all.
void RunRanks(std::vector<std::unique_ptr<Communicator>>& comms,
              const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *comms[r]); });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ThreadCommunicatorTest, SumsInRankOrderWhateverTheCount) {
  for (const int n : {1, 2, 3, 4, 8}) {
    auto comms = CreateThreadGroup(n);
    // Values whose float sum depends on the order: rank r holds big, small and -big values.
    auto value = [](int r, int64_t i) {
      const float big[] = {1e8f, 3.f, -1e8f, 0.25f, 7e7f, -5.f, 1.f, -7e7f};
      return big[(r + i) % 8] * (1.f + 0.001f * static_cast<float>(i % 13));
    };
    for (const int64_t count : {1, 5, 64, 1000}) {
      std::vector<std::vector<float>> data(n, std::vector<float>(count));
      RunRanks(comms, [&](int r, Communicator& comm) {
        for (int64_t i = 0; i < count; ++i) data[r][i] = value(r, i);
        ASSERT_TRUE(comm.AllReduceSum(data[r].data(), count).ok());
      });
      for (int64_t i = 0; i < count; ++i) {
        float expect = value(0, i);
        for (int r = 1; r < n; ++r) expect += value(r, i);  // rank order
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(std::memcmp(&data[r][i], &expect, sizeof(float)), 0)
              << "n " << n << " count " << count << " element " << i << " rank " << r;
        }
      }
    }
  }
}

TEST(ThreadCommunicatorTest, GathersUnevenBlocksInRankOrder) {
  const int n = 3;
  auto comms = CreateThreadGroup(n);
  const std::vector<int64_t> counts = {2, 0, 3};
  std::vector<std::vector<float>> out(n, std::vector<float>(5, -1.f));
  RunRanks(comms, [&](int r, Communicator& comm) {
    std::vector<float> mine(counts[r]);
    for (int64_t i = 0; i < counts[r]; ++i) mine[i] = 10.f * r + i;
    ASSERT_TRUE(comm.AllGather(mine.data(), counts, out[r].data()).ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], (std::vector<float>{0, 1, 20, 21, 22}));
}

TEST(ThreadCommunicatorTest, GathersOnTheRootOnly) {
  const int n = 3;
  const std::vector<int64_t> counts = {2, 0, 3};
  for (const int root : {0, 2}) {
    auto comms = CreateThreadGroup(n);
    std::vector<std::vector<float>> out(n, std::vector<float>(5, -1.f));
    RunRanks(comms, [&](int r, Communicator& comm) {
      std::vector<float> mine(counts[r]);
      for (int64_t i = 0; i < counts[r]; ++i) mine[i] = 10.f * r + i;
      // Only the root passes an output buffer.
      ASSERT_TRUE(comm.Gather(mine.data(), counts, r == root ? out[r].data() : nullptr, root).ok());
    });
    const std::vector<float> gathered = {0, 1, 20, 21, 22}, untouched(5, -1.f);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[r], r == root ? gathered : untouched) << "root " << root << " rank " << r;
    }
  }
  auto comms = CreateThreadGroup(1);
  const float one = 1.f;
  EXPECT_EQ(comms[0]->Gather(&one, std::vector<int64_t>{1}, nullptr, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ThreadCommunicatorTest, AMissingRankTimesOutAndPoisonsTheGroup) {
  auto comms = CreateThreadGroup(2, absl::Milliseconds(200));
  float x = 1.f;
  // Rank 1 never arrives: rank 0 gives up after the timeout.
  const absl::Status s = comms[0]->AllReduceSum(&x, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("waited"), absl::string_view::npos) << s;
  // Every later collective of every rank fails at once, with the same reason.
  EXPECT_EQ(comms[1]->AllReduceSum(&x, 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(comms[1]->health().ok());
}

TEST(ThreadCommunicatorTest, AbortReleasesAWaitingRank) {
  auto comms = CreateThreadGroup(2, absl::Seconds(600));
  absl::Status waited;
  std::thread waiter([&] {
    float x = 1.f;
    waited = comms[0]->AllReduceSum(&x, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->Abort(absl::InternalError("rank 1 crashed"));
  waiter.join();  // well before the 600 s timeout
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(waited.message().find("rank 1 crashed"), absl::string_view::npos) << waited;
}

}  // namespace
}  // namespace glmserve
