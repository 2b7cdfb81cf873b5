// The text plumbing every front end shares (core/text/text_generation.h), on the tokenizer
// shipped with the embedded default model: prompts from text and chat, deltas that
// concatenate to the full decode whatever the split, stop strings across token boundaries,
// chat parsing incrementally == at once, finish reasons and errors.
#include "core/text/text_generation.h"

#include <random>
#include <string>
#include <vector>

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

std::vector<int32_t> Ids(const std::string& text) {
  auto ids = Assets().tokenizer->Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return *ids;
}

ChatMessage Msg(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

// Feeds `ids` in random chunks (1..4 ids); returns every delta, Finish's last.
struct Fed {
  std::vector<TextDelta> deltas;
  TextResult result;
  std::string Joined() const {
    std::string s;
    for (const TextDelta& d : deltas) s += d.text;
    return s;
  }
};
Fed Feed(const TextStreamOptions& options, const std::vector<int32_t>& ids, uint32_t seed,
         FinishReason engine_reason = FinishReason::kStop) {
  auto stream = TextStream::Create(Assets(), options);
  EXPECT_TRUE(stream.ok()) << stream.status();
  std::mt19937 rng(seed);
  Fed run;
  for (size_t i = 0; i < ids.size();) {
    const size_t n = std::min<size_t>(1 + rng() % 4, ids.size() - i);
    auto d = (*stream)->Push(absl::MakeConstSpan(ids).subspan(i, n));
    EXPECT_TRUE(d.ok()) << d.status();
    run.deltas.push_back(*d);
    i += n;
  }
  run.result = (*stream)->Finish(engine_reason);
  run.deltas.push_back(run.result.last);
  return run;
}

TEST(TextGeneration, DeltasConcatenateToTheFullDecode) {
  const std::string texts[] = {
      "Hello, world! 你好，世界。 こんにちは 🎉👨‍👩‍👧 mixed ١٢٣ digits\n\n "
      " "
      "spaces\t",
      "def f(x):\n    return x ** 2  # ∑ café naïve",
      "<think>why</think>answer<|user|>after the eos"};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = Ids(text);
    auto full = Assets().tokenizer->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(full.ok());
    for (uint32_t seed = 0; seed < 50; ++seed) {
      Fed run = Feed({}, ids, seed);
      EXPECT_EQ(run.Joined(), *full);
      EXPECT_EQ(run.result.text, *full);
      EXPECT_EQ(run.result.reason, TextFinishReason::kStop);
      for (const TextDelta& d : run.deltas) {
        EXPECT_FALSE(d.stopped);
        EXPECT_TRUE(d.parsed.empty());  // not a chat stream
      }
    }
  }
}

TEST(TextGeneration, ByteTokensNeverSplitACharacter) {
  // The byte-level tokens of "字" (3 bytes) and "🎉" (4), pushed one at a time.
  const Tokenizer& tok = *Assets().tokenizer;
  std::vector<int32_t> ids;
  for (unsigned char c : std::string("字🎉")) {
    for (int32_t id = 0; id < tok.id_limit(); ++id) {
      if (tok.TokenBytes(id) == std::string(1, static_cast<char>(c))) {
        ids.push_back(id);
        break;
      }
    }
  }
  ASSERT_EQ(ids.size(), 7u);
  auto stream = TextStream::Create(Assets(), {});
  ASSERT_TRUE(stream.ok());
  std::vector<std::string> texts;
  for (int32_t id : ids) texts.push_back((*stream)->Push(id).value().text);
  EXPECT_EQ(texts, (std::vector<std::string>{"", "", "字", "", "", "", "🎉"}));
}

TEST(TextGeneration, StopStringsAcrossTokenBoundaries) {
  const std::string text = "The quick brown fox jumps over the lazy dog. 字字 END of it";
  const std::vector<int32_t> ids = Ids(text);
  ASSERT_GT(ids.size(), 10u);
  struct Case {
    std::vector<std::string> stops;
    std::string want;
    int index;
  } cases[] = {{{"k brown f"}, "The quic", 0},  // spans several tokens
               {{"zzz", "over the"}, "The quick brown fox jumps ", 1},
               {{"字字"}, "The quick brown fox jumps over the lazy dog. ", 0},
               // The first to complete wins, as in vLLM (the longer one would need more text).
               {{"the lazy dog", "lazy"}, "The quick brown fox jumps over the ", 1},
               {{"not there"}, text, -1}};
  for (const Case& c : cases) {
    for (uint32_t seed = 0; seed < 30; ++seed) {
      TextStreamOptions o;
      o.stop = c.stops;
      Fed run = Feed(o, ids, seed, FinishReason::kLength);
      EXPECT_EQ(run.Joined(), c.want) << c.stops[0];
      EXPECT_EQ(run.result.text, c.want);
      EXPECT_EQ(run.result.stop_index, c.index);
      // A stop string ends the generation as "stop" even though the engine said otherwise
      // (the caller cancelled it); without one, the engine's length stands.
      EXPECT_EQ(run.result.reason,
                c.index >= 0 ? TextFinishReason::kStop : TextFinishReason::kLength);
      int stopped = 0;
      for (const TextDelta& d : run.deltas) stopped += d.stopped;
      EXPECT_EQ(stopped, c.index >= 0 ? 1 : 0);
    }
  }
}

