// Engine::Impl: the engine thread's state, plus the inbox and the session registry that other
// threads reach under their own locks. Its methods live in files named by job: the loop and
// request endings (engine_loop.cc), the scheduler (scheduler.cc), the step runner
// (step_runner.cc); submission and validation are engine.cc's.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/event_delivery.h"
#include "core/engine/prefix_cache.h"
#include "core/engine/sequence.h"
#include "core/engine/session_registry.h"
#include "core/engine/step_executor.h"

namespace glmserve {

class Engine::Impl {
 public:
  // A token the runner chose where the logits are (ForwardOptions::sample), with whether its
  // row was all finite.
  struct DeviceToken {
    int32_t token = -1;
    bool finite = false;
    float logprob = 0.0f;           // where the request asked
    std::vector<TokenLogprob> top;  // its top_logprobs alternatives
  };
  // Request `entry`'s token as a sampling runner returned it (ForwardResult::tokens ...).
  static DeviceToken DeviceTokenOf(const ForwardOptions& options, const ForwardResult& result,
                                   int64_t entry);
  Impl(ModelRunner* model, const EngineOptions& options, std::unique_ptr<KvCache> cache);
  ~Impl();  // stops the loop; unfinished requests end with CANCELLED

  KvCache& cache() { return *cache_; }

  // Called with a validated sequence (Engine::Submit).
  RequestId Enqueue(std::unique_ptr<Sequence> seq) {
    std::lock_guard<std::mutex> lock(mu_);
    seq->id = next_id_++;
    const RequestId id = seq->id;
    inbox_.push_back(std::move(seq));
    ++queued_count_;
    cv_.notify_all();
    return id;
  }

  // Requests accepted but not yet finished count against max_waiting while not running.
  int64_t QueuedCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_count_;
  }

