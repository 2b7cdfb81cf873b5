#include "core/engine/session_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace glmserve {
namespace {

// A session's key in the registry. Ids are arbitrary bytes, so no separator is safe: the
// owner is length-prefixed, which makes (owner, id) -> key one-to-one.
std::string SessionKey(const std::string& owner, const std::string& id) {
  return absl::StrCat(owner.size(), ":", owner, id);
}

// At most this much of a client-chosen id is quoted back in an error.
std::string Quoted(const std::string& id) {
  constexpr size_t kShown = 64;
  if (id.size() <= kShown) return absl::StrCat("'", id, "'");
  return absl::StrCat("'", id.substr(0, kShown), "...' (", id.size(), " bytes)");
}

}  // namespace

absl::StatusOr<Session*> SessionRegistry::Acquire(const std::string& owner, const std::string& id,
                                                  bool create, int64_t inputs, int64_t layer_begin,
                                                  int64_t layer_end, SteadyTime now) {
  const std::string key = SessionKey(owner, id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(key);
  if (create) {
    if (it != sessions_.end()) {
      return absl::AlreadyExistsError(absl::StrCat("session ", Quoted(id), " already exists"));
    }
    if (static_cast<int64_t>(sessions_.size()) >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server holds its maximum of ", limits_.max_sessions, " sessions"));
    }
  } else if (it == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no session ", Quoted(id),
                     " (never created, closed, expired, or evicted to free KV cache)"));
  }
  const int64_t position = it == sessions_.end() ? 0 : it->second->position;
  if (position + inputs > limits_.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("session ", Quoted(id),
                                                   " would pass the model's context of ",
                                                   limits_.max_positions, " positions"));
  }
  if (position + inputs > limits_.token_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", Quoted(id), " would hold ", position + inputs,
                     " positions; a session may hold at most ", limits_.token_limit,
                     " (see --max_session_tokens and --session_kv_fraction)"));
  }
  if (it == sessions_.end()) {
    auto session = std::make_unique<Session>();
    session->id = id;
    session->key = key;
    session->layer_begin = layer_begin;
    session->layer_end = layer_end;
    it = sessions_.emplace(key, std::move(session)).first;
  }
  Session& session = *it->second;
  if (session.layer_begin != layer_begin || session.layer_end != layer_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", Quoted(id), " runs layers [", session.layer_begin, ", ", session.layer_end,
        "); this call asks for [", layer_begin, ", ", layer_end, ")"));
  }
  ++session.in_flight;
  session.last_used = now;
  return &session;
}

void SessionRegistry::Release(Session* session, bool completed, int64_t end_position,
                              SteadyTime now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (completed) session->position = end_position;
  session->last_used = now;
  --session->in_flight;
  if (session->in_flight == 0 && session->position == 0) {
    // Its creating call failed and nothing else is queued on it: a session exists only once
    // a call succeeded, so it goes (freeing its slot under --max_sessions and any blocks).
    auto it = sessions_.find(session->key);
    if (it != sessions_.end() && it->second.get() == session) {
      closed_.push_back(std::move(it->second));
      sessions_.erase(it);
    }
  }
}

int64_t SessionRegistry::Position(const Session* session) {
  std::lock_guard<std::mutex> lock(mu_);
  return session->position;
}

absl::Status SessionRegistry::Close(const std::string& owner, const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(SessionKey(owner, id));
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", Quoted(id)));
  if (it->second->in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", Quoted(id), " has ", it->second->in_flight, " requests in flight"));
  }
  closed_.push_back(std::move(it->second));
  sessions_.erase(it);
  return absl::OkStatus();
}

std::vector<std::unique_ptr<Session>> SessionRegistry::TakeExpiredAndClosed(
    SteadyTime now, absl::Duration timeout) {
  const auto limit = absl::ToChronoNanoseconds(timeout);
  std::vector<std::unique_ptr<Session>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->in_flight == 0 && now - it->second->last_used > limit) {
      out.push_back(std::move(it->second));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& s : closed_) out.push_back(std::move(s));
  closed_.clear();
  return out;
}

std::unique_ptr<Session> SessionRegistry::TakeLeastRecentlyUsedIdle(const Session* keep,
                                                                    SteadyTime now,
                                                                    absl::Duration grace) {
  const auto min_idle = absl::ToChronoNanoseconds(grace);
  std::lock_guard<std::mutex> lock(mu_);
  auto lru = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    const Session& s = *it->second;
    if (&s == keep || s.in_flight > 0 || s.blocks.empty() || now - s.last_used < min_idle) continue;
    if (lru == sessions_.end() || s.last_used < lru->second->last_used) lru = it;
  }
  if (lru == sessions_.end()) return nullptr;
  std::unique_ptr<Session> victim = std::move(lru->second);
  sessions_.erase(lru);
  return victim;
}

int64_t SessionRegistry::Count() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}

int64_t SessionRegistry::Blocks() {
  int64_t blocks = 0;
  ForEachBlockTable([&](const BlockTable& t) { blocks += static_cast<int64_t>(t.size()); });
  return blocks;
}

}  // namespace glmserve
