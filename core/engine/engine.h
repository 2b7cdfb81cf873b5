// Engine: turns many concurrent requests into one stream of forward steps (continuous,
// iteration-level batching), as production servers do, without letting one request change
// another's result.
//
// One engine thread owns the ModelRunner, the KV cache, the scheduler and the sessions, and
// runs the step loop. Any thread may Submit, Cancel or CloseSession; a request's events are
// delivered through its callback on the engine's delivery thread (event_delivery.h), in the
// order the engine emitted them, never on the step loop: a slow callback delays other
// requests' events, not the steps. Callbacks should still be quick (hand the event to your own
// queue; see EventQueue) and may call Cancel or Submit.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/engine/runner_factory.h"
#include "core/engine/sampler.h"
#include "core/model/forward_types.h"
#include "core/model/model_runner.h"
#include "core/request/generate_request.h"

namespace glmserve {

using RequestId = uint64_t;
using SteadyTime = std::chrono::steady_clock::time_point;

// ---- Requests ----------------------------------------------------------------------------

struct ForwardRequest {
  // Exactly one input: token ids (the span starts at layer 0) or hidden states
  // [num_tokens, hidden] row-major (the span starts later).
  std::vector<int32_t> token_ids;
  std::vector<float> hidden;
  int64_t num_tokens = 0;  // rows of `hidden`; ignored for token input
  // Layers [layer_begin, layer_end) of the served span; -1: the served span's bound.
  int64_t layer_begin = -1;
  int64_t layer_end = -1;
  // Non-empty: the request continues this session's sequence (positions go on from where its
  // last call ended; its KV cache stays on the server between calls). The first call sets
  // create_session (ALREADY_EXISTS if the id is taken); later calls on an unknown, closed or
  // expired session end with NOT_FOUND, so a pipeline never silently restarts at position 0.
  // Calls on one session run in submission order, and all use the first call's layers.
  std::string session_id;
  bool create_session = false;
  // Who calls (the server's authenticated identity; empty without authentication). Sessions
  // are keyed by (owner, id): another caller's session is invisible, NOT_FOUND as if unknown.
  std::string session_owner;
  bool return_hidden = true;              // residual stream after layer_end - 1
  LogitsRows logits = LogitsRows::kNone;  // needs layer_end == the model's last layer
  bool last_position_only = false;        // hidden/logits of the last position only
};

struct Request {
  Request(GenerateRequest generate) : body(std::move(generate)) {}  // NOLINT: implicit
  Request(ForwardRequest forward) : body(std::move(forward)) {}     // NOLINT: implicit

