// The engine thread: admission, scheduling, preemption, the forward step and its events.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/engine_impl.h"
#include "core/parallel.h"

namespace glmserve {
namespace {

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// NaN or Inf in a model output means broken weights or an overflow: no token may be made up
// from it. (A branch-free scan; ~0.1 ms for a 151552-wide row.)
bool AllFinite(const float* values, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(values[i]);
  return finite;
}

absl::Status NonFiniteError(const char* what) {
  return absl::InternalError(absl::StrCat(
      "non-finite ", what, " (NaN or Inf): the model's weights or activations are broken"));
}

}  // namespace

Engine::Impl::Impl(ModelRunner* model, const EngineOptions& options, std::unique_ptr<KvCache> cache)
    : model_(model),
      options_(options),
      cache_(std::move(cache)),
      prefix_(&cache_->allocator(), options.block_size),
      session_share_blocks_(
          static_cast<int64_t>(options.session_kv_fraction * cache_->allocator().num_blocks())) {
  UpdateStats(0);
  thread_ = std::thread([this] { Loop(); });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool Engine::Impl::TakeInbox() {
  std::unique_lock<std::mutex> lock(mu_);
  const bool busy = !waiting_.empty() || !running_.empty();
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

    // Build the step: running sequences in admission order, all of one layer range (the
    // first one's), each taking up to the remaining token budget.
    std::vector<Sequence*> selected;
    std::vector<int64_t> counts;
    int64_t key_begin = -1, key_end = -1;
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence* seq = running_[i];
      const int64_t remaining = seq->total_inputs() - seq->computed;
      if (remaining <= 0) continue;
      if (key_begin >= 0 && (seq->run_begin != key_begin || seq->run_end != key_end)) continue;
      int64_t used = 0;
      for (int64_t c : counts) used += c;
      const int64_t n = std::min(remaining, options_.max_batch_tokens - used);
      if (n <= 0) break;
      if (!EnsureBlocks(seq, seq->base_position + seq->computed + n, &selected)) {
        // Only a pinned session sequence can fail here: nothing left to preempt.
        auto pos = std::find(running_.begin(), running_.end(), seq);
        const bool still_running = pos != running_.end();
        if (still_running) {
          Finish(seq, FinishReason::kError,
                 absl::ResourceExhaustedError("the KV cache is full: this session cannot grow"));
        }
        i = static_cast<size_t>(-1);  // running_ changed: rescan from the start
        selected.clear();
        counts.clear();
        key_begin = key_end = -1;
        continue;
      }
      // Preemption may have removed sequences before i, or ones already selected.
      counts.resize(selected.size());
      auto pos = std::find(running_.begin(), running_.end(), seq);
      if (pos == running_.end()) {  // seq was preempted itself
        i = static_cast<size_t>(-1);
        selected.clear();
        counts.clear();
        key_begin = key_end = -1;
        continue;
      }
      i = static_cast<size_t>(pos - running_.begin());
      key_begin = seq->run_begin;
      key_end = seq->run_end;
      selected.push_back(seq);
      counts.push_back(n);
    }
    if (selected.empty()) {
      if (!waiting_.empty() || !running_.empty()) {
        // Work exists but none can run now (e.g. a session waits for its previous call):
        // wait briefly rather than spin.
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(2),
                     [this] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
      }
      UpdateStats(0);
      continue;
    }
    RunStep(selected, counts);
  }
  // Shutdown: every unfinished request gets its FinishEvent.
  std::vector<Sequence*> all;
  for (auto& [id, seq] : live_) all.push_back(seq.get());
  for (Sequence* seq : all) {
    Finish(seq, FinishReason::kCancelled, absl::CancelledError("the engine shut down"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& seq : inbox_) {
    FinishEvent finish;
    finish.reason = FinishReason::kCancelled;
    finish.status = absl::CancelledError("the engine shut down");
    finish.times = seq->times;
    seq->callback(Event{seq->id, std::move(finish)});
  }
  inbox_.clear();
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
  std::vector<std::unique_ptr<Session>> to_free;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    const auto timeout = absl::ToChronoNanoseconds(options_.session_idle_timeout);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second->in_flight == 0 && now - it->second->last_used > timeout) {
        to_free.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : closed_sessions_) to_free.push_back(std::move(s));
    closed_sessions_.clear();
  }
  for (auto& session : to_free) cache_->Free(&session->blocks);
}

