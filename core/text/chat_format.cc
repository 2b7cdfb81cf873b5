#include "core/text/chat_format.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/text/py_json.h"
#include "core/text/unicode.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using OJson = nlohmann::ordered_json;

// The published template's tool preamble (between "[gMASK]<sop>" and the messages).
constexpr std::string_view kToolsHead =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kToolsTail =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>";

// Python's str.isspace() for one code point (what the template's strip() removes).
bool PyIsSpace(uint32_t c) {
  return (c >= 0x9 && c <= 0xD) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's s.strip() on valid UTF-8.
std::string_view PyStrip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    uint32_t cp;
    const int n = Utf8Next(s, b, &cp);
    if (n <= 0 || !PyIsSpace(cp)) break;
    b += static_cast<size_t>(n);
  }
  size_t e = s.size();
  while (e > b) {
    size_t k = e - 1;  // back to the start of the last code point
    while (k > b && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
    uint32_t cp;
    const int n = Utf8Next(s, k, &cp);
    if (n <= 0 || !PyIsSpace(cp)) break;
    e = k;
  }
  return s.substr(b, e - b);
}

std::string_view StripChar(std::string_view s, char c, bool left) {
  if (left) {
    while (!s.empty() && s.front() == c) s.remove_prefix(1);
  } else {
    while (!s.empty() && s.back() == c) s.remove_suffix(1);
  }
  return s;
}

// The template's reasoning extraction from content:
//   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
//   content   = content.split('</think>')[-1].lstrip('\n')
void SplitThink(std::string_view content, std::string* reasoning, std::string* rest) {
  const size_t first_close = content.find("</think>");
  std::string_view before = StripChar(content.substr(0, first_close), '\n', false);
  const size_t last_open = before.rfind("<think>");
  if (last_open != std::string_view::npos) before.remove_prefix(last_open + 7);
  *reasoning = std::string(StripChar(before, '\n', true));
  const size_t last_close = content.rfind("</think>");
  *rest = std::string(StripChar(content.substr(last_close + 8), '\n', true));
}

absl::Status AppendToolCall(const ChatToolCall& call, const ChatLimits& limits, size_t msg,
                            std::string* out) {
  if (!JsonDepthWithin(call.arguments_json, limits.max_json_depth)) {
    return absl::InvalidArgumentError(absl::StrCat("message ", msg,
                                                   ": the arguments of tool call '", call.name,
                                                   "' nest deeper than ", limits.max_json_depth));
  }
  const OJson args = OJson::parse(call.arguments_json, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message ", msg, ": the arguments of tool call '", call.name, "' are not a JSON object"));
  }
  absl::StrAppend(out, "\n<tool_call>", call.name, "\n");
  for (auto it = args.begin(); it != args.end(); ++it) {
    absl::StrAppend(out, "<arg_key>", it.key(), "</arg_key>\n<arg_value>");
    if (it.value().is_string()) {
      out->append(it.value().get_ref<const std::string&>());
    } else {
      ASSIGN_OR_RETURN(std::string v, PythonJsonDumps(it.value().dump(), limits.max_json_depth));
      out->append(v);
    }
    out->append("</arg_value>\n");
  }
  out->append("</tool_call>");
  return absl::OkStatus();
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<ChatRole> ParseChatRole(std::string_view role) {
  if (role == "system") return ChatRole::kSystem;
  if (role == "user") return ChatRole::kUser;
  if (role == "assistant") return ChatRole::kAssistant;
  if (role == "tool" || role == "observation") return ChatRole::kTool;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat role '", std::string(role.substr(0, 64)),
                   "' (GLM-4.5's chat format has system, user, assistant and tool/observation)"));
}

