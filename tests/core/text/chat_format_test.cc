// GLM-4.5's chat format rendered natively against Python jinja2's rendering of the published
// template (tests/golden/chat, made by tools/make_chat_goldens.py), byte for byte.
#include "core/text/chat_format.h"

#include <fstream>
#include <string>
#include <vector>

#include "core/text/py_json.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

using OJson = nlohmann::ordered_json;
const std::string kDir = std::string(GLMSERVE_GOLDEN_DIR) + "/chat";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The golden's Python-side message (OpenAI shape) as the core struct a front end would build.
ChatMessage ToMessage(const OJson& m) {
  ChatMessage out;
  out.role = *ParseChatRole(m.at("role").get<std::string>());
  out.content = m.value("content", "");
  if (m.contains("reasoning_content"))
    out.reasoning_content = m.at("reasoning_content").get<std::string>();
  if (m.contains("tool_calls")) {
    for (const OJson& tc : m.at("tool_calls")) {
      const OJson& f = tc.contains("function") ? tc.at("function") : tc;
      out.tool_calls.push_back({f.at("name").get<std::string>(), f.at("arguments").dump()});
    }
  }
  return out;
}

TEST(ChatFormatGolden, EveryConversationMatchesJinja) {
  std::ifstream f(kDir + "/conversations.jsonl");
  std::string line;
  size_t n = 0, with_tools = 0, with_calls = 0, no_think = 0;
  while (std::getline(f, line)) {
    const OJson c = OJson::parse(line);
    std::vector<ChatMessage> messages;
    for (const OJson& m : c.at("messages")) {
      messages.push_back(ToMessage(m));
      if (!messages.back().tool_calls.empty()) ++with_calls;
    }
    ChatOptions options;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.contains("enable_thinking")) {
      options.enable_thinking = c.at("enable_thinking").get<bool>();
      if (!*options.enable_thinking) ++no_think;
    }
    if (!c.at("tools").is_null()) {
      for (const OJson& t : c.at("tools")) options.tools_json.push_back(t.dump());
      ++with_tools;
    }
    auto rendered = RenderGlm45Chat(messages, options);
    ASSERT_TRUE(rendered.ok()) << rendered.status() << "\n" << line;
    EXPECT_EQ(*rendered, c.at("rendered").get<std::string>()) << "case " << n << ": " << line;
    ++n;
  }
  EXPECT_GE(n, 50u);
  EXPECT_GT(with_tools, 10u);
  EXPECT_GT(with_calls, 10u);
  EXPECT_GT(no_think, 10u);
}

TEST(ChatFormat, RecognisesOnlyGlm45sTemplate) {
  const std::string t = ReadFile(kDir + "/glm45_chat_template.jinja");
  ASSERT_FALSE(t.empty());
  EXPECT_TRUE(RecognizeChatTemplate(t).ok());
  EXPECT_TRUE(RecognizeChatTemplate(t + "\n").ok());  // a final newline does not matter
  std::string other = t;
  other.replace(other.find("<|user|>"), 8, "<|USER|>");
  absl::Status s = RecognizeChatTemplate(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not GLM-4.5's"), std::string::npos);
  EXPECT_FALSE(RecognizeChatTemplate("{{ messages }}").ok());
}

TEST(ChatFormat, BadInputGetsPreciseErrors) {
  EXPECT_EQ(ParseChatRole("developer").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseChatRole("observation"), ChatRole::kTool);
  ChatMessage user{ChatRole::kUser, "hi", std::nullopt, {}};
  ChatMessage bad_utf8{ChatRole::kUser, "a\xff", std::nullopt, {}};
  auto r = RenderGlm45Chat({user, bad_utf8}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("message 1"), std::string::npos);
  ChatMessage call{ChatRole::kAssistant, "", std::nullopt, {{"f", "[1, 2]"}}};
  r = RenderGlm45Chat({user, call}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a JSON object"), std::string::npos);
  ChatMessage user_call{ChatRole::kUser, "", std::nullopt, {{"f", "{}"}}};
  EXPECT_FALSE(RenderGlm45Chat({user_call}, {}).ok());
  ChatOptions bad_tool;
  bad_tool.tools_json = {"{\"a\": "};
  EXPECT_EQ(RenderGlm45Chat({user}, bad_tool).status().code(), absl::StatusCode::kInvalidArgument);
  ChatLimits limits;
  limits.max_messages = 1;
  EXPECT_EQ(RenderGlm45Chat({user, user}, {}, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  limits = {};
  limits.max_bytes = 10;
  ChatMessage big{ChatRole::kUser, std::string(11, 'x'), std::nullopt, {}};
  EXPECT_EQ(RenderGlm45Chat({big}, {}, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  ChatOptions deep;
  deep.tools_json = {std::string(100, '[') + std::string(100, ']')};
  EXPECT_EQ(RenderGlm45Chat({user}, deep).status().code(), absl::StatusCode::kInvalidArgument);
  ChatMessage deep_call{
      ChatRole::kAssistant, "", std::nullopt, {{"f", "{\"a\": " + std::string(100000, '[') + "}"}}};
  EXPECT_EQ(RenderGlm45Chat({user, deep_call}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PyJson, FloatsAndStringsAsPythonWritesThem) {
  EXPECT_EQ(PythonFloatRepr(100.0), "100.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(1e-5), "1e-05");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(PythonFloatRepr(123.456), "123.456");
  EXPECT_EQ(*PythonJsonDumps(R"({"b":[1,2.5,"x\u0001\n",null,true],"a":{}})"),
            R"({"b": [1, 2.5, "x\u0001\n", null, true], "a": {}})");
  EXPECT_EQ(*PythonJsonDumps("\"字😀\""), "\"字😀\"");
}

}  // namespace
}  // namespace glmserve
