// The OpenAI API's tool_choice for GLM-4.5 chat requests, honoured without a grammar engine:
// GLM writes a tool call as "\n<tool_call>NAME\n<arg_key>...</tool_call>" after its (possibly
// empty) think block, so a demanded call is the engine's forced-token mechanism
// (GenerateRequest::forced) applied to the text the chat template itself renders there:
//   "required"   forces "\n<tool_call>"          (the model picks the function)
//   a function   forces "\n<tool_call>NAME\n"     (the model writes the arguments)
// right after the reasoning: at the first generated token when the prompt already ends with
// "</think>" (thinking off), else right after the model's own "</think>" (thinking on). The
// arguments stay the model's: nothing constrains them to the tool's JSON schema.
// Transport-free; each front end maps its wire form onto ToolChoice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/request/generate_request.h"
#include "core/text/chat_format.h"
#include "core/text/tokenizer.h"

namespace glmserve {

enum class ToolChoiceMode {
  kAuto,      // the model decides (the default)
  kNone,      // the tools are left out of the prompt, so the model cannot call them
  kRequired,  // the reply starts (after its reasoning) with a tool call
  kFunction,  // ... with a call of `function`
};

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction: the name, one of the tools'
};

// A forced function name is written into GLM's tool-call syntax, so it is bounded and may hold
// no '\n' or '<' (they end the name there).
inline constexpr size_t kMaxToolNameBytes = 128;

// The function names of `tools_json` (each an OpenAI tool object {"type": "function",
// "function": {"name": ...}}, or a bare {"name": ...}); a tool without a string name has none.
// INVALID_ARGUMENT for a tool that is not a JSON object.
absl::StatusOr<std::vector<std::string>> ToolFunctionNames(
    absl::Span<const std::string> tools_json);

// The request rules of a tool choice (INVALID_ARGUMENT): "required" and a function need tools
// and the generation prompt; a function must be one of the tools and a valid name.
absl::Status CheckToolChoice(const ToolChoice& choice, const ChatOptions& options);

// The tokens `choice` forces for a chat prompt whose rendered text is `prompt_text` (empty
// tokens for auto / none). FAILED_PRECONDITION when the tokenizer lacks "</think>" and the
// prompt needs it as the trigger.
absl::StatusOr<ForcedTokens> ToolChoiceForcing(const Tokenizer& tokenizer, const ToolChoice& choice,
                                               std::string_view prompt_text);

}  // namespace glmserve
