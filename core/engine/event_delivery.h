// EventDelivery: the requests' callbacks run on a thread of their own, so that a slow one (a
// gRPC stream write, a client's handler, a full socket) never holds up the engine's next step.
//
// Guarantees (tests/core/engine/event_delivery_test.cc):
//  - One delivery thread and batches in the order they were posted: a request's events keep
//    the order the engine emitted them in, and its FinishEvent stays its last.
//  - A batch also carries the sequences that finished in it, destroyed only after its events
//    are out, so a callback pointer stays valid until its last event is delivered.
//  - Bounded: past kMaxPendingBatches undelivered batches, Post waits. A consumer that stalls
//    for good slows the engine down instead of growing memory without end.
//  - The destructor delivers everything posted before it, then stops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/sequence.h"

namespace glmserve {

class EventDelivery {
 public:
  // Steps' worth of events that may wait for delivery before the engine waits.
  static constexpr size_t kMaxPendingBatches = 1024;

  struct Item {
    const EventCallback* callback;  // owned by a live sequence or one in keep_alive
    Event event;
  };
  struct Batch {
    std::vector<Item> items;
    std::vector<std::unique_ptr<Sequence>> keep_alive;  // finished: freed after delivery
  };

  EventDelivery();
  ~EventDelivery();
  EventDelivery(const EventDelivery&) = delete;
  EventDelivery& operator=(const EventDelivery&) = delete;

  // Queues a batch (nothing to do for an empty one); waits while the queue is full.
  void Post(Batch batch);
  // Batches posted and not yet delivered.
  size_t pending();

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable has_work_, has_room_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace glmserve
