#include "core/text/text_generation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {

absl::StatusOr<TextPrompt> BuildTextPrompt(const TextAssets& assets, const TextInput& input,
                                           size_t max_prompt_tokens) {
  if (input.prompt_text.has_value() && !input.messages.empty()) {
    return absl::InvalidArgumentError("give either prompt_text or messages, not both");
  }
  const bool chat = input.is_chat();
  const char* what = chat ? "messages" : "prompt_text";
  RETURN_IF_ERROR(MissingTextError(assets, chat, what));
  TextPrompt prompt;
  if (chat) {
    if (input.messages.empty()) {
      return absl::InvalidArgumentError("no prompt: give prompt_text or messages");
    }
    RETURN_IF_ERROR(CheckToolChoice(input.tool_choice, input.chat));
    if (input.tool_choice.mode == ToolChoiceMode::kNone && !input.chat.tools_json.empty()) {
      ChatOptions without_tools = input.chat;
      without_tools.tools_json.clear();
      ASSIGN_OR_RETURN(prompt.text, RenderGlm45Chat(input.messages, without_tools));
    } else {
      ASSIGN_OR_RETURN(prompt.text, RenderGlm45Chat(input.messages, input.chat));
    }
  } else {
    if (input.tool_choice.mode != ToolChoiceMode::kAuto) {
      return absl::InvalidArgumentError("tool_choice applies to messages only");
    }
    if (input.prompt_text->empty()) return absl::InvalidArgumentError("prompt_text is empty");
    prompt.text = *input.prompt_text;
  }
  const size_t bound =
      max_prompt_tokens > 0 ? max_prompt_tokens : assets.tokenizer->limits().max_tokens;
  absl::StatusOr<std::vector<int32_t>> ids = assets.tokenizer->Encode(prompt.text, bound);
  if (absl::IsResourceExhausted(ids.status())) {
    // A prompt limit, reported as every prompt limit is (the engine's INVALID_ARGUMENT).
    return absl::InvalidArgumentError(absl::StrCat(what, " encodes to more than ", bound,
                                                   " tokens; the prompt limit is ", bound));
  }
  if (!ids.ok()) {
    return absl::Status(ids.status().code(), absl::StrCat(what, ": ", ids.status().message()));
  }
  prompt.ids = *std::move(ids);
  if (prompt.ids.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " has no tokens"));
  prompt.starts_in_reasoning = absl::EndsWith(prompt.text, "<think>");
  if (chat) {
    ASSIGN_OR_RETURN(prompt.forced,
                     ToolChoiceForcing(*assets.tokenizer, input.tool_choice, prompt.text));
  }
  return prompt;
}

absl::StatusOr<std::string> DetokenizeIds(const TextAssets& assets, absl::Span<const int32_t> ids,
                                          bool skip_special_tokens) {
  RETURN_IF_ERROR(MissingTextError(assets, /*needs_chat=*/false, "Detokenize"));
  const Tokenizer& tok = *assets.tokenizer;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!tok.HasId(ids[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " at position ", i, " has no token in the tokenizer"));
    }
  }
  return tok.Decode(ids, skip_special_tokens);
}

void ApplyTextDefaults(const TextAssets& assets, GenerateRequest* request) {
  if (!request->stop.ignore_eos) {
    for (int32_t id : assets.eos_token_ids) {
      if (std::find(request->stop.stop_token_ids.begin(), request->stop.stop_token_ids.end(), id) ==
          request->stop.stop_token_ids.end()) {
        request->stop.stop_token_ids.push_back(id);
      }
    }
  }
  const int32_t limit = assets.tokenizer->id_limit();
  if (request->sample_vocab_limit == 0 || request->sample_vocab_limit > limit) {
    request->sample_vocab_limit = limit;
  }
}

void AppendTextDelta(TextDelta from, TextDelta* into) {
  into->text += from.text;
  into->parsed.reasoning += from.parsed.reasoning;
  into->parsed.content += from.parsed.content;
  for (ParsedToolCall& call : from.parsed.tool_calls) {
    into->parsed.tool_calls.push_back(std::move(call));
  }
  if (from.stopped) {
    into->stopped = true;
    into->stop_index = from.stop_index;
  }
}