void Engine::Impl::Admit() {
  std::vector<std::pair<Sequence*, absl::Status>> refused;
  int64_t pending = 0;  // prefill tokens already admitted but not computed
  for (Sequence* seq : running_) pending += seq->total_inputs() - seq->computed;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (static_cast<int64_t>(running_.size()) >= options_.max_running ||
        pending >= options_.max_batch_tokens) {
      break;
    }
    Sequence* seq = *it;
    if (seq->session != nullptr) {
      // A session's calls run one at a time, in order: wait while an earlier one runs.
      const bool earlier_running = std::any_of(running_.begin(), running_.end(), [&](Sequence* r) {
        return r->session == seq->session;
      });
      const bool earlier_waiting = std::any_of(
          waiting_.begin(), it, [&](Sequence* w) { return w->session == seq->session; });
      if (earlier_running || earlier_waiting) {
        ++it;
        continue;
      }
    }
    if (seq->session != nullptr) {
      if (absl::Status s = CheckSessionShare(seq); !s.ok()) {
        refused.emplace_back(seq, std::move(s));
        ++it;
        continue;
      }
    }
    if (!AdmitOne(seq)) break;  // FCFS: nothing behind it jumps the queue for KV space
    pending += seq->total_inputs() - seq->computed;
    it = waiting_.erase(it);
  }
  // Finished after the scan: Finish edits waiting_.
  for (auto& [seq, status] : refused) Finish(seq, FinishReason::kError, std::move(status));
}

int64_t Engine::Impl::SessionBlocks() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  int64_t blocks = 0;
  for (const auto& [key, session] : sessions_)
    blocks += static_cast<int64_t>(session->blocks.size());
  for (const auto& session : closed_sessions_)
    blocks += static_cast<int64_t>(session->blocks.size());
  return blocks;
}

absl::Status Engine::Impl::CheckSessionShare(Sequence* seq) {
  const int64_t positions = seq->session->position + seq->total_inputs();
  const int64_t needed =
      BlocksFor(positions, options_.block_size) - static_cast<int64_t>(seq->session->blocks.size());
  if (needed <= 0) return absl::OkStatus();
  while (SessionBlocks() + needed > session_share_blocks_) {
    // Make room inside the share by evicting an idle session other than this one.
    if (!EvictOneIdleSession(seq->session)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sessions hold ", SessionBlocks() * options_.block_size, " of the ",
          session_share_blocks_ * options_.block_size,
          " KV positions they may share; this call needs ", needed * options_.block_size,
          " more (close idle sessions, or raise --session_kv_fraction)"));
    }
  }
  return absl::OkStatus();
}

bool Engine::Impl::EvictOneIdleSession(const Session* keep) {
  const auto grace = absl::ToChronoNanoseconds(options_.session_eviction_grace);
  std::unique_ptr<Session> victim;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    const SteadyTime now = std::chrono::steady_clock::now();
    auto lru = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      const Session& s = *it->second;
      if (&s == keep || s.in_flight > 0 || s.blocks.empty() || now - s.last_used < grace) continue;
      if (lru == sessions_.end() || s.last_used < lru->second->last_used) lru = it;
    }
    if (lru == sessions_.end()) return false;
    victim = std::move(lru->second);
    sessions_.erase(lru);
  }
  cache_->Free(&victim->blocks);
  ++sessions_evicted_;
  return true;
}

bool Engine::Impl::EvictIdleSessions(int64_t blocks, const Session* keep) {
  while (cache_->allocator().num_free() < blocks) {
    if (!EvictOneIdleSession(keep)) return false;
  }
  return true;
}

