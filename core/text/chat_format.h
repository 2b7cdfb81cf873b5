// GLM-4.5's chat format, rendered natively (Debian has no sound C++ Jinja): exactly the text
// the published GLM-4.5 chat template renders under Transformers' apply_chat_template
// (tests/golden/chat holds the template and >= 50 conversations rendered by Python's jinja2;
// tests/core/text/chat_format_test.cc compares byte for byte). A checkpoint whose
// chat_template is not GLM-4.5's is recognised as such and refused (RecognizeChatTemplate).
//
// Transport-free: tool definitions and tool-call arguments travel as JSON text, so that the
// gRPC, OpenAI-HTTP and KServe front ends each convert their own types to these structs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace glmserve {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

// "system", "user", "assistant", "tool" and its GLM name "observation".
absl::StatusOr<ChatRole> ParseChatRole(std::string_view role);

struct ChatToolCall {
  std::string name;
  std::string arguments_json;  // a JSON object; its members become <arg_key>/<arg_value> pairs
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;  // text (a front end joins OpenAI-style text parts first)
  // The assistant's reasoning; when absent, a "<think>...</think>" inside content is used.
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;  // assistant only
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // GLM-4.5's enable_thinking: unset (the template's default: thinking on), true, or false
  // (appends "/nothink" to user turns and an empty think block to the generation prompt).
  std::optional<bool> enable_thinking;
  std::vector<std::string> tools_json;  // each one tool definition, a JSON object
};

struct ChatLimits {
  size_t max_messages = 4096;
  size_t max_tools = 256;
  size_t max_tool_calls = 256;          // per message
  size_t max_bytes = size_t{16} << 20;  // of all text in, and of the rendered prompt
  int max_json_depth = 32;
};

// The prompt text for `messages`. INVALID_ARGUMENT for ill-formed input (invalid UTF-8, a
// tool call on a non-assistant message, arguments that are not a JSON object, ...), naming
// the message; RESOURCE_EXHAUSTED beyond `limits`.
absl::StatusOr<std::string> RenderGlm45Chat(absl::Span<const ChatMessage> messages,
                                            const ChatOptions& options,
                                            const ChatLimits& limits = {});

// OK when `chat_template` (a checkpoint's Jinja template) is GLM-4.5's, which is the only one
// RenderGlm45Chat reproduces; otherwise FAILED_PRECONDITION saying so.
absl::Status RecognizeChatTemplate(std::string_view chat_template);

}  // namespace glmserve
