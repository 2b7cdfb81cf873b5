// A small fixed pool of threads running queued closures.
//
// Why: engine callbacks run on the engine thread and must be quick, but turning a Forward
// result into a response (copying or converting [rows, vocab] floats into wire bytes) is
// proportional to its size. The callback hands that work to this pool and returns at once.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace glmserve {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // runs what is queued, then joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Never blocks (the queue is unbounded; its length is bounded by the requests in flight).
  void Run(std::function<void()> task);

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace glmserve