bool Engine::Impl::AdmitOne(Sequence* seq) {
  BlockTable& table = seq->blocks();
  if (seq->session != nullptr) {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    seq->base_position = seq->session->position;
  }
  int64_t positions = seq->base_position + seq->total_inputs();
  if (seq->is_generate && options_.prefix_caching && table.empty()) {
    // At least the last token is always computed: its logits choose the next token.
    const int64_t max_blocks = (seq->total_inputs() - 1) / options_.block_size;
    const int64_t matched = prefix_.Match(seq->tokens, max_blocks, &table);
    seq->computed = matched * options_.block_size;
    if (seq->preemptions == 0) seq->cached_prompt_tokens = seq->computed;
  }
  const int64_t needed =
      BlocksFor(positions, options_.block_size) - static_cast<int64_t>(table.size());
  // Keep one spare block per running sequence for its decode growth, so that admitting a
  // newcomer does not just get it preempted a few steps later (admit/preempt thrash). An
  // empty engine admits anything that fits at all.
  const int64_t reserve = static_cast<int64_t>(running_.size());
  if (needed > 0 && !prefix_.EnsureFree(needed + reserve) &&
      !EvictIdleSessions(needed + reserve, seq->session)) {
    if (seq->session == nullptr) {
      cache_->Free(&table);  // give back matched prefix blocks
      seq->computed = 0;
    }
    return false;
  }
  if (!cache_->Reserve(&table, positions).ok()) return false;  // cannot happen after EnsureFree
  seq->admitted_order = admissions_++;
  if (!seq->times.first_scheduled) seq->times.first_scheduled = std::chrono::steady_clock::now();
  running_.push_back(seq);
  std::lock_guard<std::mutex> lock(mu_);
  --queued_count_;
  running_count_ = static_cast<int64_t>(running_.size());
  return true;
}

Sequence* Engine::Impl::PickVictim() {
  Sequence* victim = nullptr;
  for (Sequence* seq : running_) {
    if (!seq->preemptible()) continue;
    if (victim == nullptr || seq->admitted_order > victim->admitted_order) victim = seq;
  }
  return victim;
}

void Engine::Impl::Preempt(Sequence* seq, std::vector<Sequence*>* selected) {
  // Recompute later: keep the tokens (prompt and output so far), drop the cache. Its full
  // blocks go to the prefix cache first, so the recompute is mostly hits if they survive.
  if (seq->is_generate && options_.prefix_caching) {
    prefix_.Insert(seq->tokens, seq->computed, seq->own_blocks);
  }
  cache_->Free(&seq->own_blocks);
  seq->computed = 0;
  if (!seq->is_generate) {
    seq->output = ForwardOutput{};  // a forward request recomputes all its rows
  }
  ++seq->preemptions;
  ++preemptions_;
  seq->admitted_order = -1;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  selected->erase(std::remove(selected->begin(), selected->end(), seq), selected->end());
  waiting_.push_front(seq);
  std::lock_guard<std::mutex> lock(mu_);
  ++queued_count_;
  running_count_ = static_cast<int64_t>(running_.size());
}

bool Engine::Impl::EnsureBlocks(Sequence* seq, int64_t positions,
                                std::vector<Sequence*>* selected) {
  BlockTable& table = seq->blocks();
  const int64_t needed =
      BlocksFor(positions, options_.block_size) - static_cast<int64_t>(table.size());
  if (needed <= 0) return true;
  while (!prefix_.EnsureFree(needed) && !EvictIdleSessions(needed, seq->session)) {
    // Idle sessions went first; then the most recently admitted sequence gives way, even when that
    // is `seq` itself: an older request never loses its place to a newer one.
    Sequence* victim = PickVictim();
    if (victim == nullptr) return false;  // only pinned sessions hold blocks
    Preempt(victim, selected);
    if (victim == seq) return true;  // the caller notices seq left running_
  }
  return cache_->Reserve(&table, positions).ok();
}

