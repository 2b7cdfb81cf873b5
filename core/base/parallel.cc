#include "core/base/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GLM_CPU_RELAX() _mm_pause()
#else
#define GLM_CPU_RELAX() ((void)0)
#endif

namespace glmserve {
namespace {

thread_local bool tls_inside_pool = false;

// Chunk `chunk` of [0, n) in steps of `grain`: [chunk * grain, min(n, (chunk + 1) * grain)),
// computed without forming (chunk + 1) * grain, which can exceed 2^63 - 1 for the last chunk.
void RunChunk(const std::function<void(int64_t, int64_t)>& body, int64_t n, int64_t grain,
              int64_t chunk) {
  const int64_t begin = chunk * grain;  // < n: chunk < ceil(n / grain)
  body(begin, begin + std::min(grain, n - begin));
}

class ThreadPool {
 public:
  explicit ThreadPool(int threads, std::vector<int> cpus = {}) {
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this, cpus] {
        if (!cpus.empty()) PinThisThread(cpus);
        WorkerLoop();
      });
    }
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void Run(int64_t n, int64_t grain, int64_t chunks,
           const std::function<void(int64_t, int64_t)>& body) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel loop at a time
    job_body_ = &body;
    job_n_ = n;
    job_grain_ = grain;
    job_chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    tls_inside_pool = true;
    TakeChunks();
    tls_inside_pool = false;
    // Wait until every worker has left this job (they may still hold a chunk).
    while (pending_.load(std::memory_order_acquire) != 0) {
      for (int i = 0; i < 64 && pending_.load(std::memory_order_acquire) != 0; ++i) {
        GLM_CPU_RELAX();
      }
      std::this_thread::yield();
    }
  }

 private:
  // The counter hands out chunk indices, not item offsets: an offset counter stepped past
  // an n near 2^63 by every thread would wrap to a negative begin.
  void TakeChunks() {
    for (;;) {
      const int64_t chunk = next_.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= job_chunks_) return;
      RunChunk(*job_body_, job_n_, job_grain_, chunk);
    }
  }

  void WorkerLoop() {
    tls_inside_pool = true;
    uint64_t seen = 0;
    for (;;) {
      // Spin briefly for the next job (decode steps issue many short loops back to back),
      // then sleep.
      bool ready = false;
      for (int i = 0; i < 4000 && !ready; ++i) {
        ready = published_.load(std::memory_order_acquire) != seen;
        if (!ready) GLM_CPU_RELAX();
      }
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
      }
      TakeChunks();
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable wake_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  std::atomic<uint64_t> published_{0};
  const std::function<void(int64_t, int64_t)>* job_body_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  int64_t job_chunks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> pending_{0};
};

int DefaultThreads() {
  if (const char* env = std::getenv("GLM_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::mutex pool_mu;
std::unique_ptr<ThreadPool>& Pool() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(DefaultThreads());
  return pool;
}

thread_local ThreadPool* tls_pool = nullptr;  // a ScopedThreadPool's, on its thread

ThreadPool& CurrentPool() { return tls_pool != nullptr ? *tls_pool : *Pool(); }

}  // namespace

bool PinThisThread(const std::vector<int>& cpus) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    CPU_SET(cpu, &set);
  }
  return sched_setaffinity(0, sizeof(set), &set) == 0;
#else
  (void)cpus;
  return false;
#endif
}

ScopedThreadPool::ScopedThreadPool(int threads, const std::vector<int>& cpus)
    : pool_(nullptr), previous_(tls_pool) {
  if (!cpus.empty()) PinThisThread(cpus);
  auto* pool = new ThreadPool(std::max(1, threads), cpus);
  pool_ = pool;
  tls_pool = pool;
}

ScopedThreadPool::~ScopedThreadPool() {
  tls_pool = static_cast<ThreadPool*>(previous_);
  delete static_cast<ThreadPool*>(pool_);
}

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = n / grain + (n % grain != 0 ? 1 : 0);  // ceil without overflow
  ThreadPool& pool = CurrentPool();
  if (tls_inside_pool || pool.size() == 1 || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) RunChunk(body, n, grain, c);
    return;
  }
  pool.Run(n, grain, chunks, body);
}

int NumThreads() { return CurrentPool().size(); }

void SetNumThreads(int threads) {
  std::lock_guard<std::mutex> lock(pool_mu);
  Pool() = std::make_unique<ThreadPool>(std::max(1, threads));
}

}  // namespace glmserve