  void AbortAll(absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      abort_status_ = std::move(status);
    }
    cv_.notify_all();
  }

  void Cancel(RequestId id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels_.push_back(id);
    }
    cv_.notify_all();
  }

  // Shared with the submitting threads (it has its own lock).
  SessionRegistry& sessions() { return sessions_; }

  // Makes the loop run its housekeeping (e.g. free a closed session's blocks) now.
  void WakeLoop() {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    cv_.notify_all();
  }

  EngineStats Stats() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

  bool Idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_count_ == 0 && running_count_ == 0 && inbox_.empty();
  }

  void SetStepObserver(std::function<void(const StepReport&)> observer) {
    std::lock_guard<std::mutex> lock(mu_);
    observer_ = std::move(observer);
  }
  void SetUnhealthyObserver(std::function<void(const absl::Status&)> observer) {
    std::lock_guard<std::mutex> lock(mu_);
    unhealthy_observer_ = std::move(observer);
  }

 private:
  // ---- The loop ----
  void Loop();
  bool TakeInbox();  // false when stopping
  void ExpireAndCancel(SteadyTime now, const std::vector<RequestId>& cancels);
  void ExpireSessions(SteadyTime now);
  void Admit();
  bool AdmitOne(Sequence* seq);
  // A session call that would take the sessions past their share of the cache: evicts idle
  // sessions (other than its own) to make room, else returns the RESOURCE_EXHAUSTED to
  // fail it with.
  absl::Status CheckSessionShare(Sequence* seq);
  // Evicts idle sessions (no call in flight, unused for session_eviction_grace), least
  // recently used first, other than `keep`, until `blocks` blocks are free or none is left.
  // True when `blocks` are free.
  bool EvictIdleSessions(int64_t blocks, const Session* keep);
  bool EvictOneIdleSession(const Session* keep);  // false when none is evictable
  // Grows `seq`'s blocks to cover `tokens` positions, evicting cached prefixes and then
  // preempting later-admitted sequences as needed. False if it cannot.
  // Without `may_preempt`, false where preempting would be needed.
  bool EnsureBlocks(Sequence* seq, int64_t positions, std::vector<Sequence*>* selected,
                    bool may_preempt = true);
  Sequence* PickVictim();  // the most recently admitted preemptible sequence
  void Preempt(Sequence* seq, std::vector<Sequence*>* selected);
  // The step: chosen by the scheduler (scheduler.cc), run by the step runner (step_runner.cc).
  // With `blocked` (a step is running: the one being built is overlapped) no sequence is
  // preempted: where one would have to be, *blocked is set and the selection is empty, and the
  // engine builds again once the running step is read.
  void BuildStep(std::vector<Sequence*>* selected, std::vector<int64_t>* counts,
                 bool* blocked = nullptr);
  // Whether a sequence whose next input is a token still being sampled can take it in the step
  // being built (what its sample request needs is known without that token).
  bool CanDecodeAhead(const Sequence& seq) const;
  std::unique_ptr<EngineStep> NewStep();
  // Fills step->batch / options from its selected sequences and marks them in flight.
  void GatherInputs(EngineStep* step);
  // One step, run on this thread (no overlap), or built while the last launched one runs.
  void RunStep(const std::vector<Sequence*>& selected, const std::vector<int64_t>& counts);
  void StepOverlapped();
  // Reads a step that ran (or was skipped): outputs, events, stats, the step observer.
  void CompleteStep(std::unique_ptr<EngineStep> step);
  // Takes a step's inputs off its sequences' in-flight counts.
  void Unmark(const EngineStep& step);
  void FailStep(const EngineStep& step);
  void ScatterOutputs(const EngineStep& step);
  // Samples every sequence's next token from its logits row (in parallel: each draw is a
  // pure function of its own inputs), into sampled_; with `device` (one per sequence) the
  // runner chose them and their logprobs, and rows[i] is null.
  void SampleTokens(const std::vector<Sequence*>& seqs, const std::vector<const float*>& rows,
                    const std::vector<DeviceToken>* device);
  // `finite`: the row's logits were all finite (else the request fails, nothing sampled).
  void AfterGenerateStep(Sequence* seq, SampledToken sampled, bool finite);
  // The token a generation emits from `row` (forced or sampled), as SampleTokens draws it;
  // false when the row is not all finite.
  bool SampleOne(const Sequence& seq, const float* row, const DeviceToken* device,
                 SampledToken* out) const;

  // ---- Speculative decoding with the MTP layer (speculation.cc, docs/mtp.md) ----
  // The drafts a sequence may verify in a step that feeds it `base` known tokens: its drafts,
  // capped by the step's token budget `room` and its remaining output and context; KV blocks
  // for them are taken only where free (evicting cached prefixes, never preempting): else
  // fewer. Clears drafts it cannot verify.
  int64_t DraftsToVerify(Sequence* seq, int64_t base, int64_t room);
  // Emits a verify step's tokens: row j's token, then row j + 1's while draft j equals it.
  // Returns the rows whose inputs were right (1 + accepted drafts, or fewer if it ended).
  int64_t VerifyDrafts(Sequence* seq, const float* logits, int64_t rows);
  // Keeps the head inputs of a generation's `valid` new rows for its MTP pass.
  void KeepHeadInputs(Sequence* seq, const float* head_input, int64_t valid);
  // After a step's outputs: the MTP layer over every pending (next token, head input) pair of
  // the step's generations, then k - 1 chained passes, leaving each sequence's drafts.
  void RunMtp(const std::vector<Sequence*>& selected, StepReport* report);
  // A busy step (more decoding sequences than mtp_max_batch): drops the pending pairs of every
  // drafting sequence and returns true.
  bool PauseDrafting(const std::vector<Sequence*>& selected);
  // A sequence that drafts more than one token: its drafts so far and the MTP layer's head
  // input for the next.
  struct MtpDrafting {
    Sequence* seq;
    int64_t room;              // drafts it may take in all
    std::vector<float> chain;  // [hidden]
  };
  // The pass over the pending pairs (first drafts); false when nothing ran or it failed (the
  // sequences then ended).
  bool MtpFirstPass(const std::vector<Sequence*>& selected, StepReport* report,
                    std::vector<MtpDrafting>* drafting);
  void MtpChainedPasses(std::vector<MtpDrafting> drafting, StepReport* report);
  absl::Status CheckSpeculation(const Sequence& seq, const Generation& gen) const;
  // Ends a request: frees or keeps its blocks, queues its FinishEvent.
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  void ReleaseBlocks(Sequence* seq, bool completed);
  // Events wait in the outbox until the stats that count them are published (UpdateStats),
  // so that whoever sees an event also sees its effect in Stats() and Idle().
  void Emit(Sequence* seq, std::variant<TokenEvent, ForwardOutput, FinishEvent> body);
  void Deliver();
  void UpdateStats(int64_t step_delta);
  absl::Status CheckInvariants();
  std::string invariant_error_;

  ModelRunner* model_;
  EngineOptions options_;
  std::unique_ptr<KvCache> cache_;
  PrefixCache prefix_;
  SessionRegistry sessions_;
  std::thread thread_;

  // Inbox from other threads.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;  // housekeeping requested
  RequestId next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> cancels_;
  absl::Status abort_status_;  // non-OK: end every live request with it (AbortAll)
  int64_t queued_count_ = 0;   // accepted, not running, not finished
  int64_t running_count_ = 0;  // mirrors running_.size()
  std::function<void(const StepReport&)> observer_;
  std::function<void(const absl::Status&)> unhealthy_observer_;  // guarded by mu_
  bool reported_unhealthy_ = false;                              // the loop's

  // Engine-thread state.
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> live_;
  std::deque<Sequence*> waiting_;   // FCFS; preempted sequences go back to the front
  std::vector<Sequence*> running_;  // in admission order
  int64_t admissions_ = 0;
  const int64_t session_share_blocks_;
  // Steps are reused, so that the logits rows (megabytes a step) land in memory that is
  // already allocated and mapped rather than in a fresh, page-faulting buffer.
  std::vector<std::unique_ptr<EngineStep>> spare_steps_;
  uint64_t next_step_id_ = 1;
  // Overlapped steps: on when the options ask and the runner samples (no MTP layer); the
  // executor runs the steps, at most two launched and unread.
  bool overlap_ = false;
  std::unique_ptr<StepExecutor> executor_;
  bool step_in_flight_ = false;
  int64_t overlapped_steps_ = 0;
  std::vector<SampledToken> sampled_;
  std::vector<char> sampled_finite_;  // per sampled row: all logits finite
  struct Outgoing {
    Sequence* seq;  // live, or in finished_
    Event event;
  };
  std::vector<Outgoing> outbox_;
  std::vector<std::unique_ptr<Sequence>> finished_;  // finished, events not yet posted
  // The callbacks' own thread (event_delivery.h): made before the loop starts, and reset by
  // ~Impl once the loop has stopped, so that what is left goes out while the engine is whole.
  std::unique_ptr<EventDelivery> delivery_;

  // Published counters.
  std::mutex stats_mu_;
  EngineStats stats_;
  int64_t steps_ = 0, preemptions_ = 0, prompt_computed_ = 0, generated_total_ = 0;
  int64_t sessions_evicted_ = 0, nonfinite_outputs_ = 0;
  int64_t spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0, spec_verify_steps_ = 0;
  std::vector<int64_t> spec_acceptance_lengths_ = std::vector<int64_t>(kMaxMtpDraftTokens + 2, 0);
  ForwardResult mtp_result_;  // reused by the MTP passes
};

}  // namespace glmserve
