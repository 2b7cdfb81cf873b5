// The generation request and its ending, as every front end and the engine see them: what a
// client asks for (prompt, sampling, stops, forced tokens) and why a request ended. Its own
// header, below the engine, so that core/text (which fills and reads these) never depends on
// the engine itself. The rules on them are checked in one place, Engine::Submit
// (core/engine/engine.cc: ValidateGenerate), and ValidateSamplingParams for the sampling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/request/sampling_params.h"

namespace glmserve {

struct StopCriteria {
  int32_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // in addition to the config's eos ids
  bool ignore_eos = false;              // do not stop at the config's eos ids
};

// Alternatives per generated token a request may ask for (top_logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

// Tokens the engine emits instead of sampling, at a fixed place in the output: the start of a
// tool call a client demanded (the OpenAI API's tool_choice "required" or a named function),
// or any other forced prefix. The model still runs every step as usual (each forced token is
// fed back like a sampled one), only the choice is taken away, so the mechanism is a pure
// function of the request and its own output: other sequences in the batch, preemption and
// recompute, and prefix-cache hits cannot change where or what is forced.
//  - Where: at output index 0 when `after_token` is -1; otherwise right after the first
//    generated `after_token` (e.g. GLM's "</think>": the forced part follows the model's
//    reasoning). If the model never generates `after_token`, nothing is forced.
//  - Streaming: each forced token is a TokenEvent like any other, in order.
//  - Logprobs: a forced token reports the model's own logprob of it (the raw log-softmax,
//    as for sampled tokens) and the usual top alternatives, so a client sees how far the
//    forcing departed from what the model wanted.
//  - Stops: a forced token that is a stop id ends the generation; max_new_tokens counts
//    forced tokens too (a limit reached mid-prefix ends it with kLength).
//  - The random stream is indexed by output position, so the sampled tokens after the
//    forced ones are those any other request with the same history would draw.
inline constexpr size_t kMaxForcedTokens = 256;
struct ForcedTokens {
  std::vector<int32_t> tokens;  // emitted in this order; empty: nothing forced
  int32_t after_token = -1;     // -1: from the first generated token
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  StopCriteria stop;
  bool logprobs = false;     // report each chosen token's logprob
  int32_t top_logprobs = 0;  // and this many alternatives (0..kMaxTopLogprobs)
  // 0: sample from the whole vocabulary. Else from ids [0, sample_vocab_limit) only (<=
  // vocab_size), logprobs over that range too: a text request bounds it by the tokenizer's
  // ids, since a model's padding rows past them have no text.
  int32_t sample_vocab_limit = 0;
  ForcedTokens forced;  // ids within the vocabulary (and sample_vocab_limit when set)
  // Tokens the MTP layer drafts per step for this request (docs/mtp.md): -1 the server's
  // setting, 0 none, up to kMaxMtpDraftTokens on a server that runs the MTP layer. Never
  // changes the output: drafts are verified against the model's own choice.
  int32_t mtp_draft_tokens = -1;
};

inline constexpr int32_t kMaxMtpDraftTokens = 8;

enum class FinishReason { kStop, kLength, kForwardDone, kCancelled, kDeadline, kError };
const char* FinishReasonName(FinishReason reason);

}  // namespace glmserve
