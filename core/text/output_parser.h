// Parses what a GLM-4.5 model generates back into the parts of a chat reply, incrementally as
// text deltas arrive: reasoning (the <think>...</think> block), content, and tool calls
// (<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, white space
// between the parts allowed). Reasoning and content pass through unchanged (no trimming; only
// the markers are removed), so the result does not depend on how the text was split into
// deltas: a marker split across deltas is held until it is decided. Memory is bounded by the
// generation's length (a tool call is held whole until its closing tag).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace glmserve {

struct ParsedToolCall {
  std::string name;
  // The arguments in order, as generated (raw text between <arg_value> and </arg_value>).
  std::vector<std::pair<std::string, std::string>> arguments;
  // The arguments as a JSON object: a value that is itself valid JSON (a number, true, an
  // object, ...) is kept as that JSON, anything else becomes a JSON string. The chat template
  // writes non-string values with tojson, so this inverts it (a string that looks like JSON,
  // e.g. "42", comes back as a number: without the tool's schema it cannot be told apart).
  std::string arguments_json;
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class Glm45OutputParser {
 public:
  // `in_reasoning`: the generation starts inside a think block (the prompt ended with
  // "<think>"). GLM-4.5's template leaves that to the model, so the default is false.
  // `keep_unterminated_call`: the request forced a tool call (tool_choice), so one left
  // unterminated at the end is still the reply's tool call, not content.
  explicit Glm45OutputParser(bool in_reasoning = false, bool keep_unterminated_call = false)
      : state_(in_reasoning ? State::kReasoning : State::kContent),
        keep_unterminated_call_(keep_unterminated_call) {}

  ParsedDelta Push(std::string_view text);
  // The end of the generation: held text is released; an unterminated tool call is returned
  // as content (its source text), an unterminated think block as reasoning. With
  // keep_unterminated_call, an unterminated tool call is returned as a tool call: its name
  // (up to the first line break) and its complete <arg_key>/<arg_value> pairs.
  ParsedDelta Finish();

  // Parses one complete "<tool_call>...</tool_call>" body (without the outer tags).
  static ParsedToolCall ParseToolCall(std::string_view body);

 private:
  enum class State { kContent, kReasoning, kToolCall };
  void Run(bool final, ParsedDelta* out);

  State state_;
  bool keep_unterminated_call_;
  std::string buffer_;  // text not yet attributed
};

}  // namespace glmserve
