// glmserve.v1's text fields <-> the transport-free text plumbing (core/text/text_generation.h).
// Only wire checks live here (which prompt field is set, chat-only fields without messages,
// role names); tokenization, chat rendering, stop-string bounds and output parsing are the
// plumbing's, shared with the other front ends.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "core/text/text_generation.h"
#include "glmserve/v1/glmserve.pb.h"

namespace glmserve {

// The text input of a Generate request; nullopt for a token-id prompt. INVALID_ARGUMENT for
// more than one of prompt_token_ids / prompt_text / messages, none at all, chat fields
// (tools_json, enable_thinking, add_generation_prompt) without messages, an unknown role.
absl::StatusOr<std::optional<TextInput>> TextInputFromGenerate(const v1::GenerateRequest& request);

// The same for Tokenize: exactly one of text and messages.
absl::StatusOr<TextInput> TextInputFromTokenize(const v1::TokenizeRequest& request);

// Whether a Generate call answers with text (and so needs a TextStream): a text or messages
// prompt, stop strings, or return_text.
bool WantsText(const v1::GenerateRequest& request);

// The stream options of a Generate request; `prompt` is null for a token-id prompt.
TextStreamOptions TextStreamOptionsFor(const v1::GenerateRequest& request,
                                       const TextPrompt* prompt);

// Sets a response message's text fields from a delta (the parsed parts only for chat).
void FillTextDelta(const TextDelta& delta, bool chat, v1::GenerateResponse* out);

// The wire finish reason of a text generation that ended normally.
v1::FinishReason WireFinishReason(TextFinishReason reason);

// ModelInfo's text fields and stop-string limits.
void FillTextInfo(const TextAssets& assets, v1::ModelInfo* out);

}  // namespace glmserve