  std::variant<GenerateRequest, ForwardRequest> body;
  std::optional<SteadyTime> deadline;  // dropped with DEADLINE_EXCEEDED when passed
  std::string client_request_id;       // echoed for logs; not interpreted
};

// ---- Events ------------------------------------------------------------------------------

struct TokenEvent {
  int32_t token = 0;
  int64_t index = 0;     // 0 for the first generated token
  float logprob = 0.0f;  // when logprobs were requested
  std::vector<TokenLogprob> top;
  SteadyTime time;
};

struct ForwardOutput {
  int64_t rows = 0;            // positions returned (all new tokens, or 1)
  int64_t start_position = 0;  // absolute position of the first new token
  std::vector<float> hidden;   // [rows, hidden] if requested
  std::vector<float> logits;   // [rows, vocab] if requested
};

struct Timestamps {
  SteadyTime arrived;
  std::optional<SteadyTime> first_scheduled;
  std::optional<SteadyTime> first_token;
  std::optional<SteadyTime> finished;
};

struct FinishEvent {
  FinishReason reason = FinishReason::kStop;
  absl::Status status;  // OK for kStop / kLength / kForwardDone
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;  // times this request was preempted and recomputed
  Timestamps times;
};

struct Event {
  RequestId id = 0;
  std::variant<TokenEvent, ForwardOutput, FinishEvent> body;
};

// Receives a request's events on the engine's delivery thread, in order. Exactly one
// FinishEvent ends every accepted request, whatever happens to it.
using EventCallback = std::function<void(Event&&)>;

// ---- Engine ------------------------------------------------------------------------------

// Session ids are 1..kMaxSessionIdBytes bytes; errors never echo more than a prefix of one.
inline constexpr size_t kMaxSessionIdBytes = 256;
absl::Status ValidateSessionId(const std::string& session_id);

// The request limits, one struct for every API: Engine::Create resolves them against the model
// (0: the model's max_position_embeddings; nothing above it) and Submit enforces them; servers
// read the resolved values back (Engine::limits()) to bound sizes before decoding a request,
// to fill an unset max_new_tokens and to report them to clients.
struct RequestLimits {
  int64_t max_prompt_tokens = 0;         // also bounds Forward's new positions
  int64_t max_new_tokens = 0;            // the largest max_new_tokens accepted
  int64_t default_max_new_tokens = 256;  // for requests that leave it unset; <= max_new_tokens
};

struct EngineOptions {
  int64_t max_batch_tokens = 2048;  // new tokens per step (decodes + prefill chunks)
  int64_t max_running = 64;         // sequences in the running set
  int64_t max_waiting = 1024;       // queued requests; beyond: RESOURCE_EXHAUSTED
  int64_t block_size = 16;          // tokens per KV block
  int64_t kv_capacity_tokens = 0;   // KV slots; 0: 32768
  // The cache's element format (ModelRunner::SetKvCacheDType; the FP8 cache is the CPU
  // backend's): the same kv_capacity_tokens in fewer bytes.
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  bool prefix_caching = true;
  int64_t max_sessions = 64;
  absl::Duration session_idle_timeout = absl::Minutes(10);
  // Sessions pin their KV blocks between calls and cannot be preempted, so they are bounded:
  // all sessions together hold at most this share of the cache, and one session at most
  // max_session_tokens (0: the whole share). A session call beyond either fails with
  // RESOURCE_EXHAUSTED instead of waiting.
  double session_kv_fraction = 0.5;
  int64_t max_session_tokens = 0;
  // Sessions with no call in flight and idle for at least this long are evicted, least
  // recently used first, when a request cannot get KV blocks otherwise (before any running
  // request is preempted); a later call on an evicted session gets NOT_FOUND.
  absl::Duration session_eviction_grace = absl::Seconds(1);
  RequestLimits limits;  // enforced at submission
  // Speculative decoding with the model's MTP layer (docs/mtp.md): tokens drafted per step
  // for requests that do not choose (GenerateRequest::mtp_draft_tokens), 0..
  // kMaxMtpDraftTokens. Above 0 Engine::Create turns the layer on (ModelRunner::EnableMtp)
  // and fails where the model or backend has none. Outputs are identical either way.
  int32_t mtp_draft_tokens = 0;
  // Drafting pauses in steps where more sequences than this decode (0: never): a big batch is
  // compute-bound, and every draft is then extra work (docs/mtp.md, "When it pays"). Paused
  // sequences skip the MTP layer too; their next drafts read its cache rows of the skipped
  // positions as they are (slower drafts, never different outputs).
  int64_t mtp_max_batch = 4;
  // Overlapped steps (docs/engine.md): with a runner that samples where the logits are
  // (ModelRunner::samples_tokens) and no MTP layer on, steps run on a thread of their own and
  // the engine builds step N + 1 while step N runs, its decodes taking step N's tokens
  // without waiting for them. Outputs are the same either way.
  bool overlap_steps = true;
  // Tests: after every step, verify the block accounting and request bookkeeping (every
  // block's reference count equals its holders; every live request is in exactly one
  // queue). The first violation is kept in EngineStats::invariant_error.
  bool check_invariants = false;
};

// Cumulative counters and instantaneous gauges, readable from any thread.
struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t sessions = 0;
  int64_t sessions_evicted = 0;    // evicted to free KV blocks (cumulative)
  int64_t kv_blocks_sessions = 0;  // pinned by sessions
  int64_t nonfinite_outputs = 0;   // requests failed for NaN/Inf logits or hidden states
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;    // free plus evictable prefix-cache blocks
  int64_t kv_blocks_cached = 0;  // held only by the prefix cache
  int64_t steps = 0;
  int64_t overlapped_steps = 0;  // of which built and launched while the one before ran
  int64_t preemptions = 0;
  int64_t prefix_queries = 0;          // full prompt blocks looked up
  int64_t prefix_hits = 0;             // of which found in the cache
  int64_t prompt_tokens_computed = 0;  // prompt tokens that went through the model
  int64_t tokens_generated = 0;
  // Speculative decoding (docs/mtp.md): MTP drafts verified, how many the model agreed
  // with, verify steps, and per step the tokens a sequence gained (acceptance length,
  // accepted drafts + 1): acceptance_lengths[n] steps gained n tokens (index 0 unused).
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verify_steps = 0;
  std::vector<int64_t> spec_acceptance_lengths;  // [kMaxMtpDraftTokens + 2]
  std::string invariant_error;                   // empty unless check_invariants found a violation
  double kv_usage() const {
    return kv_blocks_total == 0 ? 0.0 : 1.0 - static_cast<double>(kv_blocks_free) / kv_blocks_total;
  }
};

