// Text generation plumbing: the one place that turns a text request into an engine request
// and the engine's generated token ids back into text. Every front end (glmserve.v1 gRPC, the
// OpenAI-compatible HTTP endpoint, KServe) calls these and adds only its own wire checks and
// types, so tokenization, chat rendering, stop strings and output parsing behave the same
// whichever API a client speaks. Transport-free (no gRPC/protobuf/HTTP types).
//
// A front end's flow for one Generate call:
//   1. Wire checks; fill a TextInput (prompt_text, or chat messages + ChatOptions).
//   2. BuildTextPrompt(assets, input, max_prompt_tokens) -> the prompt ids (INVALID_ARGUMENT for
//      bad input, FAILED_PRECONDITION naming what the checkpoint lacks, via MissingTextError).
//   3. TextStream::Create(assets, options) -> validates the stop strings (the one check of
//      kStopStringLimits) before anything is submitted.
//   4. ApplyTextDefaults(assets, &generate_request): the tokenizer's eos ids and vocabulary
//      bound; Engine::Submit.
//   5. For each TokenEvent: stream->Push(token) -> a TextDelta. When delta.stopped is set a stop
//      string matched: send the delta, Engine::Cancel the request (no wasted steps) and end the
//      call with finish reason stop; tokens still in flight give empty deltas.
//   6. On the FinishEvent (kStop / kLength) or after a stop: stream->Finish(reason) -> the last
//      delta and the whole parsed message and finish reason (stop / length / tool_calls).
//
// API stability: other front ends build on this header; change it only by additions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/request/generate_request.h"
#include "core/text/chat_format.h"
#include "core/text/detokenizer.h"
#include "core/text/output_parser.h"
#include "core/text/stop_strings.h"
#include "core/text/text_assets.h"
#include "core/text/tool_choice.h"

