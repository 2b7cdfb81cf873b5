// The sessions of an engine: state kept between a client's Forward calls, keyed by
// (owner, id). The registry owns its lock; the submitting threads (open, continue, close) and
// the engine thread (positions, expiry, eviction, freeing blocks) only go through it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// One session. Fields other than `blocks` are read and written under the registry's lock;
// `blocks` belongs to the engine thread.
struct Session {
  std::string id;
  std::string key;          // (owner, id) in the registry
  BlockTable blocks;        // owned by the engine thread
  int64_t position = 0;     // tokens processed so far (the next call starts here)
  int64_t layer_begin = 0;  // fixed by the first call
  int64_t layer_end = 0;
  int64_t in_flight = 0;  // accepted calls not yet finished
  SteadyTime last_used;
};

class SessionRegistry {
 public:
  struct Limits {
    int64_t max_sessions = 0;
    int64_t max_positions = 0;  // the model's context
    int64_t token_limit = 0;    // positions one session may hold
  };
  explicit SessionRegistry(Limits limits) : limits_(limits) {}

  // A Forward call on session `id` of `owner` (create or continue), of `inputs` positions
  // through layers [layer_begin, layer_end): checks every session rule, then counts the call
  // in flight. The session stays valid until the matching Release.
  absl::StatusOr<Session*> Acquire(const std::string& owner, const std::string& id, bool create,
                                   int64_t inputs, int64_t layer_begin, int64_t layer_end,
                                   SteadyTime now);
  // Ends a call accepted by Acquire. A completed call moves the position to `end_position`;
  // a failed or cancelled one leaves it (its partial keys are overwritten by the next call).
  // A session whose creating call failed is dropped.
  void Release(Session* session, bool completed, int64_t end_position, SteadyTime now);
  // Where the next call on `session` starts.
  int64_t Position(const Session* session);

  // Closes a session with no call in flight; its blocks are freed by the engine thread.
  absl::Status Close(const std::string& owner, const std::string& id);

  // Sessions idle past `timeout`, and closed ones: the caller frees their blocks.
  std::vector<std::unique_ptr<Session>> TakeExpiredAndClosed(SteadyTime now,
                                                             absl::Duration timeout);
  // The least recently used session holding blocks with no call in flight and idle for at
  // least `grace`, other than `keep`; nullptr if none.
  std::unique_ptr<Session> TakeLeastRecentlyUsedIdle(const Session* keep, SteadyTime now,
                                                     absl::Duration grace);

  int64_t Count();
  int64_t Blocks();  // held by open and closed-not-yet-freed sessions
  // Calls fn(const BlockTable&) for every session's blocks (the invariant checker).
  template <class Fn>
  void ForEachBlockTable(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, session] : sessions_) fn(session->blocks);
    for (const auto& session : closed_) fn(session->blocks);
  }

 private:
  const Limits limits_;
  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Session>> sessions_;
  std::vector<std::unique_ptr<Session>> closed_;  // blocks still to free
};

}  // namespace glmserve
