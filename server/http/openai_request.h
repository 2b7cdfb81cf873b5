// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) to one typed request,
// with every wire check: JSON types, ranges, unknown fields (refused, as OpenAI's API does:
// 400 naming the field), features glmserve does not offer (n > 1, echo, batched prompts,
// penalties other than 0, logit_bias: 400 saying so rather than silently ignoring them).
// Model and engine rules (token ids in the vocabulary, sampling values, top_logprobs, stop
// strings' bounds, the prompt's length) stay where they are checked once: the engine's rules
// (core/request/sampling_params.h, core/engine/engine.h) and core/text. docs/api_openai.md lists
// every field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text/chat_format.h"
#include "core/text/tool_choice.h"
#include "nlohmann/json.hpp"

namespace glmserve {

// At most this many stop strings are parsed at all (the engine-side bound, kStopStringLimits,
// is smaller and is checked by core/text); 10^5 of them are refused here before any copy.
inline constexpr size_t kMaxWireStopStrings = 64;
inline constexpr size_t kMaxWireStopTokenIds = 1024;

struct OpenAIRequest {
  bool chat = false;
  std::string model;
  // /v1/completions: exactly one of the two.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // /v1/chat/completions.
  std::vector<ChatMessage> messages;
  ChatOptions chat_options;  // tools (as JSON text each), enable_thinking
  // "auto" (the default), "none" (tools are not shown to the model), "required" or a named
  // function (the start of the tool call is forced: core/text/tool_choice.h).
  ToolChoice tool_choice;

  std::optional<int64_t> max_tokens;  // unset: the server's default
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;  // unset: a random seed per request
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool skip_special_tokens = true;
  // glmserve's extension: MTP drafts per step (GenerateRequest::mtp_draft_tokens); unset: the
  // server's setting.
  std::optional<int32_t> mtp_draft_tokens;
};

// INVALID_ARGUMENT naming the field (and its JSON path for nested ones) for: a body that is
// not a JSON object, a missing required field, a wrong type, a value out of range, an unknown
// field, an unsupported feature. `chat` selects the route's schema.
absl::StatusOr<OpenAIRequest> ParseOpenAIRequest(const nlohmann::json& body, bool chat);

// The request body: INVALID_ARGUMENT "invalid JSON: ..." for what server/http/json_body.h
// refuses (linear time, bounded depth and values, duplicate keys, trailing bytes), then
// ParseOpenAIRequest.
absl::StatusOr<OpenAIRequest> ParseOpenAIBody(std::string_view body, bool chat);

}  // namespace glmserve
