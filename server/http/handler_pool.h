// The HTTP servers' handler pool: a fixed number of threads that run the blocking part of a
// request (JSON parsing, tokenizing, waiting on the engine and writing its events), so that
// the I/O threads that own the sockets never do model work and never block. Jobs beyond
// `max_queued` waiting ones are refused (the caller answers 429: load shedding).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace glmserve {

class HandlerPool {
 public:
  HandlerPool(int threads, size_t max_queued);
  ~HandlerPool();  // Stop()
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `job`; false (and `job` not run) when `max_queued` jobs already wait or the pool
  // is stopping.
  bool Submit(std::function<void()> job);
  // Runs the jobs already queued, then joins the threads. Idempotent.
  void Stop();

 private:
  void Run();

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace glmserve
