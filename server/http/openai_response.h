// The parts of OpenAI's response objects that carry GLM's parsed output, shared by the
// streamed and the whole responses (server/http/openai_handler.cc): chat deltas and messages
// with `reasoning_content` (the <think> block, as vLLM's glm45 reasoning parser returns it) and
// `tool_calls` (GLM-4.5's <tool_call> blocks, arguments as JSON text), and `usage`.
#pragma once

#include <string>

#include "core/engine/engine.h"
#include "core/text/text_generation.h"
#include "nlohmann/json.hpp"

namespace glmserve {

// `chars` random lowercase hex digits (response and tool-call ids).
std::string RandomHex(int chars);

// A chat.completion.chunk delta: reasoning_content, content and complete tool_calls (numbered
// from *tool_calls_sent on, which advances) present only when non-empty; {} for none.
nlohmann::json ChatDeltaJson(const TextDelta& delta, int* tool_calls_sent);

// A chat.completion message: role assistant, content (null when empty and there are tool
// calls), reasoning_content (null when none), tool_calls (only when there are some).
nlohmann::json ChatMessageJson(const TextResult& result);

// usage: prompt, completion and total tokens, prefix-cache hits as cached_tokens.
nlohmann::json UsageJson(const glmserve::FinishEvent& finish);

}  // namespace glmserve
