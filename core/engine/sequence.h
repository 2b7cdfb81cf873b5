// One accepted request as the engine thread tracks it from admission to its FinishEvent:
// what it asked for, how far its inputs are computed, and the KV blocks that hold them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/session_registry.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// What a Generate request carries through the engine.
struct Generation {
  GenerateRequest request;
  std::vector<int32_t> tokens;  // the prompt followed by the tokens generated so far
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  // Output index of request.forced's first token; -1 while not (yet) known. Derived only
  // from the request and `tokens`, which preemption keeps, so a recompute forces the same.
  int64_t forced_from = -1;

  // Speculative decoding with the MTP layer (docs/mtp.md; core/engine/speculation.cc).
  int32_t draft_k = 0;          // drafts per step (0: the MTP layer never runs for it)
  std::vector<int32_t> drafts;  // drafted tokens after tokens.back(), verified next step
  // Positions [0, mtp_computed) have the MTP layer's K/V in the cache; mtp_hidden holds the
  // model's head inputs for positions [mtp_computed, ...) that still wait for their pass.
  int64_t mtp_computed = 0;
  std::vector<float> mtp_hidden;  // [rows, hidden]
  // Known tokens from input position `from` on (the drafts not counted).
  int64_t total_inputs_from(int64_t from) const {
    return static_cast<int64_t>(tokens.size()) - from;
  }
  // For a sampling runner: the distinct ids of tokens[0, penalised_upto) below the request's
  // vocabulary limit, ascending (PenalisedIds of that history), brought up to date one new
  // token at a time instead of sorting the whole history every step.
  std::vector<int32_t> penalised;
  int64_t penalised_upto = 0;

  void ResetSpeculation() {
    drafts.clear();
    mtp_computed = 0;
    mtp_hidden.clear();
  }

  // The token forced at output index `index`, or -1 when the sampler chooses (as far as
  // known: before the trigger token, -1).
  int32_t ForcedAt(int64_t index) const {
    const std::vector<int32_t>& forced = request.forced.tokens;
    if (forced_from < 0 || index < forced_from) return -1;
    const int64_t i = index - forced_from;
    return i < static_cast<int64_t>(forced.size()) ? forced[static_cast<size_t>(i)] : -1;
  }
  // The token forced at output index `generated`, or -1 when the sampler chooses.
  int32_t ForcedNext() const { return ForcedAt(generated); }
  // Called after each output token is appended: starts the forced part after its trigger.
  void NoteGenerated(int32_t token) {
    if (forced_from < 0 && !request.forced.tokens.empty() && token == request.forced.after_token) {
      forced_from = generated;
    }
  }
};

// What a Forward request carries through the engine.
struct ForwardCall {
  ForwardRequest request;
  int64_t num_inputs = 0;  // input positions of the request
  ForwardOutput output;    // rows gathered so far
};

// One accepted request as the scheduler sees it: the kind-specific part (`work`) and what
// scheduling needs of every request.
struct Sequence {
  RequestId id = 0;
  EventCallback callback;
  std::optional<SteadyTime> deadline;
  Timestamps times;
  std::variant<Generation, ForwardCall> work;
  Session* session = nullptr;  // Forward calls on a session; valid while in_flight > 0

  int64_t run_begin = 0;  // layers this request runs
  int64_t run_end = 0;
  int64_t base_position = 0;  // absolute position of input 0 (a session's offset)
  int64_t computed = 0;       // inputs whose keys and values are in the cache
  // Overlapped steps (docs/engine.md): inputs of launched steps whose outputs the engine has
  // not read yet, how many such steps hold it (it stays alive until they are read), and the
  // token one of them samples for it: that step's id and sample entry (-1: none pending).
  int64_t in_flight = 0;
  int32_t steps_in_flight = 0;
  uint64_t pending_step = 0;
  int64_t pending_entry = -1;
  BlockTable own_blocks;        // the request's blocks when it has no session
  int64_t admitted_order = -1;  // admission counter; -1 while waiting
  int64_t cached_prompt_tokens = 0;
  int64_t preemptions = 0;
  bool finished = false;  // Finish ran; kept alive until its events are delivered

  Generation* generation() { return std::get_if<Generation>(&work); }
  const Generation* generation() const { return std::get_if<Generation>(&work); }
  ForwardCall* forward_call() { return std::get_if<ForwardCall>(&work); }
  const ForwardCall* forward_call() const { return std::get_if<ForwardCall>(&work); }

  // Input positions: a generation's tokens so far, a forward call's inputs.
  int64_t total_inputs() const {
    const Generation* g = generation();
    return g != nullptr ? static_cast<int64_t>(g->tokens.size()) : forward_call()->num_inputs;
  }
  // Input positions once the launched steps' outputs are read: a sampled token pending
  // counts as an input already.
  int64_t known_inputs() const { return total_inputs() + (pending_entry >= 0 ? 1 : 0); }
  // The first input position no launched step covers.
  int64_t scheduled() const { return computed + in_flight; }
  BlockTable& blocks() { return session != nullptr ? session->blocks : own_blocks; }
  // Sequences whose inputs the engine keeps can be preempted and recomputed; a session's
  // earlier calls are gone, so its cache is pinned.
  bool preemptible() const { return session == nullptr; }
};

}  // namespace glmserve