TEST(TextGeneration, StopPushesNothingAfterwards) {
  TextStreamOptions o;
  o.stop = {"fox"};
  auto stream = TextStream::Create(Assets(), o);
  ASSERT_TRUE(stream.ok());
  auto d = (*stream)->Push(Ids("a fox and more"));
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->stopped);
  EXPECT_EQ(d->text, "a ");
  EXPECT_TRUE((*stream)->stopped());
  auto later = (*stream)->Push(Ids(" trailing"));
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->empty());
  TextResult r = (*stream)->Finish(FinishReason::kCancelled);
  EXPECT_EQ(r.text, "a ");
  EXPECT_EQ(r.reason, TextFinishReason::kStop);
  EXPECT_TRUE(r.last.empty());
}

TEST(TextGeneration, ChatParsingIncrementallyEqualsAtOnce) {
  const std::string generated =
      "<think>The user wants the weather.</think>\nLet me check.<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n<arg_key>days</arg_key>\n"
      "<arg_value>3</arg_value>\n</tool_call>";
  std::vector<int32_t> ids = Ids(generated);
  ids.push_back(*Assets().tokenizer->AddedTokenId("<|observation|>"));  // an eos id
  TextStreamOptions o;
  o.chat = true;
  // All at once.
  auto stream = TextStream::Create(Assets(), o);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Push(ids).ok());
  const TextResult once = (*stream)->Finish(FinishReason::kStop);
  EXPECT_EQ(once.reasoning, "The user wants the weather.");
  EXPECT_EQ(once.content, "\nLet me check.");
  ASSERT_EQ(once.tool_calls.size(), 1u);
  EXPECT_EQ(once.tool_calls[0].name, "get_weather");
  EXPECT_EQ(once.tool_calls[0].arguments_json, "{\"city\":\"北京\",\"days\":3}");
  EXPECT_EQ(once.reason, TextFinishReason::kToolCalls);
  EXPECT_EQ(once.text, generated);  // the special eos is skipped
  for (uint32_t seed = 0; seed < 100; ++seed) {
    Fed run = Feed(o, ids, seed);
    std::string reasoning, content;
    std::vector<ParsedToolCall> calls;
    for (const TextDelta& d : run.deltas) {
      reasoning += d.parsed.reasoning;
      content += d.parsed.content;
      calls.insert(calls.end(), d.parsed.tool_calls.begin(), d.parsed.tool_calls.end());
    }
    EXPECT_EQ(reasoning, once.reasoning);
    EXPECT_EQ(content, once.content);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].arguments_json, once.tool_calls[0].arguments_json);
    EXPECT_EQ(run.result.reasoning, once.reasoning);
    EXPECT_EQ(run.result.content, once.content);
    EXPECT_EQ(run.result.reason, TextFinishReason::kToolCalls);
    EXPECT_EQ(run.Joined(), generated);
  }
}

TEST(TextGeneration, ChatStartsInReasoningWhenThePromptOpensAThinkBlock) {
  TextStreamOptions o;
  o.chat = true;
  o.starts_in_reasoning = true;
  Fed run = Feed(o, Ids("thinking...</think>done"), 1, FinishReason::kLength);
  EXPECT_EQ(run.result.reasoning, "thinking...");
  EXPECT_EQ(run.result.content, "done");
  EXPECT_EQ(run.result.reason, TextFinishReason::kLength);
}

