// The OpenAI routes' work once a request is admitted and its body read: GET /v1/models, and
// POST /v1/completions and /v1/chat/completions through the engine, streamed as server-sent
// events or answered as one JSON object. Text goes through core/text/text_generation.h (the
// one place prompts are built and generated ids become text, reasoning and tool calls), so
// this API and glmserve.v1 give the same text for the same request.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "server/http/http_server.h"
#include "server/http/openai_request.h"
#include "server/metrics.h"
#include "server/service.h"

namespace glmserve {

// What the access log and the metrics need of a finished call.
struct OpenAICallResult {
  absl::Status status;                          // the call's final status (OK once answered)
  std::optional<glmserve::FinishEvent> finish;  // set when the request reached the engine
  std::string request_id;                       // the response's id ("cmpl-...", "chatcmpl-...")
};

// GET /v1/models: the one served model. GET /v1/models/{id}: that model, or NOT_FOUND for
// another id.
std::string ModelsJson(const Backend& backend);
absl::StatusOr<std::string> ModelJson(const Backend& backend, const std::string& id);

// The engine request of a parsed OpenAI request whose prompt is `prompt` (ids): the limits
// of the gRPC APIs (server/convert.h), with errors naming the OpenAI fields (max_tokens,
// prompt / messages). Sampling values are checked once, by the engine's own rule
// (core/request/sampling_params.h ValidateSamplingParams, core/request/generate_request.h
// kMaxTopLogprobs), so both APIs accept the same.
absl::StatusOr<GenerateRequest> ToEngineRequest(const OpenAIRequest& r, std::vector<int32_t> prompt,
                                                const Backend& backend);

// A completion from `body` (already bounded in size; released once parsed). Writes the
// response (or, once a stream has started, an error event) itself; returns a status without
// writing only for failures before any byte was sent, which the caller reports.
OpenAICallResult ServeCompletion(GlmServiceImpl& glm, const Backend& backend, std::string body,
                                 bool chat, HttpExchange& exchange, glmserve::SteadyTime arrival);

}  // namespace glmserve