void Engine::Impl::RunStep(const std::vector<Sequence*>& selected,
                           const std::vector<int64_t>& counts) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t hidden_size = model_->config().hidden_size;
  ForwardBatch batch;
  ForwardOptions options;
  options.layer_begin = selected[0]->run_begin;
  options.layer_end = selected[0]->run_end;
  std::vector<int32_t> ids;
  std::vector<float> hidden_in;
  StepReport report;
  report.sequences = static_cast<int64_t>(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    Sequence* seq = selected[i];
    const int64_t n = counts[i];
    batch.sequences.push_back({n, seq->base_position + seq->computed, &seq->blocks()});
    const bool completes = seq->computed + n == seq->total_inputs();
    if (seq->is_generate) {
      ids.insert(ids.end(), seq->tokens.begin() + seq->computed,
                 seq->tokens.begin() + seq->computed + n);
      options.sequence_logits.push_back(completes ? LogitsRows::kLast : LogitsRows::kNone);
      (seq->computed >= seq->prompt_tokens ? report.decode_tokens : report.prefill_tokens) += n;
    } else {
      const ForwardRequest& f = seq->forward;
      if (seq->run_begin == 0) {
        ids.insert(ids.end(), f.token_ids.begin() + seq->computed,
                   f.token_ids.begin() + seq->computed + n);
      } else {
        hidden_in.insert(hidden_in.end(), f.hidden.begin() + seq->computed * hidden_size,
                         f.hidden.begin() + (seq->computed + n) * hidden_size);
      }
      LogitsRows want = LogitsRows::kNone;
      if (f.logits == LogitsRows::kAll && !f.last_position_only) want = LogitsRows::kAll;
      if ((f.logits == LogitsRows::kLast ||
           (f.logits == LogitsRows::kAll && f.last_position_only)) &&
          completes) {
        want = LogitsRows::kLast;
      }
      options.sequence_logits.push_back(want);
      options.return_hidden |= f.return_hidden;
      report.forward_tokens += n;
    }
  }
  batch.token_ids = ids;
  batch.hidden_in = hidden_in;
  ForwardResult& result = step_result_;
  result.logits.clear();
  result.hidden.clear();
  result.layer_hidden.clear();
  const absl::Status status = model_->Forward(batch, cache_.get(), options, &result);
  if (!status.ok()) {
    for (Sequence* seq : selected) {
      Finish(seq, FinishReason::kError,
             absl::InternalError(absl::StrCat("forward step failed: ", status.message())));
    }
    UpdateStats(1);
    return;
  }
  const int64_t vocab = model_->config().vocab_size;
  int64_t row = 0, logits_row = 0;
  std::vector<Sequence*> finished_forwards, failed;
  std::vector<Sequence*> to_sample;
  std::vector<const float*> sample_rows;
  for (size_t i = 0; i < selected.size(); ++i) {
    Sequence* seq = selected[i];
    const int64_t n = counts[i];
    const LogitsRows want = options.sequence_logits[i];
    const float* logits = result.logits.data() + logits_row * vocab;
    logits_row += want == LogitsRows::kAll ? n : (want == LogitsRows::kLast ? 1 : 0);
    seq->computed += n;
    if (seq->is_generate) {
      prompt_computed_ +=
          std::max<int64_t>(0, std::min(seq->computed, seq->prompt_tokens) - (seq->computed - n));
      if (want == LogitsRows::kLast) {
        to_sample.push_back(seq);
        sample_rows.push_back(logits);
      }
    } else {
      const ForwardRequest& f = seq->forward;
      ForwardOutput& out = seq->output;
      bool finite = true;
      if (f.return_hidden) {
        const int64_t first = f.last_position_only ? n - 1 : 0;
        if (!f.last_position_only || seq->computed == seq->num_inputs) {
          const float* rows_begin = result.hidden.data() + (row + first) * hidden_size;
          const int64_t count = (n - first) * hidden_size;
          finite &= AllFinite(rows_begin, count);
          out.hidden.insert(out.hidden.end(), rows_begin, rows_begin + count);
        }
      }
      if (want != LogitsRows::kNone) {
        const int64_t rows = want == LogitsRows::kAll ? n : 1;
        finite &= AllFinite(logits, rows * vocab);
        out.logits.insert(out.logits.end(), logits, logits + rows * vocab);
      }
      if (!finite) {
        ++nonfinite_outputs_;
        failed.push_back(seq);
      } else if (seq->computed == seq->num_inputs) {
        finished_forwards.push_back(seq);
      }
    }
    row += n;
  }
  // Generated tokens are delivered in batch order, before the forwards' outcomes, as when
  // each was sampled inside the loop above.
  SampleTokens(to_sample, sample_rows);
  for (size_t i = 0; i < to_sample.size(); ++i) {
    AfterGenerateStep(to_sample[i], std::move(sampled_[i]), sampled_finite_[i] != 0);
  }
  for (Sequence* seq : failed) {
    Finish(seq, FinishReason::kError, NonFiniteError("hidden states or logits"));
  }
  for (Sequence* seq : finished_forwards) {
    ForwardOutput out = std::move(seq->output);
    out.rows = seq->forward.last_position_only ? 1 : seq->num_inputs;
    out.start_position = seq->base_position;
    if (!seq->times.first_token) seq->times.first_token = std::chrono::steady_clock::now();
    seq->callback(Event{seq->id, std::move(out)});
    Finish(seq, FinishReason::kForwardDone, absl::OkStatus());
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  UpdateStats(1);
  std::function<void(const StepReport&)> observer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    observer = observer_;
  }
  if (observer) observer(report);
}

