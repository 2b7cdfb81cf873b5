// The scheduler, on the engine thread: which waiting requests are admitted, how KV blocks are
// found for them (prefix cache, idle-session eviction, then preemption of the most recently
// admitted), and which running sequences make up the next step.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/engine/engine_impl.h"

namespace glmserve {

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

absl::Status Engine::Impl::CheckSessionShare(Sequence* seq) {
  const int64_t positions = seq->session->position + seq->total_inputs();
  const int64_t needed =
      BlocksFor(positions, options_.block_size) - static_cast<int64_t>(seq->session->blocks.size());
  if (needed <= 0) return absl::OkStatus();
  while (sessions_.Blocks() + needed > session_share_blocks_) {
    // Make room inside the share by evicting an idle session other than this one.
    if (!EvictOneIdleSession(seq->session)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sessions hold ", sessions_.Blocks() * options_.block_size, " of the ",
          session_share_blocks_ * options_.block_size,
          " KV positions they may share; this call needs ", needed * options_.block_size,
          " more (close idle sessions, or raise --session_kv_fraction)"));
    }
  }
  return absl::OkStatus();
}

bool Engine::Impl::EvictOneIdleSession(const Session* keep) {
  std::unique_ptr<Session> victim = sessions_.TakeLeastRecentlyUsedIdle(
      keep, std::chrono::steady_clock::now(), options_.session_eviction_grace);
  if (victim == nullptr) return false;
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
  if (seq->session != nullptr) seq->base_position = sessions_.Position(seq->session);
  int64_t positions = seq->base_position + seq->total_inputs();
  if (const Generation* gen = seq->generation();
      gen != nullptr && options_.prefix_caching && table.empty()) {
    // At least the last token is always computed: its logits choose the next token.
    const int64_t max_blocks = (seq->total_inputs() - 1) / options_.block_size;
    const int64_t matched = prefix_.Match(gen->tokens, max_blocks, &table);
    seq->computed = matched * options_.block_size;
    if (seq->preemptions == 0) seq->cached_prompt_tokens = seq->computed;
    // The matched blocks' MTP-layer rows are taken as they are (docs/mtp.md: they can only
    // make a draft worse, never an output different).
    seq->generation()->mtp_computed = seq->computed;
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
  if (const Generation* gen = seq->generation(); gen != nullptr && options_.prefix_caching) {
    prefix_.Insert(gen->tokens, seq->computed, seq->own_blocks);
  }
  cache_->Free(&seq->own_blocks);
  seq->computed = 0;
  if (Generation* gen = seq->generation()) gen->ResetSpeculation();
  if (ForwardCall* call = seq->forward_call()) {
    call->output = ForwardOutput{};  // a forward request recomputes all its rows
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

bool Engine::Impl::EnsureBlocks(Sequence* seq, int64_t positions, std::vector<Sequence*>* selected,
                                bool may_preempt) {
  BlockTable& table = seq->blocks();
  const int64_t needed =
      BlocksFor(positions, options_.block_size) - static_cast<int64_t>(table.size());
  if (needed <= 0) return true;
  while (!prefix_.EnsureFree(needed) && !EvictIdleSessions(needed, seq->session)) {
    if (!may_preempt) return false;
    // Idle sessions went first; then the most recently admitted sequence gives way, even when that
    // is `seq` itself: an older request never loses its place to a newer one.
    Sequence* victim = PickVictim();
    if (victim == nullptr) return false;  // only pinned sessions hold blocks
    Preempt(victim, selected);
    if (victim == seq) return true;  // the caller notices seq left running_
  }
  return cache_->Reserve(&table, positions).ok();
}

bool Engine::Impl::CanDecodeAhead(const Sequence& seq) const {
  const Generation* gen = seq.generation();
  if (gen == nullptr) return false;
  const GenerateRequest& g = gen->request;
  // Its pending token must not be its last (a known length limit), and no MTP drafts follow
  // it. (A repetition penalty and forced tokens that start after a trigger token depend on
  // the pending token: the executor completes those requests once it is known.)
  return gen->generated + 1 < g.stop.max_new_tokens &&
         static_cast<int64_t>(gen->tokens.size()) + 1 < model_->config().max_position_embeddings &&
         gen->draft_k == 0;
}

void Engine::Impl::BuildStep(std::vector<Sequence*>* selected, std::vector<int64_t>* counts,
                             bool* blocked) {
  // Running sequences in admission order, all of one layer range (the first one's), each
  // taking up to the remaining token budget. Growing a sequence's blocks can take it out of
  // running_ (preempted, or failed when a pinned session cannot grow): the selection then
  // starts over. Preemption otherwise only removes later-admitted sequences, which are
  // neither selected yet nor before the scan's position. While a step runs (`blocked`), a
  // sequence's inputs start after that step's, and nothing is preempted: the running step
  // writes the cache of the sequences it holds.
  for (bool restart = true; restart;) {
    restart = false;
    selected->clear();
    counts->clear();
    int64_t used = 0;
    for (size_t i = 0; i < running_.size() && !restart; ++i) {
      Sequence* seq = running_[i];
      const int64_t remaining = seq->known_inputs() - seq->scheduled();
      if (remaining <= 0) continue;
      if (seq->pending_entry >= 0 && !CanDecodeAhead(*seq)) continue;  // waits for its token
      if (!selected->empty() && (seq->run_begin != selected->front()->run_begin ||
                                 seq->run_end != selected->front()->run_end)) {
        continue;
      }
      const int64_t n = std::min(remaining, options_.max_batch_tokens - used);
      if (n <= 0) break;
      const int64_t positions = seq->base_position + seq->scheduled() + n;
      if (blocked != nullptr) {
        if (!EnsureBlocks(seq, positions, selected, /*may_preempt=*/false)) {
          *blocked = true;
          selected->clear();
          counts->clear();
          return;
        }
        selected->push_back(seq);
        counts->push_back(n);
        used += n;
      } else if (!EnsureBlocks(seq, positions, selected)) {
        // Only a pinned session sequence can fail here: nothing left to preempt.
        Finish(seq, FinishReason::kError,
               absl::ResourceExhaustedError("the KV cache is full: this session cannot grow"));
        restart = true;
      } else if (seq->admitted_order < 0) {  // preempted itself to make room for older ones
        restart = true;
      } else {
        // A decode may verify its MTP drafts too, in whatever room is left.
        const int64_t drafts = DraftsToVerify(seq, n, options_.max_batch_tokens - used - n);
        selected->push_back(seq);
        counts->push_back(n + drafts);
        used += n + drafts;
      }
    }
  }
}

}  // namespace glmserve
