#include "core/text/tool_choice.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/text/py_json.h"
#include "core/text/unicode.h"
#include "nlohmann/json.hpp"

namespace glmserve {

absl::StatusOr<std::vector<std::string>> ToolFunctionNames(
    absl::Span<const std::string> tools_json) {
  std::vector<std::string> names;
  for (size_t i = 0; i < tools_json.size(); ++i) {
    // Depth first: parsing recurses per level.
    const nlohmann::json tool =
        JsonDepthWithin(tools_json[i], 64)
            ? nlohmann::json::parse(tools_json[i], nullptr, /*allow_exceptions=*/false)
            : nlohmann::json(nlohmann::json::value_t::discarded);
    if (!tool.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("tool ", i, " is not a JSON object"));
    }
    const nlohmann::json* holder = &tool;
    if (auto f = tool.find("function"); f != tool.end() && f->is_object()) holder = &*f;
    if (auto n = holder->find("name"); n != holder->end() && n->is_string()) {
      names.push_back(n->get<std::string>());
    }
  }
  return names;
}

absl::Status CheckToolChoice(const ToolChoice& choice, const ChatOptions& options) {
  if (choice.mode == ToolChoiceMode::kAuto || choice.mode == ToolChoiceMode::kNone) {
    return absl::OkStatus();
  }
  const char* what =
      choice.mode == ToolChoiceMode::kRequired ? "tool_choice \"required\"" : "a named tool_choice";
  if (options.tools_json.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " needs tools"));
  }
  if (!options.add_generation_prompt) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " needs the generation prompt (add_generation_prompt)"));
  }
  if (choice.mode == ToolChoiceMode::kRequired) return absl::OkStatus();
  const std::string& name = choice.function;
  if (name.empty()) return absl::InvalidArgumentError("tool_choice's function name is empty");
  RETURN_IF_ERROR(ValidateUtf8(name, "tool_choice's function name"));
  if (name.size() > kMaxToolNameBytes || name.find_first_of("\n<") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice's function name must be at most ", kMaxToolNameBytes,
                     " bytes without '\\n' or '<' (GLM's tool-call syntax ends the name there)"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ToolFunctionNames(options.tools_json));
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    constexpr size_t kListed = 16;  // an error names a few, not 256 tools
    const size_t listed = std::min(names.size(), kListed);
    return absl::InvalidArgumentError(absl::StrCat(
        "tool_choice names the function '", name, "', which is not in tools (",
        absl::StrJoin(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(listed), ", "),
        names.size() > listed ? ", ..." : "", ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForcedTokens> ToolChoiceForcing(const Tokenizer& tokenizer, const ToolChoice& choice,
                                               std::string_view prompt_text) {
  ForcedTokens forced;
  if (choice.mode != ToolChoiceMode::kRequired && choice.mode != ToolChoiceMode::kFunction) {
    return forced;
  }
  // Exactly what the chat template writes between "</think>" and the arguments, so that the
  // model continues from text it was trained on; encoded alone it tokenizes as in the whole
  // reply, since "</think>" before it and "<arg_key>" / "</tool_call>" after it are added
  // tokens, which split the text first.
  std::string text = "\n<tool_call>";
  if (choice.mode == ToolChoiceMode::kFunction) absl::StrAppend(&text, choice.function, "\n");
  ASSIGN_OR_RETURN(forced.tokens, tokenizer.Encode(text, kMaxForcedTokens));
  constexpr std::string_view kThinkClose = "</think>";
  const bool after_reasoning =
      prompt_text.size() >= kThinkClose.size() &&
      prompt_text.substr(prompt_text.size() - kThinkClose.size()) == kThinkClose;
  if (!after_reasoning) {
    const std::optional<int32_t> think_close = tokenizer.AddedTokenId("</think>");
    if (!think_close.has_value()) {
      return absl::FailedPreconditionError(
          "tool_choice needs the tokenizer's \"</think>\" token (the end of the reasoning, "
          "after which the tool call is forced)");
    }
    forced.after_token = *think_close;
  }
  return forced;
}

}  // namespace glmserve
