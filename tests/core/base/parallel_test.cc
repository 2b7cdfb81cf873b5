// The thread pool's contract (core/base/parallel.h): ParallelFor covers [0, n) exactly once in
// chunks of `grain` whose boundaries do not depend on the thread count (so a kernel that
// reduces per chunk is bit-identical at any --threads); empty and degenerate ranges call
// nothing or run serially; a nested call runs serially on its thread; concurrent callers
// each get their own complete loop; sizes near 2^63 neither wrap nor call body out of range.
#include "core/base/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace glmserve {
namespace {

using Chunk = std::pair<int64_t, int64_t>;

// The chunks one ParallelFor hands out, as a sorted set (duplicates fail the test).
std::set<Chunk> Chunks(int64_t n, int64_t grain) {
  std::mutex mu;
  std::set<Chunk> chunks;
  ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(chunks.insert({begin, end}).second)
        << "chunk [" << begin << ", " << end << ") twice";
  });
  return chunks;
}

// [k * grain, min(n, (k + 1) * grain)) for every k: the documented partition.
std::set<Chunk> ExpectedChunks(int64_t n, int64_t grain) {
  std::set<Chunk> chunks;
  for (int64_t b = 0; b < n; b += grain) chunks.insert({b, std::min(n, b + grain)});
  return chunks;
}

// Restores the pool's size after a test that changes it.
class ParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = NumThreads(); }
  void TearDown() override { SetNumThreads(saved_); }
  int saved_ = 1;
};

TEST_F(ParallelTest, SetNumThreadsResizesAndClampsToOne) {
  SetNumThreads(3);
  EXPECT_EQ(NumThreads(), 3);
  SetNumThreads(1);
  EXPECT_EQ(NumThreads(), 1);
  SetNumThreads(0);
  EXPECT_EQ(NumThreads(), 1);
  SetNumThreads(-8);
  EXPECT_EQ(NumThreads(), 1);
}

TEST_F(ParallelTest, PartitionIsTheSameWhateverTheThreadCount) {
  const std::pair<int64_t, int64_t> cases[] = {{1, 1},    {7, 1},  {100, 7}, {100, 10},
                                               {101, 10}, {5, 64}, {64, 64}, {1000, 3}};
  for (int threads : {1, 2, 3, 8}) {
    SetNumThreads(threads);
    for (const auto& [n, grain] : cases) {
      EXPECT_EQ(Chunks(n, grain), ExpectedChunks(n, grain))
          << "n " << n << " grain " << grain << " threads " << threads;
    }
  }
}

TEST_F(ParallelTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 4}) {
    SetNumThreads(threads);
    for (int repeat = 0; repeat < 50; ++repeat) {  // many short loops back to back
      std::vector<std::atomic<int>> hits(997);
      ParallelFor(997, 5, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
      });
      for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}

TEST_F(ParallelTest, EmptyRangesCallNothing) {
  SetNumThreads(4);
  for (int64_t n : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    int calls = 0;
    ParallelFor(n, 4, [&](int64_t, int64_t) { ++calls; });
    EXPECT_EQ(calls, 0) << "n " << n;
  }
}

TEST_F(ParallelTest, NonPositiveGrainMeansOneItemAChunk) {
  SetNumThreads(4);
  for (int64_t grain : {int64_t{0}, int64_t{-3}, std::numeric_limits<int64_t>::min()}) {
    EXPECT_EQ(Chunks(9, grain), ExpectedChunks(9, 1)) << "grain " << grain;
  }
}

TEST_F(ParallelTest, ASingleChunkRunsOnTheCaller) {
  SetNumThreads(4);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<Chunk> seen;
  ParallelFor(10, 10, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    seen.push_back({begin, end});
  });
  EXPECT_EQ(seen, std::vector<Chunk>({{0, 10}}));
}

