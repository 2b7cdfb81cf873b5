// core/engine/event_delivery.h: events come out in the order they were posted, a batch's
// finished sequences outlive its events, the queue is bounded, the destructor drains; and
// through the engine: a callback that blocks does not stop the steps.
#include "core/engine/event_delivery.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/instant_runner.h"
#include "core/model/config.h"
#include "tests/core/engine/engine_harness.h"

namespace glmserve {
namespace {

Event TokenAt(RequestId id, int64_t index) {
  TokenEvent t;
  t.index = index;
  return Event{id, t};
}

TEST(EventDeliveryTest, EventsComeOutInPostOrderAndTheDestructorDrains) {
  std::mutex mu;
  std::vector<std::vector<int64_t>> seen(3);
  std::vector<std::unique_ptr<EventCallback>> callbacks;
  for (int r = 0; r < 3; ++r) {
    callbacks.push_back(std::make_unique<EventCallback>([&, r](Event&& e) {
      std::lock_guard<std::mutex> lock(mu);
      seen[r].push_back(std::get<TokenEvent>(e.body).index);
    }));
  }
  {
    EventDelivery delivery;
    for (int64_t step = 0; step < 300; ++step) {
      EventDelivery::Batch batch;
      for (int r = 0; r < 3; ++r) {
        if ((step + r) % 2 == 0) batch.items.push_back({callbacks[r].get(), TokenAt(r, step)});
      }
      delivery.Post(std::move(batch));
    }
  }  // the destructor delivers everything posted
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[r].size(), 150u) << r;
    for (size_t i = 1; i < seen[r].size(); ++i) EXPECT_LT(seen[r][i - 1], seen[r][i]);
  }
}

TEST(EventDeliveryTest, AFinishedSequenceLivesUntilItsEventsAreOut) {
  EventDelivery delivery;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  auto seq = std::make_unique<Sequence>();
  seq->callback = [&](Event&&) {
    released.wait();  // holds the delivery thread while the poster moves on
    ++calls;
  };
  EventDelivery::Batch batch;
  batch.items.push_back({&seq->callback, TokenAt(1, 0)});
  batch.items.push_back({&seq->callback, TokenAt(1, 1)});
  batch.keep_alive.push_back(std::move(seq));  // the only owner now
  delivery.Post(std::move(batch));
  release.set_value();
  for (int i = 0; i < 2000 && calls < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(calls.load(), 2);
}

TEST(EventDeliveryTest, PostWaitsWhenTheQueueIsFull) {
  EventDelivery delivery;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  EventCallback blocking = [&](Event&&) { released.wait(); };
  EventCallback quiet = [](Event&&) {};
  EventDelivery::Batch first;
  first.items.push_back({&blocking, TokenAt(1, 0)});
  delivery.Post(std::move(first));
  // The delivery thread is stuck in the first batch: fill the queue, then one more.
  std::atomic<bool> last_posted{false};
  std::thread poster([&] {
    for (size_t i = 0; i <= EventDelivery::kMaxPendingBatches; ++i) {
      EventDelivery::Batch b;
      b.items.push_back({&quiet, TokenAt(2, static_cast<int64_t>(i))});
      delivery.Post(std::move(b));
    }
    last_posted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(last_posted.load()) << "a full queue must hold the poster";
  EXPECT_EQ(delivery.pending(), EventDelivery::kMaxPendingBatches);
  release.set_value();
  poster.join();
  EXPECT_TRUE(last_posted.load());
}

// Request 0's callback blocks on its first token until the engine has generated every token
// of both requests: possible only if the steps go on while a callback is stuck.
TEST(EventDeliveryTest, ABlockedCallbackDoesNotStopTheEngine) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<InstantRunner>(*config), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::Collector c;
  std::atomic<bool> engine_went_on{false};
  bool first = true;
  EventCallback collect0 = c.For(0);
  EventCallback blocking = [&](Event&& e) {
    if (first && std::holds_alternative<TokenEvent>(e.body)) {
      first = false;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (std::chrono::steady_clock::now() < deadline) {
        if ((*engine)->Stats().tokens_generated >= 40) {
          engine_went_on = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    collect0(std::move(e));
  };
  GenerateRequest g = testing::MakeGenerate(0, 4, 20, /*sample=*/false);
  ASSERT_TRUE((*engine)->Submit(g, blocking).ok());
  ASSERT_TRUE((*engine)->Submit(testing::MakeGenerate(1, 5, 20, false), c.For(1)).ok());
  c.Wait(2);
  EXPECT_TRUE(engine_went_on.load());
  EXPECT_EQ(c[0].tokens.size(), 20u);
  EXPECT_EQ(c[1].tokens.size(), 20u);
}

}  // namespace
}  // namespace glmserve