const char* TextFinishReasonName(TextFinishReason reason) {
  switch (reason) {
    case TextFinishReason::kStop:
      return "stop";
    case TextFinishReason::kLength:
      return "length";
    case TextFinishReason::kToolCalls:
      return "tool_calls";
  }
  return "stop";
}

absl::StatusOr<std::unique_ptr<TextStream>> TextStream::Create(const TextAssets& assets,
                                                               TextStreamOptions options) {
  RETURN_IF_ERROR(
      MissingTextError(assets, options.chat, options.chat ? "a chat reply" : "text output"));
  ASSIGN_OR_RETURN(StopStringMatcher matcher,
                   StopStringMatcher::Create(options.stop, kStopStringLimits));
  return std::unique_ptr<TextStream>(
      new TextStream(*assets.tokenizer, std::move(options), std::move(matcher)));
}

TextStream::TextStream(const Tokenizer& tokenizer, TextStreamOptions options,
                       StopStringMatcher matcher)
    : options_(std::move(options)),
      detokenizer_(tokenizer, options_.skip_special_tokens),
      matcher_(std::move(matcher)),
      parser_(options_.starts_in_reasoning, options_.forced_tool_call) {}

void TextStream::Release(std::string text, TextDelta* delta) {
  if (options_.chat && !text.empty()) {
    ParsedDelta p = parser_.Push(text);
    delta->parsed.reasoning += p.reasoning;
    delta->parsed.content += p.content;
    for (ParsedToolCall& call : p.tool_calls) delta->parsed.tool_calls.push_back(std::move(call));
  }
  delta->text += text;
}

void TextStream::Accumulate(const TextDelta& delta) {
  total_.text += delta.text;
  total_.reasoning += delta.parsed.reasoning;
  total_.content += delta.parsed.content;
  total_.tool_calls.insert(total_.tool_calls.end(), delta.parsed.tool_calls.begin(),
                           delta.parsed.tool_calls.end());
}

absl::StatusOr<TextDelta> TextStream::Push(int32_t id) { return Push(absl::MakeConstSpan(&id, 1)); }

absl::StatusOr<TextDelta> TextStream::Push(absl::Span<const int32_t> ids) {
  TextDelta delta;
  if (stopped()) return delta;
  std::string text;
  for (int32_t id : ids) {
    ASSIGN_OR_RETURN(std::string piece, detokenizer_.Push(id));
    text += piece;
  }
  StopStringMatcher::Result r = matcher_.Push(text);
  if (r.stopped) {
    stop_index_ = r.stop_index;
    delta.stopped = true;
    delta.stop_index = r.stop_index;
  }
  Release(std::move(r.text), &delta);
  Accumulate(delta);
  return delta;
}

TextResult TextStream::Finish(FinishReason engine_reason) {
  TextDelta delta;
  if (!stopped()) {
    StopStringMatcher::Result r = matcher_.Push(detokenizer_.Finish());
    if (r.stopped) {
      stop_index_ = r.stop_index;
      delta.stopped = true;
      delta.stop_index = r.stop_index;
    } else {
      r.text += matcher_.Finish();
    }
    Release(std::move(r.text), &delta);
  }
  if (options_.chat) {
    ParsedDelta p = parser_.Finish();
    delta.parsed.reasoning += p.reasoning;
    delta.parsed.content += p.content;
    for (ParsedToolCall& call : p.tool_calls) delta.parsed.tool_calls.push_back(std::move(call));
  }
  Accumulate(delta);
  TextResult result = std::move(total_);
  total_ = TextResult();
  result.last = std::move(delta);
  result.stop_index = stop_index_;
  if (stopped() || engine_reason != FinishReason::kLength) {
    result.reason = TextFinishReason::kStop;
  } else {
    result.reason = TextFinishReason::kLength;
  }
  if (result.reason == TextFinishReason::kStop && !result.tool_calls.empty()) {
    result.reason = TextFinishReason::kToolCalls;
  }
  return result;
}

}  // namespace glmserve
