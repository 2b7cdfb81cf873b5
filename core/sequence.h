// One accepted request as the engine thread tracks it from admission to its FinishEvent:
// what it asked for, how far its inputs are computed, and the KV blocks that hold them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/engine.h"
#include "core/kv_cache.h"
#include "core/session_registry.h"

namespace glmserve {

// One accepted request as the scheduler sees it.
struct Sequence {
  RequestId id = 0;
  EventCallback callback;
  std::optional<SteadyTime> deadline;
  Timestamps times;
  bool is_generate = true;

  // Generation: the prompt followed by the tokens generated so far.
  GenerateRequest generate;
  std::vector<int32_t> tokens;
  int64_t prompt_tokens = 0;
  int64_t generated = 0;

  // Forward.
  ForwardRequest forward;
  int64_t num_inputs = 0;  // input positions of the request
  ForwardOutput output;
  Session* session = nullptr;  // not owned; valid while in_flight > 0

  int64_t run_begin = 0;  // layers this request runs
  int64_t run_end = 0;
  int64_t base_position = 0;    // absolute position of input 0 (a session's offset)
  int64_t computed = 0;         // inputs whose keys and values are in the cache
  BlockTable own_blocks;        // the request's blocks when it has no session
  int64_t admitted_order = -1;  // admission counter; -1 while waiting
  int64_t cached_prompt_tokens = 0;
  int64_t preemptions = 0;

  int64_t total_inputs() const {
    return is_generate ? static_cast<int64_t>(tokens.size()) : num_inputs;
  }
  BlockTable& blocks() { return session != nullptr ? session->blocks : own_blocks; }
  // Sequences whose inputs the engine keeps can be preempted and recomputed; a session's
  // earlier calls are gone, so its cache is pinned.
  bool preemptible() const { return session == nullptr; }
};

}  // namespace glmserve
