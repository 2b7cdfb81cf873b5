#include "server/http/openai_response.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;

Json ToolCallsJson(const std::vector<ParsedToolCall>& calls, int first_index, bool with_index) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call = {{"id", absl::StrCat("call_", RandomHex(24))},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments_json}}}};
    if (with_index) call["index"] = first_index + static_cast<int>(i);
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

std::string RandomHex(int chars) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string s;
  while (static_cast<int>(s.size()) < chars) s += absl::StrFormat("%016x", rng());
  return s.substr(0, chars);
}

Json ChatDeltaJson(const TextDelta& delta, int* tool_calls_sent) {
  Json d = Json::object();
  if (!delta.parsed.reasoning.empty()) d["reasoning_content"] = delta.parsed.reasoning;
  if (!delta.parsed.content.empty()) d["content"] = delta.parsed.content;
  if (!delta.parsed.tool_calls.empty()) {
    d["tool_calls"] = ToolCallsJson(delta.parsed.tool_calls, *tool_calls_sent, true);
    *tool_calls_sent += static_cast<int>(delta.parsed.tool_calls.size());
  }
  return d;
}

Json ChatMessageJson(const TextResult& result) {
  Json message = {{"role", "assistant"}};
  message["content"] =
      result.content.empty() && !result.tool_calls.empty() ? Json(nullptr) : Json(result.content);
  message["reasoning_content"] = result.reasoning.empty() ? Json(nullptr) : Json(result.reasoning);
  if (!result.tool_calls.empty()) {
    message["tool_calls"] = ToolCallsJson(result.tool_calls, 0, /*with_index=*/false);
  }
  return message;
}

Json UsageJson(const glmserve::FinishEvent& f) {
  return {{"prompt_tokens", f.prompt_tokens},
          {"completion_tokens", f.generated_tokens},
          {"total_tokens", f.prompt_tokens + f.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", f.cached_prompt_tokens}}}};
}

}  // namespace glmserve
