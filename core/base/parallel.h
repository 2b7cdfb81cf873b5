// A small persistent thread pool for the CPU kernels.
//
// Why not OpenMP: its workers spin at barriers (GOMP's default wait policy), which on a
// shared or CPU-limited machine (a Kubernetes pod, a noisy CI box) turns a stolen core into a
// 10x slowdown. Here the work is cut into chunks handed out through an atomic counter, the
// calling thread takes chunks too, and idle workers spin only briefly before sleeping: a
// descheduled worker simply gets fewer chunks. Which thread runs a chunk never changes the
// result; kernels write disjoint outputs per chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace glmserve {

// Runs body(begin, end) over [0, n) in chunks of `grain` items, on the pool's threads and
// the caller. Returns when every chunk is done. Called from inside a running body, it runs
// serially on that thread.
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Threads used by ParallelFor (the caller included). Defaults to the hardware concurrency,
// or GLM_NUM_THREADS when set.
int NumThreads();
// Resizes the pool; call before any concurrent use (e.g. from main after parsing flags).
void SetNumThreads(int threads);

// A pool of its own for the thread that creates it: while it lives, ParallelFor and
// NumThreads on that thread use it instead of the process's pool. A tensor-parallel rank's
// thread holds one (core/model/rank_group.h), so ranks never queue behind each other's loops.
// `cpus`, when not empty, pins the creating thread and the pool's workers to those CPUs
// (sched_setaffinity), so a rank's memory is first touched on its NUMA node.
class ScopedThreadPool {
 public:
  explicit ScopedThreadPool(int threads, const std::vector<int>& cpus = {});
  ~ScopedThreadPool();
  ScopedThreadPool(const ScopedThreadPool&) = delete;
  ScopedThreadPool& operator=(const ScopedThreadPool&) = delete;

 private:
  void* pool_;      // the ThreadPool (parallel.cc)
  void* previous_;  // the pool this thread used before
};

// Pins the calling thread to `cpus` (ids as /proc/cpuinfo numbers them). False when the
// kernel refuses (an id outside the process's allowed set).
bool PinThisThread(const std::vector<int>& cpus);

}  // namespace glmserve