namespace glmserve {

// The bounds on a request's stop strings (count and bytes each), for every front end; checked
// only in TextStream::Create. 10^5 stop strings are refused there with INVALID_ARGUMENT.
inline constexpr StopStringLimits kStopStringLimits{};

// A text request's input: exactly one of `prompt_text` (plain completion: encoded as is, no
// prefix added) or `messages` (chat: rendered with GLM-4.5's chat format under `chat`).
struct TextInput {
  std::optional<std::string> prompt_text;
  std::vector<ChatMessage> messages;
  ChatOptions chat;        // tools_json, enable_thinking, add_generation_prompt (messages only)
  ToolChoice tool_choice;  // messages only; "none" leaves chat.tools_json out of the prompt
  bool is_chat() const { return !prompt_text.has_value(); }
};

struct TextPrompt {
  std::vector<int32_t> ids;  // the prompt for the engine
  std::string text;          // the text the ids encode (the rendered chat prompt for messages)
  // The prompt ends inside a think block ("<think>" last), so generated text begins as
  // reasoning: TextStreamOptions::starts_in_reasoning.
  bool starts_in_reasoning = false;
  // The tool call the request's tool_choice forces (none for auto / none): the front end
  // copies it into GenerateRequest::forced and sets TextStreamOptions::forced_tool_call.
  ForcedTokens forced;
};

// The prompt ids of `input`. FAILED_PRECONDITION (MissingTextError) when the assets have no
// tokenizer, or no GLM-4.5 chat template for messages; INVALID_ARGUMENT for both or neither of
// prompt_text / messages, an empty prompt, invalid UTF-8, ill-formed messages (naming the
// message), a tool choice CheckToolChoice refuses (or any but auto with prompt_text), or
// more than `max_prompt_tokens` ids (0: the tokenizer's limit; encoding stops as
// soon as the bound is passed).
absl::StatusOr<TextPrompt> BuildTextPrompt(const TextAssets& assets, const TextInput& input,
                                           size_t max_prompt_tokens);

// Text of token ids (the Detokenize RPC): FAILED_PRECONDITION without a tokenizer,
// INVALID_ARGUMENT for an id the tokenizer does not have (naming its position).
absl::StatusOr<std::string> DetokenizeIds(const TextAssets& assets, absl::Span<const int32_t> ids,
                                          bool skip_special_tokens);

// What a text generation needs from the engine besides the prompt: the tokenizer's eos ids
// (generation_config.json; a checkpoint's tokenizer may number them differently from the
// model config's eos_token_ids) as stop ids unless ignore_eos, and sampling restricted to ids
// the tokenizer can decode (a model's embedding usually has padding rows past the tokenizer's
// last id; the embedded random-weight default would otherwise mostly pick them).
// Precondition: assets.tokenizer is set (BuildTextPrompt succeeded).
void ApplyTextDefaults(const TextAssets& assets, GenerateRequest* request);

struct TextStreamOptions {
  bool chat = false;                 // parse reasoning / content / tool calls (messages requests)
  bool starts_in_reasoning = false;  // TextPrompt::starts_in_reasoning
  std::vector<std::string> stop;     // stop strings (bounded by kStopStringLimits)
  // Special tokens (eos, role tokens) are left out of the text, as OpenAI-style servers do.
  // GLM-4.5's <think>, <tool_call>, ... are not special, so the chat parser still sees them.
  bool skip_special_tokens = true;
  // The request forced a tool call (TextPrompt::forced is not empty): a tool call the model
  // leaves unterminated when the generation ends (a stop, or max_new_tokens) is still
  // returned as a tool call (its name and the complete arguments), not as content.
  bool forced_tool_call = false;
};

// One step's output. `text` is the raw generated text since the previous delta (whole UTF-8
// characters; with stop strings, only text that can no longer begin one, and never the stop
// string or anything after it). For chat, `parsed` splits the same text into reasoning,
// content and complete tool calls (markers removed); without chat it is empty.
struct TextDelta {
  std::string text;
  ParsedDelta parsed;
  bool stopped = false;  // a stop string matched in this delta: cancel the generation now
  int stop_index = -1;   // which one (index into TextStreamOptions::stop)
  bool empty() const { return text.empty() && parsed.empty() && !stopped; }
};

// Appends `from` to `into` (text, parsed parts, a stop), for a caller that batches several
// deltas into one message.
void AppendTextDelta(TextDelta from, TextDelta* into);

enum class TextFinishReason { kStop, kLength, kToolCalls };
// "stop", "length", "tool_calls" (OpenAI's names).
const char* TextFinishReasonName(TextFinishReason reason);

struct TextResult {
  TextDelta last;    // what Finish released: deliver it like any other delta
  std::string text;  // the whole generated text (all deltas' text joined)
  // Chat: the whole parsed message (all deltas' parsed parts joined).
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  // kStop after an eos/stop token or a stop string (stop_index >= 0); kLength at
  // max_new_tokens; kToolCalls when a chat reply that stopped holds tool calls.
  TextFinishReason reason = TextFinishReason::kStop;
  int stop_index = -1;
};

// Per generation: token ids in, text deltas out. Not thread-safe (feed it from one thread or
// under the caller's lock). Concatenated deltas (including Finish's) equal the tokenizer's
// Decode of the ids, cut before the first stop string; for chat, the parsed parts do not
// depend on how the ids were split into Push calls.
class TextStream {
 public:
  // INVALID_ARGUMENT for a stop string beyond kStopStringLimits, empty or not UTF-8;
  // FAILED_PRECONDITION (MissingTextError) without a tokenizer or, for chat, a chat template.
  static absl::StatusOr<std::unique_ptr<TextStream>> Create(const TextAssets& assets,
                                                            TextStreamOptions options);

  // The text one generated id completes. INVALID_ARGUMENT for an id without a token (nothing
  // changes then). After a stop string matched, every Push returns an empty delta.
  absl::StatusOr<TextDelta> Push(int32_t id);
  absl::StatusOr<TextDelta> Push(absl::Span<const int32_t> ids);

  // The end of the generation: flushes held bytes and text (a stop string may still match
  // there) and returns the final message. `engine_reason` is the FinishEvent's reason (kStop or
  // kLength); after a stop string matched it is ignored (the caller cancelled the request).
  // Call once.
  TextResult Finish(FinishReason engine_reason);

  bool stopped() const { return stop_index_ >= 0; }
  const TextStreamOptions& options() const { return options_; }

 private:
  TextStream(const Tokenizer& tokenizer, TextStreamOptions options, StopStringMatcher matcher);
  // Runs released text through the parser and records it in the totals.
  void Release(std::string text, TextDelta* delta);
  void Accumulate(const TextDelta& delta);

  TextStreamOptions options_;
  StreamDetokenizer detokenizer_;
  StopStringMatcher matcher_;
  Glm45OutputParser parser_;
  int stop_index_ = -1;
  TextResult total_;  // text and parsed parts so far
};

}  // namespace glmserve