absl::StatusOr<std::string> RenderGlm45Chat(absl::Span<const ChatMessage> messages,
                                            const ChatOptions& options, const ChatLimits& limits) {
  if (messages.size() > limits.max_messages || options.tools_json.size() > limits.max_tools) {
    return absl::ResourceExhaustedError(
        absl::StrCat(messages.size(), " messages and ", options.tools_json.size(),
                     " tools: the limits are ", limits.max_messages, " and ", limits.max_tools));
  }
  // Validate and bound everything before any work.
  size_t total = 0;
  for (const std::string& t : options.tools_json) total += t.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string what = absl::StrCat("message ", i);
    RETURN_IF_ERROR(ValidateUtf8(m.content, what + "'s content"));
    total += m.content.size();
    if (m.reasoning_content) {
      RETURN_IF_ERROR(ValidateUtf8(*m.reasoning_content, what + "'s reasoning_content"));
      total += m.reasoning_content->size();
    }
    if (!m.tool_calls.empty() && m.role != ChatRole::kAssistant) {
      return absl::InvalidArgumentError(what + " has tool calls but is not an assistant message");
    }
    if (m.tool_calls.size() > limits.max_tool_calls) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " has ", m.tool_calls.size(), " tool calls, more than ", limits.max_tool_calls));
    }
    for (const ChatToolCall& c : m.tool_calls) {
      RETURN_IF_ERROR(ValidateUtf8(c.name, what + "'s tool call name"));
      RETURN_IF_ERROR(ValidateUtf8(c.arguments_json, what + "'s tool call arguments"));
      if (c.name.empty())
        return absl::InvalidArgumentError(what + " has a tool call without a name");
      total += c.name.size() + c.arguments_json.size();
    }
  }
  if (total > limits.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the chat holds ", total, " bytes of text, more than ", limits.max_bytes));
  }

  std::string out = "[gMASK]<sop>";
  if (!options.tools_json.empty()) {
    out.append(kToolsHead);
    for (size_t t = 0; t < options.tools_json.size(); ++t) {
      RETURN_IF_ERROR(ValidateUtf8(options.tools_json[t], absl::StrCat("tool ", t)));
      auto dumped = PythonJsonDumps(options.tools_json[t], limits.max_json_depth);
      if (!dumped.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tool ", t, " is not a JSON object: ", dumped.status().message()));
      }
      if (dumped->empty() || (*dumped)[0] != '{') {
        return absl::InvalidArgumentError(absl::StrCat("tool ", t, " is not a JSON object"));
      }
      absl::StrAppend(&out, *dumped, "\n");
    }
    out.append(kToolsTail);
  }
  int64_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == ChatRole::kUser) last_user = static_cast<int64_t>(i);
  }
  const bool no_think = options.enable_thinking.has_value() && !*options.enable_thinking;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (m.role) {
      case ChatRole::kUser:
        absl::StrAppend(&out, "<|user|>\n", m.content);
        if (no_think && !absl::EndsWith(m.content, "/nothink")) out.append("/nothink");
        break;
      case ChatRole::kAssistant: {
        out.append("<|assistant|>");
        std::string reasoning, content = m.content;
        if (m.reasoning_content) {
          reasoning = *m.reasoning_content;
        } else if (m.content.find("</think>") != std::string::npos) {
          SplitThink(m.content, &reasoning, &content);
        }
        if (static_cast<int64_t>(i) > last_user && !reasoning.empty()) {
          out.append("\n<think>").append(PyStrip(reasoning)).append("</think>");
        } else {
          out.append("\n<think></think>");
        }
        const std::string_view stripped = PyStrip(content);
        if (!stripped.empty()) out.append("\n").append(stripped);
        for (const ChatToolCall& c : m.tool_calls)
          RETURN_IF_ERROR(AppendToolCall(c, limits, i, &out));
        break;
      }
      case ChatRole::kTool:
        if (i == 0 || messages[i - 1].role != ChatRole::kTool) out.append("<|observation|>");
        absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
        break;
      case ChatRole::kSystem:
        absl::StrAppend(&out, "<|system|>\n", m.content);
        break;
    }
    if (out.size() > limits.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the rendered chat exceeds ", limits.max_bytes, " bytes"));
    }
  }
  if (options.add_generation_prompt) {
    out.append("<|assistant|>");
    if (no_think) out.append("\n<think></think>");
  }
  return out;
}

absl::Status RecognizeChatTemplate(std::string_view chat_template) {
  // FNV-1a of the published GLM-4.5 template (tests/golden/chat/glm45_chat_template.jinja),
  // trailing white space ignored (files differ in their final newline).
  constexpr uint64_t kGlm45 = 0x42acd273715300d2ull;
  std::string_view t = chat_template;
  while (!t.empty() && absl::ascii_isspace(static_cast<unsigned char>(t.back())))
    t.remove_suffix(1);
  const uint64_t h = Fnv1a64(t);
  if (h == kGlm45) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "the checkpoint's chat_template (%d bytes, fnv1a64 %016x) is not GLM-4.5's; glmserve "
      "renders only GLM-4.5's chat format (natively, see docs/text.md)",
      chat_template.size(), h));
}

}  // namespace glmserve
