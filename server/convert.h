// Wire messages to engine requests (with every check the API promises) and engine events
// back to wire messages. Nothing else crosses between proto/ and core/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "glmserve/v1/glmserve.pb.h"

namespace glmserve {

// What the wire checks bound a request by before it reaches the engine: the engine's own
// resolved limits (Engine::limits(), so a limit is configured and resolved in one place) and
// the one bound only the wire knows, the size of a reply message.
struct ServingLimits : RequestLimits {
  int64_t max_reply_bytes = 64 << 20;  // largest message the server sends
};

// Bytes the engine holds (fp32) and the reply carries (in the output dtype) for a Forward
// call, known from its shape before any work.
struct ForwardOutputSize {
  int64_t engine_bytes = 0;
  int64_t reply_bytes = 0;
};
ForwardOutputSize ForwardOutputBytes(const glmserve::ForwardRequest& body,
                                     const glmserve::ModelConfig& config,
                                     v1::DataType output_dtype);

// The wire half of request validation: these decode a message and check what only the wire
// knows (fields set, tensor dtype/shape/bytes, sizes before decoding, the reply's size, the
// default max_new_tokens); the model and engine rules (token ids in the vocabulary, the
// layer span and its input kind, logits needing the last layer, sampling values,
// top_logprobs, Generate needing the whole model) are checked once, by Engine::Submit.
//
// The UTF-8 of request text is checked before these, on the wire bytes (server/wire_utf8.h).

// GenerateRequest -> engine request: the prompt and the values as given, and an unset
// max_new_tokens given the default (limits.default_max_new_tokens, shrunk to fit the model's
// positions). INVALID_ARGUMENT only for an explicit max_new_tokens that, with the prompt,
// exceeds the model's positions; the prompt's emptiness and length and max_new_tokens' range
// are the engine's rules (Engine::Submit), as are the rest.
absl::StatusOr<glmserve::GenerateRequest> ToEngineGenerate(const v1::GenerateRequest& request,
                                                           const glmserve::ModelRunner& model,
                                                           const ServingLimits& limits);
// The same with the prompt given (a text request's encoded prompt_text or messages).
absl::StatusOr<glmserve::GenerateRequest> ToEngineGenerate(const v1::GenerateRequest& request,
                                                           std::vector<int32_t> prompt,
                                                           const glmserve::ModelRunner& model,
                                                           const ServingLimits& limits);

// ForwardRequest -> engine request. INVALID_ARGUMENT for: no input, a hidden-states tensor
// with the wrong dtype, shape ([num_tokens, hidden_size]), byte count or non-finite values,
// too many positions (bounded before decoding), an unknown output dtype, a malformed session
// id. An empty input and no output requested are the engine's to refuse (ValidateForward).
// RESOURCE_EXHAUSTED when the reply would exceed max_reply_bytes, from the shape alone
// (before any compute).
absl::StatusOr<glmserve::ForwardRequest> ToEngineForward(const v1::ForwardRequest& request,
                                                         const glmserve::ModelRunner& model,
                                                         const ServingLimits& limits);

// What every Forward front end checks once its own wire form is decoded into `body` (the
// native ForwardRequest through ToEngineForward, KServe's ModelInfer through
// server/kserve_convert.h): a session id's form, create_session needing one, the output dtype
// being known, and the reply's size from the shape (RESOURCE_EXHAUSTED over max_reply_bytes,
// before any compute). The span, the input's emptiness and every other request rule are the
// engine's (ValidateForward).
absl::Status CheckForwardRequest(const glmserve::ForwardRequest& body, v1::DataType output_dtype,
                                 const glmserve::ModelConfig& config, const ServingLimits& limits);

// Server-side timings relative to `arrival` (the handler's entry).
void FillTimings(const glmserve::Timestamps& times, glmserve::SteadyTime arrival, v1::Timings* out);

// The final message of a successful Generate stream.
void FillFinished(const glmserve::FinishEvent& finish, glmserve::SteadyTime arrival,
                  const std::string& request_id, v1::Finished* out);

void FillToken(const glmserve::TokenEvent& token, v1::GeneratedToken* out);

// Encodes a Forward result: hidden [rows, hidden_size] and logits [rows, vocab_size] as the
// request asked, in its output dtype.
void FillForwardResponse(const glmserve::ForwardOutput& output, const glmserve::ModelConfig& config,
                         const v1::ForwardRequest& request, v1::ForwardResponse* out);

void FillModelConfig(const glmserve::ModelConfig& config, v1::ModelConfig* out);

}  // namespace glmserve
