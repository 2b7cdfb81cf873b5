#include "core/model/rank_group.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"

namespace glmserve {

// One rank: a thread that holds the rank's thread pool and runs the jobs posted to it.
struct RankGroup::Rank {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ModelRunner> runner;
  std::thread thread;
  std::mutex mu;
  std::condition_variable wake;
  std::function<void()> job;  // guarded by mu; empty when idle
  bool stop = false;          // guarded by mu

  void Loop(int threads, std::vector<int> cpus) {
    const ScopedThreadPool pool(threads, cpus);
    for (;;) {
      std::function<void()> next;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stop || job != nullptr; });
        if (job == nullptr) return;  // stop, nothing left to run
        next = std::move(job);
        job = nullptr;
      }
      next();
    }
  }
  void Post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      job = std::move(f);
    }
    wake.notify_one();
  }
};

RankGroup::RankGroup(const ModelConfig& whole, const ParallelConfig& parallel)
    : whole_(whole), parallel_(parallel) {}

RankGroup::~RankGroup() {
  for (auto& rank : ranks_) {
    {
      std::lock_guard<std::mutex> lock(rank->mu);
      rank->stop = true;
    }
    rank->wake.notify_one();
  }
  for (auto& rank : ranks_) {
    if (rank->thread.joinable()) rank->thread.join();
  }
  // The runners go after their threads (with the members): they hold no thread pool.
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(
    const ModelConfig& whole, const ParallelConfig& parallel, const RankGroupOptions& options,
    std::vector<std::unique_ptr<Communicator>> communicators, const RankFactory& make) {
  const int n = static_cast<int>(communicators.size());  // members
  if (n < 1 || n > parallel.tensor_parallel) {
    return absl::InvalidArgumentError(absl::StrCat("a group of ", parallel.tensor_parallel,
                                                   " ranks cannot have ", n, " members"));
  }
  if (!options.rank_cpus.empty() && static_cast<int>(options.rank_cpus.size()) != n) {
    return absl::InvalidArgumentError("rank_cpus needs one CPU list per member");
  }
  std::unique_ptr<RankGroup> group(new RankGroup(whole, parallel));
  group->failure_grace_ = options.failure_grace;
  group->step_timeout_ = options.step_timeout;
  for (int r = 0; r < n; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->comm = std::move(communicators[r]);
    std::vector<int> cpus = options.rank_cpus.empty() ? std::vector<int>{} : options.rank_cpus[r];
    Rank* raw = rank.get();
    rank->thread =
        std::thread([raw, threads = options.threads_per_rank, cpus] { raw->Loop(threads, cpus); });
    group->ranks_.push_back(std::move(rank));
  }
  RETURN_IF_ERROR(group->RunOnAll([&](int r) -> absl::Status {
    Rank& rank = *group->ranks_[r];
    ASSIGN_OR_RETURN(rank.runner, make(r, rank.comm.get()));
    return absl::OkStatus();
  }));
  return group;
}

absl::Status RankGroup::RunOnAll(const std::function<absl::Status(int rank)>& job) {
  const int n = size();
  // Shared with the jobs: a job that outlives this call (a rank that hangs past the step
  // timeout) must find it alive.
  struct Step {
    std::mutex mu;
    std::condition_variable done;
    int remaining;
    int first_failed = -1;  // the member whose job failed first: the cause, not a consequence
    std::vector<absl::Status> statuses;
    std::function<absl::Status(int)> job;
  };
  auto step = std::make_shared<Step>();
  step->remaining = n;
  step->statuses.resize(n);
  step->job = job;
  for (int r = 0; r < n; ++r) {
    ranks_[r]->Post([step, r] {
      absl::Status s = step->job(r);
      std::lock_guard<std::mutex> lock(step->mu);
      if (!s.ok() && step->first_failed < 0) step->first_failed = r;
      step->statuses[r] = std::move(s);
      --step->remaining;
      step->done.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(step->mu);
  const auto failure = [&] {
    const int f = step->first_failed;
    return absl::UnavailableError(absl::StrCat("tensor-parallel rank ", f, " of ", n,
                                               " failed: ", step->statuses[f].ToString()));
  };
  const auto abort_all = [&](const absl::Status& why) {
    for (auto& rank : ranks_) rank->comm->Abort(why);  // the first reason recorded stays
  };
  // Every job done, or one failed, or the step timed out (a rank that hangs outside any
  // collective, or inside one the communicator cannot time out: a GPU waiting in NCCL).
  if (!step->done.wait_for(lock, absl::ToChronoMilliseconds(step_timeout_),
                           [&] { return step->remaining == 0 || step->first_failed >= 0; })) {
    const absl::Status why = absl::DeadlineExceededError(absl::StrCat(
        "a tensor-parallel step did not finish within ", absl::FormatDuration(step_timeout_), " (",
        step->remaining, " of ", n, " members still running): a rank hangs"));
    abort_all(why);
    // Aborted collectives release their ranks; a rank stuck elsewhere is left behind (the
    // group is dead either way, and reports it).
    step->done.wait_for(lock, absl::ToChronoMilliseconds(failure_grace_),
                        [&] { return step->remaining == 0; });
    return why;
  }
  if (step->remaining > 0 && !step->done.wait_for(lock, absl::ToChronoMilliseconds(failure_grace_),
                                                  [&] { return step->remaining == 0; })) {
    // A member failed and the others are still inside the step (waiting for it at a
    // collective): stop them, then wait for every job to leave (they fail at once).
    abort_all(failure());
    if (!step->done.wait_for(lock, absl::ToChronoMilliseconds(step_timeout_),
                             [&] { return step->remaining == 0; })) {
      return failure();  // one is stuck outside any collective; the group is dead
    }
  }
  bool all_alike = true;
  for (const absl::Status& s : step->statuses) all_alike &= s == step->statuses[0];
  if (all_alike) return step->statuses[0];  // OK, or a refusal every member made alike
  const absl::Status why = failure();
  abort_all(why);
  return why;
}

ModelRunner& RankGroup::rank_runner(int r) { return *ranks_[r]->runner; }
Communicator& RankGroup::communicator(int r) { return *ranks_[r]->comm; }
int64_t RankGroup::layer_begin() const { return ranks_[0]->runner->layer_begin(); }
int64_t RankGroup::layer_end() const { return ranks_[0]->runner->layer_end(); }
bool RankGroup::supports_sub_spans() const { return ranks_[0]->runner->supports_sub_spans(); }
bool RankGroup::samples_tokens() const { return ranks_[0]->runner->samples_tokens(); }
bool RankGroup::has_mtp() const { return ranks_[0]->runner->has_mtp(); }
bool RankGroup::mtp_enabled() const { return ranks_[0]->runner->mtp_enabled(); }

absl::Status RankGroup::health() const { return ranks_[0]->comm->health(); }

std::string RankGroup::device_name() const {
  bool alike = size() == parallel_.tensor_parallel;
  for (const auto& rank : ranks_) {
    alike &= rank->runner->device_name() == ranks_[0]->runner->device_name();
  }
  if (alike) return absl::StrCat(ranks_[0]->runner->device_name(), " x", size(), " ranks");
  std::string members;
  for (int r = 1; r < size(); ++r)
    absl::StrAppend(&members, "; ", ranks_[r]->runner->device_name());
  return absl::StrCat(ranks_[0]->runner->device_name(), " and ", size() - 1, " more members (",
                      parallel_.tensor_parallel, " ranks", members, ")");
}

std::string RankGroup::compute_description() const {
  return absl::StrCat(ranks_[0]->runner->compute_description(), "; ",
                      DescribeParallel(whole_, parallel_));
}

int64_t RankGroup::weight_bytes() const {
  int64_t total = 0;
  for (const auto& rank : ranks_) total += rank->runner->weight_bytes();
  return total;
}

int64_t RankGroup::kv_bytes_per_token() const {
  int64_t total = 0;
  for (const auto& rank : ranks_) total += rank->runner->kv_bytes_per_token();
  return total;
}

absl::Status RankGroup::SetKvCacheDType(KvCacheDType dtype) {
  return RunOnAll([this, dtype](int r) { return ranks_[r]->runner->SetKvCacheDType(dtype); });
}

absl::Status RankGroup::EnableMtp() {
  return RunOnAll([this](int r) { return ranks_[r]->runner->EnableMtp(); });
}

absl::StatusOr<std::unique_ptr<KvCache>> RankGroup::CreateCache(int64_t num_blocks,
                                                                int64_t block_size) {
  // Shared with the jobs (RunOnAll: a job may outlive a call that timed out).
  auto caches = std::make_shared<std::vector<std::unique_ptr<KvCache>>>(size());
  RETURN_IF_ERROR(RunOnAll([this, caches, num_blocks, block_size](int r) -> absl::Status {
    // First touch on the rank's CPUs.
    ASSIGN_OR_RETURN((*caches)[r], ranks_[r]->runner->CreateCache(num_blocks, block_size));
    return absl::OkStatus();
  }));
  std::unique_ptr<KvCache> first = std::move((*caches)[0]);
  caches->erase(caches->begin());
  first->AdoptRankCaches(std::move(*caches));
  return first;
}

absl::Status RankGroup::Forward(const ForwardBatch& batch, KvCache* cache,
                                const ForwardOptions& options, ForwardResult* result) {
  RETURN_IF_ERROR(health());
  if (cache->num_ranks() != size()) {
    return absl::InvalidArgumentError("KV cache was not created by this tensor-parallel group");
  }
  // Every rank runs the whole step; the head's slices are gathered on rank 0, whose result is kept.
  // The others' results live on (others_) so their buffers are reused from step to step.
  others_.resize(size() - 1);
  // Pointers by value: a job that outlives a timed-out step reads nothing of this frame.
  const ForwardBatch* step_batch = &batch;
  const ForwardOptions* step_options = &options;
  return RunOnAll([this, step_batch, cache, step_options, result](int r) {
    ForwardResult* out = r == 0 ? result : &others_[r - 1];
    return ranks_[r]->runner->Forward(*step_batch, cache->rank_cache(r), *step_options, out);
  });
}

}  // namespace glmserve
