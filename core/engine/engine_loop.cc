// The engine thread's loop: takes submissions, cancellations and expiries, admits, runs one
// step at a time (core/engine/scheduler.cc chooses it, core/engine/step_runner.cc runs it),
// publishes the stats and then hands the step's events to the delivery thread
// (event_delivery.h), which runs the callbacks; and ends every request with one FinishEvent.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/engine/engine_impl.h"

namespace glmserve {
namespace {

SessionRegistry::Limits SessionLimits(const EngineOptions& o, const KvCache& cache,
                                      const ModelConfig& config) {
  const int64_t share_blocks =
      static_cast<int64_t>(o.session_kv_fraction * cache.allocator().num_blocks());
  const int64_t share = share_blocks * o.block_size;
  SessionRegistry::Limits limits;
  limits.max_sessions = o.max_sessions;
  limits.max_positions = config.max_position_embeddings;
  limits.token_limit = o.max_session_tokens > 0 ? std::min(o.max_session_tokens, share) : share;
  return limits;
}

}  // namespace

Engine::Impl::Impl(ModelRunner* model, const EngineOptions& options, std::unique_ptr<KvCache> cache)
    : model_(model),
      options_(options),
      cache_(std::move(cache)),
      prefix_(&cache_->allocator(), options.block_size),
      sessions_(SessionLimits(options, *cache_, model->config())),
      session_share_blocks_(
          static_cast<int64_t>(options.session_kv_fraction * cache_->allocator().num_blocks())) {
  // Overlap needs the step's tokens where the step runs; the MTP passes read each step's
  // outputs before the next is built, so they keep steps in sequence.
  overlap_ = options.overlap_steps && model->samples_tokens() && !model->mtp_enabled();
  if (overlap_) executor_ = std::make_unique<StepExecutor>(model_, cache_.get());
  UpdateStats(0);
  delivery_ = std::make_unique<EventDelivery>();
  thread_ = std::thread([this] { Loop(); });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  delivery_.reset();  // every event out before the rest of the engine goes
}

bool Engine::Impl::TakeInbox() {
  std::unique_lock<std::mutex> lock(mu_);
  const bool busy = !waiting_.empty() || !running_.empty() || step_in_flight_;
  if (!busy && inbox_.empty() && cancels_.empty() && abort_status_.ok() && !stop_ && !wake_) {
    // Idle: sleep until a submission, a cancel, a wake-up or the next housekeeping tick
    // (session expiry).
    cv_.wait_for(lock, std::chrono::milliseconds(50), [this] {
      return stop_ || wake_ || !inbox_.empty() || !cancels_.empty() || !abort_status_.ok();
    });
  }
  wake_ = false;
  while (!inbox_.empty()) {
    Sequence* seq = inbox_.front().get();
    live_.emplace(seq->id, std::move(inbox_.front()));
    inbox_.pop_front();
    waiting_.push_back(seq);
  }
  return !stop_;
}

void Engine::Impl::Loop() {
  while (TakeInbox()) {
    std::vector<RequestId> cancels;
    absl::Status abort;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels.swap(cancels_);
      abort.Update(abort_status_);
      abort_status_ = absl::OkStatus();
    }
    if (!abort.ok()) {
      std::vector<Sequence*> all;
      for (auto& [id, seq] : live_) all.push_back(seq.get());
      for (Sequence* seq : all) Finish(seq, FinishReason::kCancelled, abort);
    }
    const SteadyTime now = std::chrono::steady_clock::now();
    ExpireAndCancel(now, cancels);
    ExpireSessions(now);
    Admit();
    if (!outbox_.empty()) {  // cancellations, expiries, refusals: out before the step runs
      UpdateStats(0);
      Deliver();
    }

    if (overlap_) {
      StepOverlapped();  // publishes the stats and calls the step observer per step read
    } else {
      std::vector<Sequence*> selected;
      std::vector<int64_t> counts;
      BuildStep(&selected, &counts);
      if (selected.empty()) {
        if (!waiting_.empty() || !running_.empty()) {
          // Work exists but none can run now (e.g. a session waits for its previous call):
          // wait briefly rather than spin.
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait_for(lock, std::chrono::milliseconds(2),
                       [this] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
        }
        UpdateStats(0);
      } else {
        RunStep(selected, counts);  // publishes the stats and calls the step observer
      }
    }
    Deliver();
  }
  // Shutdown: the launched step is read (its tokens go out), then every unfinished request
  // gets its FinishEvent.
  if (step_in_flight_) {
    CompleteStep(executor_->Wait());
    step_in_flight_ = false;
  }
  executor_.reset();
  std::vector<Sequence*> all;
  for (auto& [id, seq] : live_) all.push_back(seq.get());
  for (Sequence* seq : all) {
    Finish(seq, FinishReason::kCancelled, absl::CancelledError("the engine shut down"));
  }
  UpdateStats(0);
  Deliver();
  EventDelivery::Batch never_admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& seq : inbox_) {
      FinishEvent finish;
      finish.reason = FinishReason::kCancelled;
      finish.status = absl::CancelledError("the engine shut down");
      finish.times = seq->times;
      never_admitted.items.push_back({&seq->callback, Event{seq->id, std::move(finish)}});
      never_admitted.keep_alive.push_back(std::move(seq));
    }
    inbox_.clear();
  }
  delivery_->Post(std::move(never_admitted));
}