void Engine::Impl::SampleTokens(const std::vector<Sequence*>& seqs,
                                const std::vector<const float*>& rows) {
  const int64_t vocab = model_->config().vocab_size;
  sampled_.resize(seqs.size());
  sampled_finite_.assign(seqs.size(), 0);
  auto sample = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Sequence* seq = seqs[i];
      // No token may be made up from NaN or Inf logits (checked here, in parallel too).
      sampled_finite_[i] = AllFinite(rows[i], vocab);
      if (!sampled_finite_[i]) continue;
      const GenerateRequest& g = seq->generate;
      // The logprobs are a full pass over the row each: only when the request asked.
      const LogprobRequest want{g.logprobs || g.top_logprobs > 0, g.top_logprobs};
      sampled_[i] = SampleToken(absl::MakeConstSpan(rows[i], vocab), g.sampling, seq->tokens,
                                static_cast<uint64_t>(seq->generated), want);
    }
  };
  const int64_t n = static_cast<int64_t>(seqs.size());
  if (n > 1) {
    ParallelFor(n, 1, sample);
  } else {
    sample(0, n);
  }
}

void Engine::Impl::AfterGenerateStep(Sequence* seq, SampledToken sampled, bool finite) {
  const ModelConfig& c = model_->config();
  if (seq->generated == 0 && options_.prefix_caching) {
    // The prompt's full blocks are now valid: let concurrent requests share them.
    prefix_.Insert(seq->tokens, seq->computed, seq->own_blocks);
  }
  if (!finite) {
    ++nonfinite_outputs_;
    Finish(seq, FinishReason::kError, NonFiniteError("logits"));
    return;
  }
  const GenerateRequest& g = seq->generate;
  seq->tokens.push_back(sampled.token);
  ++seq->generated;
  ++generated_total_;
  TokenEvent event;
  event.token = sampled.token;
  event.index = seq->generated - 1;
  event.time = std::chrono::steady_clock::now();
  if (g.logprobs || g.top_logprobs > 0) {
    event.logprob = sampled.logprob;
    event.top = std::move(sampled.top);
  }
  if (!seq->times.first_token) seq->times.first_token = event.time;
  seq->callback(Event{seq->id, std::move(event)});

  const bool stop = Contains(g.stop.stop_token_ids, sampled.token) ||
                    (!g.stop.ignore_eos && Contains(c.eos_token_ids, sampled.token));
  if (stop) {
    Finish(seq, FinishReason::kStop, absl::OkStatus());
  } else if (seq->generated >= g.stop.max_new_tokens ||
             static_cast<int64_t>(seq->tokens.size()) >= c.max_position_embeddings) {
    Finish(seq, FinishReason::kLength, absl::OkStatus());
  }
}

