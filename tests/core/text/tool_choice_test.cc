// tool_choice for GLM-4.5 (core/text/tool_choice.h) on the tokenizer shipped with the embedded
// default model: the request rules, the forced tokens (exactly the text the chat template
// writes before a tool call, after the reasoning), "none" leaving the tools out of the
// prompt, and a forced call that the generation leaves unterminated still parsed as a call.
#include "core/text/tool_choice.h"

#include <string>
#include <vector>

#include "core/text/output_parser.h"
#include "core/text/text_generation.h"
#include "gtest/gtest.h"

namespace glmserve {
namespace {

const std::string kDir = std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini";

const TextAssets& Assets() {
  static const TextAssets* assets = [] {
    auto a = LoadTextAssets(kDir);
    EXPECT_TRUE(a.ok()) << a.status();
    return new TextAssets(std::move(*a));
  }();
  return *assets;
}

const char* kWeather =
    R"({"type": "function", "function": {"name": "get_weather", "parameters": {}}})";
const char* kTime = R"({"type": "function", "function": {"name": "get_time"}})";

TextInput Chat(ToolChoice choice, std::optional<bool> thinking) {
  TextInput input;
  ChatMessage m;
  m.role = ChatRole::kUser;
  m.content = "Weather in Paris?";
  input.messages = {m};
  input.chat.tools_json = {kWeather, kTime};
  input.chat.enable_thinking = thinking;
  input.tool_choice = std::move(choice);
  return input;
}

std::string Text(const std::vector<int32_t>& ids) {
  auto text = Assets().tokenizer->Decode(ids);
  EXPECT_TRUE(text.ok()) << text.status();
  return *text;
}

TEST(ToolChoiceTest, NamesComeFromOpenAIAndBareToolObjects) {
  auto names = ToolFunctionNames({kWeather, R"({"name": "bare"})", R"({"type": "x"})"});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"get_weather", "bare"}));
  EXPECT_EQ(ToolFunctionNames({"[1]"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolChoiceTest, RequestRules) {
  auto error = [](ToolChoice choice, std::vector<std::string> tools, bool generation_prompt) {
    ChatOptions options;
    options.tools_json = std::move(tools);
    options.add_generation_prompt = generation_prompt;
    return CheckToolChoice(choice, options);
  };
  const ToolChoice required{ToolChoiceMode::kRequired, ""};
  const ToolChoice weather{ToolChoiceMode::kFunction, "get_weather"};
  EXPECT_TRUE(error(required, {kWeather}, true).ok());
  EXPECT_TRUE(error(weather, {kTime, kWeather}, true).ok());
  EXPECT_TRUE(error({ToolChoiceMode::kNone, ""}, {}, true).ok());
  EXPECT_TRUE(error({ToolChoiceMode::kAuto, ""}, {}, true).ok());
  struct Case {
    ToolChoice choice;
    std::vector<std::string> tools;
    bool generation_prompt;
    const char* message;
  };
  const std::vector<Case> cases = {
      {required, {}, true, "tool_choice \"required\" needs tools"},
      {weather, {}, true, "a named tool_choice needs tools"},
      {required, {kWeather}, false, "add_generation_prompt"},
      {{ToolChoiceMode::kFunction, "get_time"},
       {kWeather},
       true,
       "'get_time', which is not in tools (get_weather)"},
      {{ToolChoiceMode::kFunction, ""}, {kWeather}, true, "name is empty"},
      {{ToolChoiceMode::kFunction, "a\nb"}, {kWeather}, true, "without '\\n' or '<'"},
      {{ToolChoiceMode::kFunction, std::string(129, 'a')}, {kWeather}, true, "128 bytes"},
      {{ToolChoiceMode::kFunction, "\xff"}, {kWeather}, true, "UTF-8"},
  };
  for (const Case& c : cases) {
    const absl::Status s = error(c.choice, c.tools, c.generation_prompt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
  }
}

TEST(ToolChoiceTest, ForcedTokensAreTheTemplatesToolCallStartAfterTheReasoning) {
  const int32_t think_close = *Assets().tokenizer->AddedTokenId("</think>");
  const int32_t call_open = *Assets().tokenizer->AddedTokenId("<tool_call>");
  // Thinking off: the prompt ends with "<think></think>", so the call starts at once.
  auto off = BuildTextPrompt(Assets(), Chat({ToolChoiceMode::kFunction, "get_weather"}, false), 0);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->forced.after_token, -1);
  EXPECT_EQ(Text(off->forced.tokens), "\n<tool_call>get_weather\n");
  EXPECT_EQ(off->forced.tokens[1], call_open);  // the added token, as the model writes it
  // The same ids as the template's own rendering of that call gives (tokenized in context).
  auto rendered =
      Assets().tokenizer->Encode("</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>");
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(std::vector<int32_t>(rendered->begin() + 1,
                                 rendered->begin() + 1 + off->forced.tokens.size()),
            off->forced.tokens);
  // Thinking on: after the model's own "</think>".
  auto on = BuildTextPrompt(Assets(), Chat({ToolChoiceMode::kRequired, ""}, std::nullopt), 0);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->forced.after_token, think_close);
  EXPECT_EQ(Text(on->forced.tokens), "\n<tool_call>");
  // auto and none force nothing; none renders the prompt without the tools.
  auto none = BuildTextPrompt(Assets(), Chat({ToolChoiceMode::kNone, ""}, false), 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->forced.tokens.empty());
  TextInput without = Chat({}, false);
  without.chat.tools_json.clear();
  EXPECT_EQ(none->text, BuildTextPrompt(Assets(), without, 0)->text);
  auto with = BuildTextPrompt(Assets(), Chat({}, false), 0);
  EXPECT_TRUE(with->forced.tokens.empty());
  EXPECT_NE(with->text, none->text);
  // Errors surface through BuildTextPrompt; tool_choice needs messages.
  EXPECT_EQ(BuildTextPrompt(Assets(), Chat({ToolChoiceMode::kFunction, "nope"}, false), 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  TextInput text;
  text.prompt_text = "hi";
  text.tool_choice.mode = ToolChoiceMode::kRequired;
  EXPECT_EQ(BuildTextPrompt(Assets(), text, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolChoiceTest, AForcedCallLeftUnterminatedIsStillTheRepliesToolCall) {
  const std::string body =
      "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>unit</arg_key><arg_value>cel";
  Glm45OutputParser forced(false, /*keep_unterminated_call=*/true);
  ParsedDelta a = forced.Push(body);
  ParsedDelta b = forced.Finish();
  EXPECT_EQ(a.content + b.content, "\n");
  ASSERT_EQ(b.tool_calls.size(), 1u);
  EXPECT_EQ(b.tool_calls[0].name, "get_weather");
  EXPECT_EQ(b.tool_calls[0].arguments_json, R"({"city":"Paris"})");  // complete pairs only
  // Only the name, then junk on the next line: the name alone.
  Glm45OutputParser junk(false, true);
  junk.Push("\n<tool_call>get_time\nzz yy");
  ParsedDelta j = junk.Finish();
  ASSERT_EQ(j.tool_calls.size(), 1u);
  EXPECT_EQ(j.tool_calls[0].name, "get_time");
  EXPECT_EQ(j.tool_calls[0].arguments_json, "{}");
  // Not forced: an unterminated call is content, as before.
  Glm45OutputParser plain;
  ParsedDelta p = plain.Push(body);
  ParsedDelta q = plain.Finish();
  EXPECT_TRUE(q.tool_calls.empty());
  EXPECT_EQ(p.content + q.content, body);
}

TEST(ToolChoiceTest, TextStreamFinishesAForcedCallWithToolCalls) {
  auto prompt =
      BuildTextPrompt(Assets(), Chat({ToolChoiceMode::kFunction, "get_weather"}, false), 0);
  ASSERT_TRUE(prompt.ok());
  TextStreamOptions options;
  options.chat = true;
  options.forced_tool_call = true;
  options.stop = {"STOP"};
  auto stream = TextStream::Create(Assets(), options);
  ASSERT_TRUE(stream.ok());
  std::vector<int32_t> ids = prompt->forced.tokens;
  auto junk = Assets().tokenizer->Encode("<arg_key>x</arg_key> junk STOP more");
  ids.insert(ids.end(), junk->begin(), junk->end());
  for (int32_t id : ids) ASSERT_TRUE((*stream)->Push(id).ok());
  TextResult r = (*stream)->Finish(FinishReason::kStop);
  EXPECT_EQ(r.reason, TextFinishReason::kToolCalls);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
}

}  // namespace
}  // namespace glmserve