TEST(TextGeneration, BuildsPromptsFromTextAndMessages) {
  TextInput plain;
  plain.prompt_text = "hello world";
  auto p = BuildTextPrompt(Assets(), plain, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ids, Ids("hello world"));
  EXPECT_EQ(p->text, "hello world");
  EXPECT_FALSE(p->starts_in_reasoning);

  TextInput chat;
  chat.messages = {Msg(ChatRole::kSystem, "Be brief."), Msg(ChatRole::kUser, "Hi there")};
  chat.chat.enable_thinking = false;
  auto c = BuildTextPrompt(Assets(), chat, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  auto rendered = RenderGlm45Chat(chat.messages, chat.chat);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(c->text, *rendered);
  EXPECT_EQ(c->ids, Ids(*rendered));
  EXPECT_EQ(c->ids[0], *Assets().tokenizer->AddedTokenId("[gMASK]"));
  EXPECT_EQ(c->ids[1], *Assets().tokenizer->AddedTokenId("<sop>"));

  auto text = DetokenizeIds(Assets(), c->ids, /*skip_special_tokens=*/false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, *rendered);
}

TEST(TextGeneration, PromptErrors) {
  TextInput both;
  both.prompt_text = "x";
  both.messages = {Msg(ChatRole::kUser, "y")};
  EXPECT_EQ(BuildTextPrompt(Assets(), both, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildTextPrompt(Assets(), TextInput{}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  TextInput empty;
  empty.prompt_text = "";
  EXPECT_EQ(BuildTextPrompt(Assets(), empty, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  TextInput bad;
  bad.prompt_text = std::string("ok\xff", 3);
  auto s = BuildTextPrompt(Assets(), bad, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt_text"), std::string::npos) << s;
  EXPECT_NE(s.message().find("UTF-8"), std::string::npos) << s;
  TextInput long_text;
  long_text.prompt_text = std::string(10000, 'x') + " a b c d e f g h i j k";
  s = BuildTextPrompt(Assets(), long_text, 5).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("more than 5 tokens"), std::string::npos) << s;
  TextInput bad_chat;
  bad_chat.messages = {Msg(ChatRole::kUser, "hi")};
  bad_chat.messages[0].tool_calls = {{"f", "{}"}};  // a tool call on a user message
  EXPECT_EQ(BuildTextPrompt(Assets(), bad_chat, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TextGeneration, WithoutTokenizerTextIsAPreconditionNamingWhatIsMissing) {
  TextAssets none;
  none.source = "/ckpt";
  TextInput plain;
  plain.prompt_text = "hi";
  auto s = BuildTextPrompt(none, plain, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tokenizer.json"), std::string::npos) << s;
  EXPECT_NE(s.message().find("prompt_text"), std::string::npos) << s;
  EXPECT_EQ(DetokenizeIds(none, {1, 2}, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TextStream::Create(none, {}).status().code(), absl::StatusCode::kFailedPrecondition);

  // A tokenizer without a usable chat template: plain text works, messages do not.
  TextAssets no_chat;
  no_chat.tokenizer = Tokenizer::FromFile(kDir + "/tokenizer.json").value();
  no_chat.chat_template_problem = "no chat_template in tokenizer_config.json";
  EXPECT_TRUE(BuildTextPrompt(no_chat, plain, 0).ok());
  TextInput chat;
  chat.messages = {Msg(ChatRole::kUser, "hi")};
  s = BuildTextPrompt(no_chat, chat, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("chat_template"), std::string::npos) << s;
  TextStreamOptions o;
  o.chat = true;
  EXPECT_EQ(TextStream::Create(no_chat, o).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TextGeneration, StopStringBoundsAndUnknownIds) {
  TextStreamOptions o;
  o.stop.assign(100000, "x");
  auto s = TextStream::Create(Assets(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  o.stop.assign(kStopStringLimits.max_count, "x");
  EXPECT_TRUE(TextStream::Create(Assets(), o).ok());
  o.stop = {std::string(kStopStringLimits.max_bytes + 1, 'a')};
  EXPECT_EQ(TextStream::Create(Assets(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o.stop = {std::string("\xc3", 1)};
  EXPECT_EQ(TextStream::Create(Assets(), o).status().code(), absl::StatusCode::kInvalidArgument);

  auto stream = TextStream::Create(Assets(), {});
  ASSERT_TRUE(stream.ok());
  const int32_t beyond = Assets().tokenizer->id_limit();
  EXPECT_EQ((*stream)->Push(beyond).status().code(), absl::StatusCode::kInvalidArgument);
  auto ok = (*stream)->Push(Ids("fine"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->text, "fine");  // the refused id changed nothing
  s = DetokenizeIds(Assets(), {Ids("a")[0], beyond}, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 1"), std::string::npos) << s;
}

TEST(TextGeneration, ApplyTextDefaultsAddsTheTokenizersEosAndBoundsSampling) {
  GenerateRequest g;
  g.stop.stop_token_ids = {5};
  ApplyTextDefaults(Assets(), &g);
  EXPECT_EQ(g.sample_vocab_limit, Assets().tokenizer->id_limit());
  std::vector<int32_t> want = {5};
  want.insert(want.end(), Assets().eos_token_ids.begin(), Assets().eos_token_ids.end());
  EXPECT_EQ(g.stop.stop_token_ids, want);
  ApplyTextDefaults(Assets(), &g);  // idempotent
  EXPECT_EQ(g.stop.stop_token_ids, want);

  GenerateRequest ignore;
  ignore.stop.ignore_eos = true;
  ignore.sample_vocab_limit = 100;  // a tighter bound stays
  ApplyTextDefaults(Assets(), &ignore);
  EXPECT_TRUE(ignore.stop.stop_token_ids.empty());
  EXPECT_EQ(ignore.sample_vocab_limit, 100);
}

}  // namespace
}  // namespace glmserve
