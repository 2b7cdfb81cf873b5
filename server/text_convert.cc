#include "server/text_convert.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace glmserve {
namespace {

using Messages = google::protobuf::RepeatedPtrField<v1::ChatMessage>;
using Strings = google::protobuf::RepeatedPtrField<std::string>;

absl::StatusOr<std::vector<ChatMessage>> MessagesFromWire(const Messages& wire) {
  std::vector<ChatMessage> out;
  out.reserve(wire.size());
  for (int i = 0; i < wire.size(); ++i) {
    const v1::ChatMessage& m = wire[i];
    absl::StatusOr<ChatRole> role = ParseChatRole(m.role());
    if (!role.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: ", role.status().message()));
    }
    ChatMessage message;
    message.role = *role;
    message.content = m.content();
    if (m.has_reasoning_content()) message.reasoning_content = m.reasoning_content();
    for (const v1::ToolCall& call : m.tool_calls()) {
      message.tool_calls.push_back({call.name(), call.arguments_json()});
    }
    out.push_back(std::move(message));
  }
  return out;
}

// The chat-only fields, shared by Generate and Tokenize.
template <typename Request>
absl::StatusOr<TextInput> ChatInput(const Request& request) {
  TextInput input;
  ASSIGN_OR_RETURN(input.messages, MessagesFromWire(request.messages()));
  input.chat.tools_json.assign(request.tools_json().begin(), request.tools_json().end());
  if (request.has_enable_thinking()) input.chat.enable_thinking = request.enable_thinking();
  if (request.has_add_generation_prompt()) {
    input.chat.add_generation_prompt = request.add_generation_prompt();
  }
  return input;
}

template <typename Request>
absl::Status ChatFieldsNeedMessages(const Request& request) {
  if (request.messages_size() > 0) return absl::OkStatus();
  const char* field = request.tools_json_size() > 0         ? "tools_json"
                      : request.has_enable_thinking()       ? "enable_thinking"
                      : request.has_add_generation_prompt() ? "add_generation_prompt"
                                                            : nullptr;
  if (field == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " applies to messages only"));
}

// GenerateRequest's tool_choice / tool_choice_function; whether they fit the tools is the
// text rules' check (CheckToolChoice in BuildTextPrompt), as for the OpenAI endpoint.
absl::StatusOr<ToolChoice> ToolChoiceFromWire(const v1::GenerateRequest& request) {
  ToolChoice choice;
  const std::string& mode = request.tool_choice();
  if (!request.tool_choice_function().empty()) {
    if (!mode.empty()) {
      return absl::InvalidArgumentError(
          "set tool_choice or tool_choice_function, not both (a function name forces that "
          "function)");
    }
    choice.mode = ToolChoiceMode::kFunction;
    choice.function = request.tool_choice_function();
  } else if (mode == "required") {
    choice.mode = ToolChoiceMode::kRequired;
  } else if (mode == "none") {
    choice.mode = ToolChoiceMode::kNone;
  } else if (!mode.empty() && mode != "auto") {
    return absl::InvalidArgumentError(
        "tool_choice must be empty, \"auto\", \"none\" or \"required\" (name a function "
        "with tool_choice_function)");
  }
  return choice;
}

}  // namespace

absl::StatusOr<std::optional<TextInput>> TextInputFromGenerate(const v1::GenerateRequest& request) {
  const int kinds = (request.prompt_token_ids_size() > 0) + !request.prompt_text().empty() +
                    (request.messages_size() > 0);
  if (kinds == 0) {
    return absl::InvalidArgumentError(
        "no prompt: set one of prompt_token_ids, prompt_text and messages");
  }
  if (kinds > 1) {
    return absl::InvalidArgumentError("set only one of prompt_token_ids, prompt_text and messages");
  }
  RETURN_IF_ERROR(ChatFieldsNeedMessages(request));
  if (request.messages_size() == 0 &&
      (!request.tool_choice().empty() || !request.tool_choice_function().empty())) {
    return absl::InvalidArgumentError("tool_choice applies to messages only");
  }
  if (request.prompt_token_ids_size() > 0) return std::optional<TextInput>();
  if (!request.prompt_text().empty()) {
    TextInput input;
    input.prompt_text = request.prompt_text();
    return std::optional<TextInput>(std::move(input));
  }
  ASSIGN_OR_RETURN(TextInput input, ChatInput(request));
  ASSIGN_OR_RETURN(input.tool_choice, ToolChoiceFromWire(request));
  return std::optional<TextInput>(std::move(input));
}

absl::StatusOr<TextInput> TextInputFromTokenize(const v1::TokenizeRequest& request) {
  if (request.text().empty() == (request.messages_size() == 0)) {
    return absl::InvalidArgumentError("set exactly one of text and messages");
  }
  RETURN_IF_ERROR(ChatFieldsNeedMessages(request));
  if (!request.text().empty()) {
    TextInput input;
    input.prompt_text = request.text();
    return input;
  }
  return ChatInput(request);
}

bool WantsText(const v1::GenerateRequest& request) {
  return !request.prompt_text().empty() || request.messages_size() > 0 ||
         request.stop().stop_strings_size() > 0 || request.return_text();
}

TextStreamOptions TextStreamOptionsFor(const v1::GenerateRequest& request,
                                       const TextPrompt* prompt) {
  TextStreamOptions o;
  o.chat = request.messages_size() > 0;
  o.starts_in_reasoning = prompt != nullptr && prompt->starts_in_reasoning;
  o.stop.assign(request.stop().stop_strings().begin(), request.stop().stop_strings().end());
  o.skip_special_tokens = !request.keep_special_tokens();
  o.forced_tool_call = prompt != nullptr && !prompt->forced.tokens.empty();
  return o;
}

void FillTextDelta(const TextDelta& delta, bool chat, v1::GenerateResponse* out) {
  out->set_text(delta.text);
  if (!chat) return;
  out->set_reasoning_content(delta.parsed.reasoning);
  out->set_content(delta.parsed.content);
  for (const ParsedToolCall& call : delta.parsed.tool_calls) {
    v1::ToolCall* c = out->add_tool_calls();
    c->set_name(call.name);
    c->set_arguments_json(call.arguments_json);
  }
}

v1::FinishReason WireFinishReason(TextFinishReason reason) {
  switch (reason) {
    case TextFinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case TextFinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case TextFinishReason::kToolCalls:
      return v1::FINISH_REASON_TOOL_CALLS;
  }
  return v1::FINISH_REASON_STOP;
}

void FillTextInfo(const TextAssets& assets, v1::ModelInfo* out) {
  out->set_has_tokenizer(assets.tokenizer != nullptr);
  out->set_has_chat_template(assets.tokenizer != nullptr && assets.has_chat_template);
  out->set_tokenizer_vocab_size(assets.tokenizer != nullptr ? assets.tokenizer->id_limit() : 0);
  out->set_tokenizer_source(assets.source);
  if (!out->has_chat_template()) out->set_chat_template_problem(assets.chat_template_problem);
  out->mutable_limits()->set_max_stop_strings(static_cast<int64_t>(kStopStringLimits.max_count));
  out->mutable_limits()->set_max_stop_string_bytes(
      static_cast<int64_t>(kStopStringLimits.max_bytes));
}

}  // namespace glmserve
