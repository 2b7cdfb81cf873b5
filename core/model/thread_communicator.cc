// The in-process communicator (core/model/communicator.h): ranks are threads that read each
// other's buffers. A reduction splits the elements into one chunk per rank; rank r adds chunk r
// over the ranks in rank order and writes the sums into every rank's buffer, so each element
// is added in the same order on every call whatever the count.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/communicator.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GLM_COMM_RELAX() _mm_pause()
#else
#define GLM_COMM_RELAX() ((void)0)
#endif

namespace glmserve {
namespace {

struct GroupState {
  GroupState(int n, absl::Duration t) : size(n), timeout(t), in(n), out(n) {}

  const int size;
  const absl::Duration timeout;
  std::atomic<int> arrived{0};
  std::atomic<uint64_t> generation{0};
  std::atomic<bool> failed{false};
  mutable std::mutex mu;
  absl::Status failure;  // guarded by mu; set once
  // Each rank's buffers of the collective in progress (slot r written by rank r only, read by
  // all after the first barrier).
  std::vector<const float*> in;
  std::vector<float*> out;

  void Fail(const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.ok()) failure = why;
    failed.store(true, std::memory_order_release);
  }
  absl::Status Failure() const {
    std::lock_guard<std::mutex> lock(mu);
    return absl::UnavailableError(
        absl::StrCat("the tensor-parallel group failed: ", failure.ToString()));
  }

  // Every rank arrives, then all leave; the last to arrive opens the next generation. Waiters
  // spin briefly (decode steps run many short collectives), then yield, and give up at the
  // timeout, poisoning the group.
  absl::Status Barrier(int rank) {
    if (failed.load(std::memory_order_acquire)) return Failure();
    const uint64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == size) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_acq_rel);
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout;
    for (int64_t spins = 0;; ++spins) {
      if (generation.load(std::memory_order_acquire) != gen) return absl::OkStatus();
      if (failed.load(std::memory_order_acquire)) return Failure();
      if (spins < 2000) {
        GLM_COMM_RELAX();
        continue;
      }
      if (spins % 64 == 0 && absl::Now() > deadline) {
        Fail(absl::DeadlineExceededError(absl::StrCat("rank ", rank, " waited ",
                                                      absl::FormatDuration(timeout),
                                                      " at a collective for the other ranks")));
        return Failure();
      }
      std::this_thread::yield();
    }
  }
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<GroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    GroupState& g = *group_;
    if (g.size == 1) return health();
    g.out[rank_] = data;
    if (absl::Status s = g.Barrier(rank_); !s.ok()) return s;
    const int64_t begin = count * rank_ / g.size, end = count * (rank_ + 1) / g.size;
    sums_.assign(g.out[0] + begin, g.out[0] + end);
    for (int r = 1; r < g.size; ++r) {
      const float* src = g.out[r] + begin;
      for (int64_t i = 0; i < end - begin; ++i) sums_[i] += src[i];
    }
    if (absl::Status s = g.Barrier(rank_); !s.ok()) return s;  // every read done
    for (int r = 0; r < g.size; ++r) std::copy(sums_.begin(), sums_.end(), g.out[r] + begin);
    return g.Barrier(rank_);  // every rank's buffer complete
  }

  absl::Status AllGather(const float* in, absl::Span<const int64_t> counts, float* out) override {
    GroupState& g = *group_;
    if (static_cast<int>(counts.size()) != g.size) {
      return absl::InvalidArgumentError("AllGather needs one count per rank");
    }
    g.in[rank_] = in;
    if (absl::Status s = g.Barrier(rank_); !s.ok()) return s;
    int64_t at = 0;
    for (int r = 0; r < g.size; ++r) {
      std::copy_n(g.in[r], counts[r], out + at);
      at += counts[r];
    }
    return g.Barrier(rank_);  // no rank reuses `in` before every copy is done
  }

  absl::Status Gather(const float* in, absl::Span<const int64_t> counts, float* out,
                      int root) override {
    GroupState& g = *group_;
    if (static_cast<int>(counts.size()) != g.size || root < 0 || root >= g.size) {
      return absl::InvalidArgumentError("Gather needs one count per rank and a rank as root");
    }
    g.in[rank_] = in;
    if (absl::Status s = g.Barrier(rank_); !s.ok()) return s;
    if (rank_ == root) {
      int64_t at = 0;
      for (int r = 0; r < g.size; ++r) {
        std::copy_n(g.in[r], counts[r], out + at);
        at += counts[r];
      }
    }
    return g.Barrier(rank_);  // no rank reuses `in` before the root has copied it
  }

  void Abort(const absl::Status& why) override { group_->Fail(why); }

  absl::Status health() const override {
    return group_->failed.load(std::memory_order_acquire) ? group_->Failure() : absl::OkStatus();
  }

 private:
  std::shared_ptr<GroupState> group_;
  const int rank_;
  std::vector<float> sums_;  // this rank's chunk of a reduction
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateThreadGroup(int size, absl::Duration timeout) {
  auto group = std::make_shared<GroupState>(size, timeout);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return ranks;
}

}  // namespace glmserve