TEST_F(ParallelTest, UsesThePoolsThreads) {
  SetNumThreads(4);
  // Chunks that wait until a second thread has joined in: more than one thread must run
  // them (the caller alone would wait out the deadline).
  std::mutex mu;
  std::set<std::thread::id> ids;
  ParallelFor(64, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (ids.size() > 1) return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
  EXPECT_GT(ids.size(), 1u);
  EXPECT_LE(ids.size(), 4u);  // the caller and three workers, no more
}

TEST_F(ParallelTest, NestedCallRunsSeriallyOnItsThread) {
  SetNumThreads(4);
  std::atomic<int> mismatched{0};
  std::vector<std::atomic<int>> hits(8 * 30);
  ParallelFor(8, 1, [&](int64_t outer_begin, int64_t outer_end) {
    for (int64_t o = outer_begin; o < outer_end; ++o) {
      const std::thread::id self = std::this_thread::get_id();
      int64_t expected_begin = 0;
      ParallelFor(30, 4, [&](int64_t begin, int64_t end) {
        if (std::this_thread::get_id() != self) mismatched.fetch_add(1);
        if (begin != expected_begin) mismatched.fetch_add(1);  // serial: in order
        expected_begin = end;
        for (int64_t i = begin; i < end; ++i) hits[o * 30 + i].fetch_add(1);
      });
    }
  });
  EXPECT_EQ(mismatched.load(), 0);
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST_F(ParallelTest, ConcurrentCallersEachGetTheirWholeLoop) {
  SetNumThreads(4);
  constexpr int kCallers = 4;
  std::vector<std::vector<std::atomic<int>>> hits(kCallers);
  for (auto& h : hits) h = std::vector<std::atomic<int>>(501);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int repeat = 0; repeat < 40; ++repeat) {
        ParallelFor(501, 7, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[c][i].fetch_add(1);
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    for (size_t i = 0; i < hits[c].size(); ++i) ASSERT_EQ(hits[c][i].load(), 40) << c << " " << i;
  }
}

TEST_F(ParallelTest, PerChunkReductionIsBitIdenticalAtAnyThreadCount) {
  // What the kernels rely on: partial results per chunk, combined in chunk order, do not
  // depend on which thread ran which chunk.
  std::vector<float> x(10007);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f) * 1e3f;
  constexpr int64_t kGrain = 64;
  const int64_t chunks = (static_cast<int64_t>(x.size()) + kGrain - 1) / kGrain;
  auto sum = [&] {
    std::vector<float> partial(chunks, 0.0f);
    ParallelFor(static_cast<int64_t>(x.size()), kGrain, [&](int64_t begin, int64_t end) {
      float s = 0.0f;
      for (int64_t i = begin; i < end; ++i) s += x[i];
      partial[begin / kGrain] = s;
    });
    float total = 0.0f;
    for (float p : partial) total += p;
    return total;
  };
  SetNumThreads(1);
  const float reference = sum();
  for (int threads : {2, 3, 5, 8}) {
    SetNumThreads(threads);
    for (int repeat = 0; repeat < 5; ++repeat) {
      const float s = sum();
      EXPECT_EQ(std::memcmp(&s, &reference, sizeof(float)), 0) << threads << " threads";
    }
  }
}

TEST_F(ParallelTest, SizesNear2To63NeitherWrapNorLeaveTheRange) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int threads : {1, 4}) {
    SetNumThreads(threads);
    // Two chunks: the second ends at n, and the counter stepping past n must not wrap
    // into a negative "begin".
    const int64_t half = kMax / 2 + 1;
    EXPECT_EQ(Chunks(kMax, half), std::set<Chunk>({{0, half}, {half, kMax}}))
        << threads << " threads";
    EXPECT_EQ(Chunks(kMax, kMax - 1), std::set<Chunk>({{0, kMax - 1}, {kMax - 1, kMax}}))
        << threads << " threads";
    EXPECT_EQ(Chunks(kMax, kMax), std::set<Chunk>({{0, kMax}}));
    // More chunks than fit once every thread has overshot the end.
    const int64_t grain = kMax / 3;
    EXPECT_EQ(Chunks(kMax, grain),
              std::set<Chunk>(
                  {{0, grain}, {grain, 2 * grain}, {2 * grain, 3 * grain}, {3 * grain, kMax}}))
        << threads << " threads";
  }
}

TEST(ParallelEnvTest, GlmNumThreadsSetsTheDefaultPoolSize) {
  // The pool reads GLM_NUM_THREADS when first used: check it in a fresh process (gtest
  // re-executes this test alone for the "threadsafe" death-test style).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("GLM_NUM_THREADS", "3", 1);
        std::_Exit(NumThreads() == 3 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("GLM_NUM_THREADS", "0", 1);  // not positive: the hardware's count
        const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
        std::_Exit(NumThreads() == static_cast<int>(hw) ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace glmserve