// What one step did, reported after it (for metrics; computed outside the model's forward).
struct StepReport {
  int64_t sequences = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t forward_tokens = 0;  // Forward-request tokens
  int64_t draft_tokens = 0;    // MTP drafts verified in this step
  int64_t mtp_tokens = 0;      // positions through the MTP layer (its prefill, drafts)
  double seconds = 0;
};

// The one check of EngineOptions (ranges that keep every derived size in range):
// INVALID_ARGUMENT naming the option.
absl::Status ValidateEngineOptions(const EngineOptions& options);

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> model,
                                                        const EngineOptions& options);
  ~Engine();  // stops the loop; unfinished requests end with CANCELLED

  // Validates and queues a request. On error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED for a full
  // queue or a request larger than the KV cache, UNAVAILABLE while draining) nothing is
  // queued and the callback is never called. On success the callback later receives the
  // request's events, ending with one FinishEvent.
  absl::StatusOr<RequestId> Submit(Request request, EventCallback callback);

  // The rules Submit applies to a generation request (the one validator: ValidateGenerate),
  // without queueing it, for a front end that refuses a bad request before it commits
  // anything to it (a stream slot); Submit checks them again.
  absl::Status Validate(const GenerateRequest& request) const;

  // Ends a request at once (its blocks are freed before the next step); FinishEvent with
  // kCancelled / CANCELLED. Unknown or finished ids are ignored. It only queues the id under
  // a lock the engine does not hold while delivering events, so an event callback may call
  // it (a front end cancels from the token callback when a stop string matched).
  void Cancel(RequestId id);

  // Frees a session's KV cache. NOT_FOUND when `owner` has no such session (another owner's
  // session is invisible); INVALID_ARGUMENT for a malformed id; FAILED_PRECONDITION while one
  // of its requests is in flight.
  absl::Status CloseSession(const std::string& session_id, const std::string& owner = "");

  // New submissions are refused with UNAVAILABLE; queued and running ones continue.
  void StartDraining();
  // Ends every queued and running request with `status` (kCancelled) before the next step:
  // the end of a drain, so that clients see a retryable status rather than a broken stream.
  void AbortAll(absl::Status status);
  bool draining() const { return draining_.load(); }
  // True when nothing is queued or running.
  bool Idle() const;

  EngineStats Stats() const;
  // The runner's health (ModelRunner::health): not OK once it can no longer run steps (a
  // tensor-parallel rank failed, core/model/rank_group.h). Submit then refuses with it.
  absl::Status health() const { return model_->health(); }
  // Called once, on the engine thread, when a step fails and the runner reports itself
  // unhealthy (glm-server then reports not ready, with the reason); must be quick.
  void SetUnhealthyObserver(std::function<void(const absl::Status&)> observer);
  // Called on the engine thread after every step; must be quick.
  void SetStepObserver(std::function<void(const StepReport&)> observer);

  const ModelRunner& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  // options().limits resolved against the model (every field > 0).
  const RequestLimits& limits() const { return options_.limits; }
  int64_t kv_capacity_tokens() const;
  // KV bytes one token slot takes in this engine's cache (its dtype's).
  int64_t kv_bytes_per_token() const;
  // The cache's element dtype (kF32, kBF16 or kF8E4M3).
  DType kv_cache_dtype() const;

 private:
  class Impl;
  Engine(std::unique_ptr<ModelRunner> model, const EngineOptions& options);

  std::unique_ptr<ModelRunner> model_;
  EngineOptions options_;
  std::atomic<bool> draining_{false};
  std::unique_ptr<Impl> impl_;
};

// A thread-safe queue of one request's events, for callers that prefer to wait: pass
// queue->Callback() to Submit and Pop() until a FinishEvent arrives.
class EventQueue {
 public:
  EventCallback Callback();
  // Blocks until an event is available (or the timeout passes: nullopt).
  std::optional<Event> Pop(absl::Duration timeout = absl::InfiniteDuration());

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

}  // namespace glmserve
