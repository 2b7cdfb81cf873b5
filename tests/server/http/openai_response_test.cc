// GLM's parsed output in OpenAI's objects: a generation holding a think block, content and
// tool calls, run through the same TextStream as the endpoint (the real tokenizer shipped with
// the default model), gives a chat message with reasoning_content and tool_calls, and stream
// deltas that add up to the same message.
#include "server/http/openai_response.h"

#include <gtest/gtest.h>

#include "core/text/text_assets.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;

TEST(OpenAIResponseTest, ReasoningContentAndToolCallsStreamedAndWhole) {
  absl::StatusOr<TextAssets> assets =
      LoadTextAssets(std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini");
  ASSERT_TRUE(assets.ok()) << assets.status();
  const std::string generated =
      "<think>The user wants the weather.</think>Let me check."
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
      "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>";
  absl::StatusOr<std::vector<int32_t>> ids = assets->tokenizer->Encode(generated);
  ASSERT_TRUE(ids.ok()) << ids.status();

  TextStreamOptions options;
  options.chat = true;
  absl::StatusOr<std::unique_ptr<TextStream>> stream = TextStream::Create(*assets, options);
  ASSERT_TRUE(stream.ok()) << stream.status();
  int sent = 0;
  std::string reasoning, content;
  std::vector<Json> calls;
  const auto take = [&](const TextDelta& d) {
    const Json j = ChatDeltaJson(d, &sent);
    if (j.contains("reasoning_content")) reasoning += j["reasoning_content"].get<std::string>();
    if (j.contains("content")) content += j["content"].get<std::string>();
    if (j.contains("tool_calls")) {
      for (const Json& c : j["tool_calls"]) calls.push_back(c);
    }
  };
  for (int32_t id : *ids) {
    absl::StatusOr<TextDelta> d = (*stream)->Push(id);
    ASSERT_TRUE(d.ok()) << d.status();
    take(*d);
  }
  const TextResult result = (*stream)->Finish(FinishReason::kStop);
  take(result.last);
  EXPECT_STREQ(TextFinishReasonName(result.reason), "tool_calls");

  const Json message = ChatMessageJson(result);
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["reasoning_content"], "The user wants the weather.");
  EXPECT_EQ(message["content"], "Let me check.");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  const Json& first = message["tool_calls"][0];
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(first["function"]["name"], "get_weather");
  // Arguments are JSON text, as OpenAI sends them; "3" comes back as the number 3.
  EXPECT_EQ(Json::parse(first["function"]["arguments"].get<std::string>()),
            (Json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_FALSE(first.contains("index"));

  // The stream's deltas add up to the same message; tool calls are numbered 0, 1.
  EXPECT_EQ(reasoning, message["reasoning_content"]);
  EXPECT_EQ(content, message["content"]);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[0]["function"], first["function"]);
  EXPECT_EQ(calls[1]["function"], message["tool_calls"][1]["function"]);
}

TEST(OpenAIResponseTest, NoReasoningIsNullAndContentStaysAString) {
  TextResult result;
  result.content = "Hello.";
  const Json message = ChatMessageJson(result);
  EXPECT_TRUE(message["reasoning_content"].is_null());
  EXPECT_EQ(message["content"], "Hello.");
  EXPECT_FALSE(message.contains("tool_calls"));
  TextResult empty;
  EXPECT_EQ(ChatMessageJson(empty)["content"], "");  // never null without tool calls

  FinishEvent finish;
  finish.prompt_tokens = 7;
  finish.cached_prompt_tokens = 4;
  finish.generated_tokens = 5;
  EXPECT_EQ(UsageJson(finish), (Json{{"prompt_tokens", 7},
                                     {"completion_tokens", 5},
                                     {"total_tokens", 12},
                                     {"prompt_tokens_details", {{"cached_tokens", 4}}}}));
  int sent = 3;
  EXPECT_TRUE(ChatDeltaJson(TextDelta{}, &sent).empty());
  EXPECT_EQ(sent, 3);
}

}  // namespace
}  // namespace glmserve