void Engine::Impl::ReleaseBlocks(Sequence* seq) {
  if (seq->session == nullptr) {
    cache_->Free(&seq->own_blocks);
    return;
  }
  // A session keeps its blocks; a completed call moves its position on. A failed or
  // cancelled call leaves the position where it was (its partial keys are overwritten by
  // the next call).
  std::lock_guard<std::mutex> lock(sessions_mu_);
  Session* session = seq->session;
  session->last_used = std::chrono::steady_clock::now();
  --session->in_flight;
  if (session->in_flight == 0 && session->position == 0) {
    // Its creating call failed and nothing else is queued on it: a session exists only once
    // a call succeeded, so it goes (freeing its slot under --max_sessions and any blocks).
    auto it = sessions_.find(session->key);
    if (it != sessions_.end() && it->second.get() == session) {
      closed_sessions_.push_back(std::move(it->second));
      sessions_.erase(it);
    }
  }
}

void Engine::Impl::Finish(Sequence* seq, FinishReason reason, absl::Status status) {
  if (seq->is_generate && options_.prefix_caching && seq->admitted_order >= 0) {
    prefix_.Insert(seq->tokens, seq->computed, seq->own_blocks);
  }
  if (seq->session != nullptr && reason == FinishReason::kForwardDone) {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    seq->session->position = seq->base_position + seq->num_inputs;
  }
  const bool was_running = seq->admitted_order >= 0;
  ReleaseBlocks(seq);
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
  finish.prompt_tokens = seq->is_generate ? seq->prompt_tokens : seq->num_inputs;
  finish.cached_prompt_tokens = seq->cached_prompt_tokens;
  finish.generated_tokens = seq->generated;
  finish.preemptions = seq->preemptions;
  finish.times = seq->times;
  finish.times.finished = std::chrono::steady_clock::now();
  const RequestId id = seq->id;
  EventCallback callback = std::move(seq->callback);
  live_.erase(id);  // seq is gone from here on
  callback(Event{id, std::move(finish)});
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
    ++in_queues;
  }
  for (Sequence* seq : waiting_) {
    if (!seq->own_blocks.empty()) return absl::InternalError("waiting sequence holds blocks");
    if (std::find(running_.begin(), running_.end(), seq) != running_.end()) {
      return absl::InternalError("a sequence is both waiting and running");
    }
    ++in_queues;
  }
  if (in_queues != static_cast<int64_t>(live_.size())) {
    return absl::InternalError(
        absl::StrCat(live_.size(), " live requests but ", in_queues, " in the queues"));
  }
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto& [id, session] : sessions_) hold(session->blocks);
    for (auto& session : closed_sessions_) hold(session->blocks);
  }
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
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    s.sessions = static_cast<int64_t>(sessions_.size());
  }
  s.sessions_evicted = sessions_evicted_;
  s.kv_blocks_sessions = SessionBlocks();
  s.nonfinite_outputs = nonfinite_outputs_;
  s.kv_blocks_total = cache_->allocator().num_blocks();
  s.kv_blocks_cached = prefix_.evictable_blocks();
  s.kv_blocks_free = cache_->allocator().num_free() + s.kv_blocks_cached;
  s.steps = steps_;
  s.preemptions = preemptions_;
  s.prefix_queries = prefix_.queries();
  s.prefix_hits = prefix_.hits();
  s.prompt_tokens_computed = prompt_computed_;
  s.tokens_generated = generated_total_;
  s.invariant_error = invariant_error_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

}  // namespace glmserve