void Engine::Impl::ExpireAndCancel(SteadyTime now, const std::vector<RequestId>& cancels) {
  for (RequestId id : cancels) {
    auto it = live_.find(id);
    if (it != live_.end()) {
      Finish(it->second.get(), FinishReason::kCancelled,
             absl::CancelledError("the request was cancelled"));
    }
  }
  std::vector<Sequence*> expired;
  for (auto& [id, seq] : live_) {
    if (seq->deadline && *seq->deadline <= now) expired.push_back(seq.get());
  }
  for (Sequence* seq : expired) {
    Finish(seq, FinishReason::kDeadline,
           absl::DeadlineExceededError("the request's deadline passed"));
  }
}

void Engine::Impl::ExpireSessions(SteadyTime now) {
  for (auto& session : sessions_.TakeExpiredAndClosed(now, options_.session_idle_timeout)) {
    cache_->Free(&session->blocks);
  }
}

void Engine::Impl::ReleaseBlocks(Sequence* seq, bool completed) {
  if (seq->session == nullptr) {
    cache_->Free(&seq->own_blocks);
    return;
  }
  // A session keeps its blocks; the registry moves a completed call's position on.
  sessions_.Release(seq->session, completed, seq->base_position + seq->forward_call()->num_inputs,
                    std::chrono::steady_clock::now());
}

void Engine::Impl::Emit(Sequence* seq, std::variant<TokenEvent, ForwardOutput, FinishEvent> body) {
  outbox_.push_back({seq, Event{seq->id, std::move(body)}});
}

void Engine::Impl::Deliver() {
  // Handed to the delivery thread: the callbacks run there, off the engine's loop, in order.
  EventDelivery::Batch batch;
  batch.items.reserve(outbox_.size());
  for (Outgoing& o : outbox_) batch.items.push_back({&o.seq->callback, std::move(o.event)});
  outbox_.clear();
  // A finished sequence that a launched step still holds stays until that step is read.
  std::vector<std::unique_ptr<Sequence>> held;
  for (std::unique_ptr<Sequence>& seq : finished_) {
    (seq->steps_in_flight > 0 ? held : batch.keep_alive).push_back(std::move(seq));
  }
  finished_.swap(held);
  delivery_->Post(std::move(batch));
}

void Engine::Impl::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  seq->finished = true;
  const Generation* gen = seq->generation();
  if (gen != nullptr && options_.prefix_caching && seq->admitted_order >= 0) {
    prefix_.Insert(gen->tokens, seq->computed, seq->own_blocks);
  }
  const bool was_running = seq->admitted_order >= 0;
  ReleaseBlocks(seq, /*completed=*/reason == FinishReason::kForwardDone);
  if (was_running) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!was_running) --queued_count_;
    running_count_ = static_cast<int64_t>(running_.size());
  }
  FinishEvent finish;
  finish.reason = reason;
  finish.status = std::move(status);
  finish.prompt_tokens = gen != nullptr ? gen->prompt_tokens : seq->forward_call()->num_inputs;
  finish.cached_prompt_tokens = seq->cached_prompt_tokens;
  finish.generated_tokens = gen != nullptr ? gen->generated : 0;
  finish.preemptions = seq->preemptions;
  finish.times = seq->times;
  finish.times.finished = std::chrono::steady_clock::now();
  Emit(seq, std::move(finish));
  // Out of the live set now; kept alive until its events are delivered.
  auto it = live_.find(seq->id);
  finished_.push_back(std::move(it->second));
  live_.erase(it);
}

