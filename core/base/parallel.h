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

}  // namespace glmserve
