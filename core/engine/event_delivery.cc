#include "core/engine/event_delivery.h"

#include <utility>

namespace glmserve {

EventDelivery::EventDelivery() : thread_([this] { Run(); }) {}

EventDelivery::~EventDelivery() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  has_work_.notify_all();
  thread_.join();
}

void EventDelivery::Post(Batch batch) {
  if (batch.items.empty() && batch.keep_alive.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  has_room_.wait(lock, [this] { return queue_.size() < kMaxPendingBatches; });
  queue_.push_back(std::move(batch));
  lock.unlock();
  has_work_.notify_one();
}

size_t EventDelivery::pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void EventDelivery::Run() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything is out
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    has_room_.notify_one();
    // Callbacks may take a while and may submit: no lock is held here.
    for (Item& item : batch.items) (*item.callback)(std::move(item.event));
  }
}

}  // namespace glmserve