absl::Status Engine::Impl::CheckInvariants() {
  const BlockAllocator& alloc = cache_->allocator();
  std::vector<int32_t> holders(alloc.num_blocks(), 0);
  auto hold = [&](const BlockTable& table) {
    for (int32_t b : table) ++holders[b];
  };
  int64_t in_queues = 0;
  for (Sequence* seq : running_) {
    if (seq->session == nullptr) hold(seq->own_blocks);
    if (seq->admitted_order < 0) return absl::InternalError("running sequence not admitted");
    if (const Generation* gen = seq->generation()) RETURN_IF_ERROR(CheckSpeculation(*seq, *gen));
    ++in_queues;
  }
  for (Sequence* seq : waiting_) {
    if (!seq->own_blocks.empty()) return absl::InternalError("waiting sequence holds blocks");
    if (seq->steps_in_flight != 0 || seq->in_flight != 0 || seq->pending_entry >= 0) {
      return absl::InternalError("a waiting sequence is in a launched step");
    }
    if (std::find(running_.begin(), running_.end(), seq) != running_.end()) {
      return absl::InternalError("a sequence is both waiting and running");
    }
    ++in_queues;
  }
  if (in_queues != static_cast<int64_t>(live_.size())) {
    return absl::InternalError(
        absl::StrCat(live_.size(), " live requests but ", in_queues, " in the queues"));
  }
  sessions_.ForEachBlockTable(hold);
  prefix_.ForEachBlock([&](int32_t b) { ++holders[b]; });
  int64_t free_blocks = 0;
  for (int32_t b = 0; b < alloc.num_blocks(); ++b) {
    if (holders[b] != alloc.ref_count(b)) {
      return absl::InternalError(absl::StrCat("block ", b, " has reference count ",
                                              alloc.ref_count(b), " but ", holders[b], " holders"));
    }
    free_blocks += alloc.ref_count(b) == 0;
  }
  if (free_blocks != alloc.num_free()) {
    return absl::InternalError(absl::StrCat(free_blocks, " unreferenced blocks but ",
                                            alloc.num_free(), " on the free list"));
  }
  return absl::OkStatus();
}

void Engine::Impl::UpdateStats(int64_t step_delta) {
  steps_ += step_delta;
  if (options_.check_invariants && invariant_error_.empty()) {
    if (absl::Status s = CheckInvariants(); !s.ok()) {
      invariant_error_ = absl::StrCat("after step ", steps_, ": ", s.message());
    }
  }
  EngineStats s;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.sessions = sessions_.Count();
  s.sessions_evicted = sessions_evicted_;
  s.kv_blocks_sessions = sessions_.Blocks();
  s.nonfinite_outputs = nonfinite_outputs_;
  s.kv_blocks_total = cache_->allocator().num_blocks();
  s.kv_blocks_cached = prefix_.evictable_blocks();
  s.kv_blocks_free = cache_->allocator().num_free() + s.kv_blocks_cached;
  s.steps = steps_;
  s.overlapped_steps = overlapped_steps_;
  s.preemptions = preemptions_;
  s.prefix_queries = prefix_.queries();
  s.prefix_hits = prefix_.hits();
  s.prompt_tokens_computed = prompt_computed_;
  s.tokens_generated = generated_total_;
  s.spec_draft_tokens = spec_draft_tokens_;
  s.spec_accepted_tokens = spec_accepted_tokens_;
  s.spec_verify_steps = spec_verify_steps_;
  s.spec_acceptance_lengths = spec_acceptance_lengths_;
  s.invariant_error = invariant_error_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

}  // namespace glmserve
