#include "core/text/output_parser.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

struct Whole {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

// Feeds `text` in pieces cut at `cuts` and gathers the deltas.
Whole Parse(const std::string& text, std::vector<size_t> cuts, bool in_reasoning = false) {
  Glm45OutputParser p(in_reasoning);
  Whole w;
  const auto add = [&](const ParsedDelta& d) {
    w.reasoning += d.reasoning;
    w.content += d.content;
    w.calls.insert(w.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  size_t prev = 0;
  cuts.push_back(text.size());
  for (size_t c : cuts) {
    add(p.Push(text.substr(prev, c - prev)));
    prev = c;
  }
  add(p.Finish());
  return w;
}

const std::string kReply =
    "\n<think>The user wants weather.\nCheck 北京.</think>\nLet me look that up."
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n"
    "<arg_value>{\"unit\": \"c\"}</arg_value>\n</tool_call>"
    "<tool_call>search<arg_key>q</arg_key><arg_value>a < b</arg_value></tool_call>";

TEST(OutputParser, SplitsReasoningContentAndToolCalls) {
  const Whole w = Parse(kReply, {});
  EXPECT_EQ(w.reasoning, "The user wants weather.\nCheck 北京.");
  EXPECT_EQ(w.content, "\n\nLet me look that up.");  // the "\n" before <think> too
  ASSERT_EQ(w.calls.size(), 2u);
  EXPECT_EQ(w.calls[0].name, "get_weather");
  ASSERT_EQ(w.calls[0].arguments.size(), 3u);
  EXPECT_EQ(w.calls[0].arguments[0].second, "北京");
  EXPECT_EQ(nlohmann::json::parse(w.calls[0].arguments_json),
            nlohmann::json::parse(R"({"city": "北京", "days": 3, "opts": {"unit": "c"}})"));
  EXPECT_EQ(w.calls[1].name, "search");
  // A value nested beyond any sane depth stays a string instead of recursing.
  const std::string deep(100000, '[');
  ParsedToolCall c =
      Glm45OutputParser::ParseToolCall("f<arg_key>x</arg_key><arg_value>" + deep + "</arg_value>");
  EXPECT_EQ(nlohmann::json::parse(c.arguments_json)["x"], deep);
  EXPECT_EQ(nlohmann::json::parse(w.calls[1].arguments_json)["q"], "a < b");
}

TEST(OutputParser, AnyDeltaSplitGivesTheSameResult) {
  const Whole want = Parse(kReply, {});
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < kReply.size(); ++i) {
      if (rng() % 4 == 0) cuts.push_back(i);
    }
    const Whole got = Parse(kReply, cuts);
    ASSERT_EQ(got.reasoning, want.reasoning);
    ASSERT_EQ(got.content, want.content);
    ASSERT_EQ(got.calls.size(), want.calls.size());
    for (size_t i = 0; i < got.calls.size(); ++i) {
      ASSERT_EQ(got.calls[i].arguments_json, want.calls[i].arguments_json);
    }
  }
}

TEST(OutputParser, PartialMarkersAreHeldThenReleased) {
  Glm45OutputParser p;
  ParsedDelta d = p.Push("hello <thi");
  EXPECT_EQ(d.content, "hello ");
  d = p.Push("s is not a tag");
  EXPECT_EQ(d.content, "<this is not a tag");
  d = p.Push(" <tool_");
  EXPECT_EQ(d.content, " ");
  d = p.Finish();
  EXPECT_EQ(d.content, "<tool_");
}

TEST(OutputParser, UnterminatedPartsAtTheEnd) {
  Whole w = Parse("<think>still thinking", {3});
  EXPECT_EQ(w.reasoning, "still thinking");
  w = Parse("ok<tool_call>f<arg_key>a</arg_key>", {5});
  EXPECT_EQ(w.content, "ok<tool_call>f<arg_key>a</arg_key>");
  EXPECT_TRUE(w.calls.empty());
  // A generation that starts inside the think block (prompt ended with "<think>").
  w = Parse("plan</think>answer", {2}, /*in_reasoning=*/true);
  EXPECT_EQ(w.reasoning, "plan");
  EXPECT_EQ(w.content, "answer");
}

}  // namespace
}  // namespace glmserve
