// glmserve.v1's text API end to end on loopback: the real server with a tiny random model
// whose vocabulary covers the embedded default model's tokenizer (models/glm-4.5-mini), and
// the real client. Text deltas, chat parsing, stop strings (cancelled in the engine),
// Tokenize/Detokenize, ModelInfo, every error, and a server without a tokenizer.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>

#include "absl/strings/match.h"
#include "core/model/checkpoint.h"
#include "core/model/config.h"
#include "core/text/text_generation.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

using testing::Connect;
using testing::EngineDrained;
using testing::StartServer;
using testing::TinyOptions;
using testing::WaitUntil;

using testing::kTokenizerDir;
using testing::MiniAssets;
using testing::StartTextServer;
using testing::TextRunner;

v1::ChatMessage Message(const std::string& role, const std::string& content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

// Everything one Generate call streamed.
struct Streamed {
  absl::Status status;
  v1::Finished finished;
  std::vector<int32_t> tokens;
  std::string text, reasoning, content;
  std::vector<v1::ToolCall> tool_calls;
  int messages = 0;
};

class TextServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartTextServer();
    ASSERT_NE(server_, nullptr);
    client_ = Connect(*server_);
  }
  void TearDown() override {
    EXPECT_TRUE(WaitUntil([&] { return EngineDrained(server_->engine()); }));
    EXPECT_EQ(server_->engine()->Stats().invariant_error, "");
  }

  Streamed Run(const v1::GenerateRequest& request) {
    Streamed out;
    absl::StatusOr<v1::Finished> finished =
        client_->GenerateChunks(request, [&](const v1::GenerateResponse& r) {
          ++out.messages;
          for (const v1::GeneratedToken& t : r.tokens()) out.tokens.push_back(t.token_id());
          out.text += r.text();
          out.reasoning += r.reasoning_content();
          out.content += r.content();
          out.tool_calls.insert(out.tool_calls.end(), r.tool_calls().begin(), r.tool_calls().end());
        });
    out.status = finished.status();
    if (finished.ok()) out.finished = *finished;
    return out;
  }

  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = true) {
    v1::DetokenizeRequest request;
    request.mutable_token_ids()->Add(ids.begin(), ids.end());
    request.set_skip_special_tokens(skip_special);
    absl::StatusOr<v1::DetokenizeResponse> r = client_->Detokenize(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->text() : "";
  }

  std::unique_ptr<GlmServer> server_;
  std::unique_ptr<Client> client_;
};

v1::GenerateRequest TextRequest(const std::string& text, int max_new_tokens) {
  v1::GenerateRequest request;
  request.set_prompt_text(text);
  request.mutable_stop()->set_max_new_tokens(max_new_tokens);
  request.mutable_stop()->set_ignore_eos(true);
  return request;
}

TEST_F(TextServiceTest, ModelInfoSaysTextWorks) {
  absl::StatusOr<v1::ModelInfo> info = client_->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->has_tokenizer());
  EXPECT_TRUE(info->has_chat_template());
  EXPECT_EQ(info->tokenizer_vocab_size(), 8228);
  EXPECT_EQ(info->tokenizer_source(), kTokenizerDir);
  EXPECT_EQ(info->limits().max_stop_strings(), 16);
  EXPECT_EQ(info->limits().max_stop_string_bytes(), 256);
}

TEST_F(TextServiceTest, PromptTextStreamsTextBesideTokens) {
  const Streamed s = Run(TextRequest("Hello, world! 你好", 24));
  ASSERT_TRUE(s.status.ok()) << s.status;
  ASSERT_EQ(s.tokens.size(), 24u);
  // Sampling stays within the tokenizer's ids although the model has 8,320 rows.
  for (int32_t id : s.tokens) EXPECT_LT(id, 8228);
  EXPECT_EQ(s.text, Decode(s.tokens));
  EXPECT_TRUE(s.reasoning.empty() && s.content.empty());  // not a chat request
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH);
  v1::TokenizeRequest tokenize;
  tokenize.set_text("Hello, world! 你好");
  absl::StatusOr<v1::TokenizeResponse> ids = client_->Tokenize(tokenize);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(s.finished.prompt_tokens(), ids->token_ids_size());

  // The same prompt as token ids with return_text: the same tokens and text (one engine path).
  v1::GenerateRequest by_ids;
  by_ids.mutable_prompt_token_ids()->CopyFrom(ids->token_ids());
  by_ids.mutable_stop()->set_max_new_tokens(24);
  by_ids.mutable_stop()->set_ignore_eos(true);
  by_ids.set_return_text(true);
  const Streamed again = Run(by_ids);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.tokens, s.tokens);
  EXPECT_EQ(again.text, s.text);
  // Without return_text a token-id request gets no text.
  by_ids.set_return_text(false);
  EXPECT_TRUE(Run(by_ids).text.empty());
  const std::string metrics = server_->metrics().Scrape();
  EXPECT_NE(metrics.find("glmserve_generate_input_total{input=\"prompt_text\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("glmserve_generate_input_total{input=\"token_ids\"} 2"),
            std::string::npos);
  // Generate's prompt and the Tokenize call: two encodes timed.
  EXPECT_NE(metrics.find("glmserve_tokenizer_duration_seconds_count{op=\"encode\"} 2"),
            std::string::npos)
      << metrics;
}

TEST_F(TextServiceTest, MessagesArePromptedWithTheChatFormatAndParsed) {
  v1::GenerateRequest request;
  *request.add_messages() = Message("system", "Be brief.");
  *request.add_messages() = Message("user", "What is the weather in Paris?");
  request.add_tools_json(
      R"({"type": "function", "function": {"name": "get_weather", "parameters": {}}})");
  request.set_enable_thinking(false);
  request.mutable_stop()->set_max_new_tokens(32);
  const Streamed s = Run(request);
  ASSERT_TRUE(s.status.ok()) << s.status;

  // The prompt is the chat format's rendering, exactly as Tokenize gives it.
  v1::TokenizeRequest tokenize;
  *tokenize.mutable_messages() = request.messages();
  *tokenize.mutable_tools_json() = request.tools_json();
  tokenize.set_enable_thinking(false);
  absl::StatusOr<v1::TokenizeResponse> prompt = client_->Tokenize(tokenize);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(s.finished.prompt_tokens(), prompt->token_ids_size());
  EXPECT_NE(prompt->text().find("<|system|>\nBe brief."), std::string::npos) << prompt->text();
  EXPECT_TRUE(absl::EndsWith(prompt->text(), "<|assistant|>\n<think></think>")) << prompt->text();

  // The parsed parts are what the core parser makes of the same ids.
  const TextAssets assets = MiniAssets();
  TextStreamOptions o;
  o.chat = true;
  auto stream = TextStream::Create(assets, o);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Push(s.tokens).ok());
  const TextResult want =
      (*stream)->Finish(s.finished.reason() == v1::FINISH_REASON_LENGTH ? FinishReason::kLength
                                                                        : FinishReason::kStop);
  EXPECT_EQ(s.text, want.text);
  EXPECT_EQ(s.reasoning, want.reasoning);
  EXPECT_EQ(s.content, want.content);
  EXPECT_EQ(s.tool_calls.size(), want.tool_calls.size());
  // The tokenizer's eos ids (not the model config's) end a text generation.
  if (s.finished.reason() == v1::FINISH_REASON_STOP) {
    EXPECT_TRUE(s.tokens.back() == 8192 || s.tokens.back() == 8199 || s.tokens.back() == 8201);
  } else {
    EXPECT_EQ(s.tokens.size(), 32u);
  }
}

TEST_F(TextServiceTest, StopStringsCutTheTextAndCancelTheGeneration) {
  const Streamed full = Run(TextRequest("Once upon a time", 40));
  ASSERT_TRUE(full.status.ok()) << full.status;
  ASSERT_EQ(full.tokens.size(), 40u);
  // A stop string from the middle of the text: two characters starting at a character
  // boundary near its middle (random weights: any text will do).
  size_t at = full.text.size() / 2;
  while (at > 0 && (static_cast<uint8_t>(full.text[at]) & 0xC0) == 0x80) --at;
  size_t end = at;
  for (int chars = 0; chars < 2 && end < full.text.size(); ++chars) {
    ++end;
    while (end < full.text.size() && (static_cast<uint8_t>(full.text[end]) & 0xC0) == 0x80) ++end;
  }
  const std::string stop = full.text.substr(at, end - at);
  ASSERT_FALSE(stop.empty());
  const size_t first = full.text.find(stop);

  // The same greedy tokens with room for many more: the stop string completes within the
  // first 40, and a cancellation that reached the engine ends it long before 900 (with a limit
  // of 40 the tiny model could finish all of them while the cancellation was on its way).
  constexpr int kRoom = 900;
  v1::GenerateRequest request = TextRequest("Once upon a time", kRoom);
  request.mutable_stop()->add_stop_strings("a string that never comes");
  request.mutable_stop()->add_stop_strings(stop);
  const Streamed s = Run(request);
  ASSERT_TRUE(s.status.ok()) << s.status;
  EXPECT_EQ(s.text, full.text.substr(0, first));
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(s.finished.stop_string(), stop);
  // The tokens up to the one that completed the stop string, and no more.
  ASSERT_LE(s.tokens.size(), full.tokens.size());
  EXPECT_EQ(s.tokens,
            std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + s.tokens.size()));
  EXPECT_GE(Decode(s.tokens).size(), first + stop.size());
  EXPECT_LT(Decode(std::vector<int32_t>(s.tokens.begin(), s.tokens.end() - 1)).size(),
            first + stop.size());
  // Cancelled in the engine: it did not run on to max_new_tokens.
  EXPECT_LT(s.finished.generated_tokens(), kRoom);
  EXPECT_NE(server_->metrics().Scrape().find("glmserve_stop_string_stops_total 1"),
            std::string::npos);
}

TEST_F(TextServiceTest, TokenizeAndDetokenizeRoundTrip) {
  for (const std::string text : {"plain ASCII", "中文 and 日本語 🎉 mixed\n\n  spaces",
                                 "<|user|>special tokens inside<think>x</think>"}) {
    v1::TokenizeRequest request;
    request.set_text(text);
    absl::StatusOr<v1::TokenizeResponse> ids = client_->Tokenize(request);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(ids->text(), text);
    const std::vector<int32_t> v(ids->token_ids().begin(), ids->token_ids().end());
    EXPECT_EQ(Decode(v, /*skip_special=*/false), text);
  }
  v1::TokenizeRequest chat;
  *chat.add_messages() = Message("user", "hi");
  absl::StatusOr<v1::TokenizeResponse> ids = client_->Tokenize(chat);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->text(), "[gMASK]<sop><|user|>\nhi<|assistant|>");
  const std::vector<int32_t> v(ids->token_ids().begin(), ids->token_ids().end());
  EXPECT_EQ(Decode(v, false), ids->text());
  EXPECT_EQ(Decode(v, true), "\nhi");  // special tokens skipped

  // A token split inside a character decodes to U+FFFD, as Hugging Face does.
  v1::TokenizeRequest one;
  one.set_text("🎉");
  absl::StatusOr<v1::TokenizeResponse> emoji = client_->Tokenize(one);
  ASSERT_TRUE(emoji.ok());
  if (emoji->token_ids_size() > 1) {
    EXPECT_EQ(Decode({emoji->token_ids(0)}, false), "\xEF\xBF\xBD");
  }
}

TEST_F(TextServiceTest, EveryBadTextRequestGetsItsStatusAndChangesNothing) {
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest*)> mutate;
    const char* message;  // a part of the error message
  };
  const std::vector<Case> cases = {
      {"text and ids", [](auto* r) { r->add_prompt_token_ids(5); }, "only one of"},
      {"text and messages", [](auto* r) { *r->add_messages() = Message("user", "x"); },
       "only one of"},
      {"no prompt", [](auto* r) { r->clear_prompt_text(); }, "no prompt"},
      {"tools without messages", [](auto* r) { r->add_tools_json("{}"); }, "tools_json"},
      {"thinking without messages", [](auto* r) { r->set_enable_thinking(true); },
       "enable_thinking"},
      {"unknown role",
       [](auto* r) {
         r->clear_prompt_text();
         *r->add_messages() = Message("wizard", "x");
       },
       "messages[0].role"},
      {"tool call on a user message",
       [](auto* r) {
         r->clear_prompt_text();
         v1::ChatMessage* m = r->add_messages();
         *m = Message("user", "x");
         m->add_tool_calls()->set_name("f");
       },
       "message"},
      {"arguments not an object",
       [](auto* r) {
         r->clear_prompt_text();
         *r->add_messages() = Message("user", "x");
         v1::ChatMessage* m = r->add_messages();
         *m = Message("assistant", "");
         v1::ToolCall* c = m->add_tool_calls();
         c->set_name("f");
         c->set_arguments_json("[1, 2]");
       },
       "argument"},
      {"10^5 stop strings",
       [](auto* r) {
         for (int i = 0; i < 100000; ++i) r->mutable_stop()->add_stop_strings("x");
       },
       "stop strings"},
      {"stop string too long",
       [](auto* r) { r->mutable_stop()->add_stop_strings(std::string(257, 'a')); }, "257 bytes"},
      {"empty stop string", [](auto* r) { r->mutable_stop()->add_stop_strings(""); }, "empty"},
  };
  const EngineStats before = server_->engine()->Stats();
  for (const Case& c : cases) {
    v1::GenerateRequest request = TextRequest("hello", 4);
    c.mutate(&request);
    const Streamed s = Run(request);
    EXPECT_EQ(s.status.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s.status;
    EXPECT_NE(s.status.message().find(c.message), std::string::npos) << c.name << ": " << s.status;
    EXPECT_EQ(s.messages, 0) << c.name;
  }
  // A prompt beyond the limit: encoding stops early, same status as a token prompt.
  const EngineStats after = server_->engine()->Stats();
  EXPECT_EQ(after.steps, before.steps);
  EXPECT_EQ(after.prompt_tokens_computed, before.prompt_tokens_computed);

  v1::TokenizeRequest both;
  both.set_text("x");
  *both.add_messages() = Message("user", "y");
  EXPECT_EQ(client_->Tokenize(both).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Tokenize(v1::TokenizeRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::DetokenizeRequest bad;
  bad.add_token_ids(1);
  bad.add_token_ids(8228);  // past the tokenizer (inside the model's vocabulary)
  absl::Status s = client_->Detokenize(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 1"), std::string::npos) << s;
}

TEST_F(TextServiceTest, ToolChoiceForcesTheCallOverGrpc) {
  v1::GenerateRequest request = TextRequest("x", 10);
  request.clear_prompt_text();
  *request.add_messages() = Message("user", "Weather in Paris?");
  request.add_tools_json(R"({"type": "function", "function": {"name": "get_weather"}})");
  request.set_enable_thinking(false);
  request.mutable_stop()->set_ignore_eos(true);
  request.set_tool_choice_function("get_weather");
  const Streamed s = Run(request);
  ASSERT_TRUE(s.status.ok()) << s.status;
  EXPECT_TRUE(absl::StartsWith(s.text, "\n<tool_call>get_weather\n")) << s.text;
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0].name(), "get_weather");
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH);
  // "required" forces "\n<tool_call>"; the name is the model's.
  request.clear_tool_choice_function();
  request.set_tool_choice("required");
  const Streamed r = Run(request);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(absl::StartsWith(r.text, "\n<tool_call>")) << r.text;
  EXPECT_EQ(r.tool_calls.size(), 1u);
  // The rules: a function not in tools_json, "required" without tools, both fields, a value
  // that is not a mode, tool_choice without messages.
  struct Case {
    std::function<void(v1::GenerateRequest*)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->set_tool_choice_function("get_time"); }, "not in tools"},
      {[](auto* r) {
         r->clear_tools_json();
         r->set_tool_choice("required");
       },
       "needs tools"},
      {[](auto* r) {
         r->set_tool_choice("required");
         r->set_tool_choice_function("get_weather");
       },
       "not both"},
      {[](auto* r) { r->set_tool_choice("always"); }, "tool_choice must be"},
      {[](auto* r) {
         r->clear_messages();
         r->clear_tools_json();
         r->clear_enable_thinking();
         r->set_prompt_text("hi");
         r->set_tool_choice("required");
       },
       "messages only"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest bad = request;
    bad.clear_tool_choice();
    c.mutate(&bad);
    const Streamed b = Run(bad);
    EXPECT_EQ(b.status.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << b.status;
    EXPECT_NE(b.status.message().find(c.message), std::string::npos) << b.status;
  }
}

TEST(TextServiceLimitsTest, LongTextPromptIsInvalidArgumentBeforeTheEngine) {
  ServerOptions options = TinyOptions();
  options.engine.limits.max_prompt_tokens = 8;
  std::unique_ptr<GlmServer> server = StartTextServer(options);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = Connect(*server);
  const int64_t steps = server->engine()->Stats().steps;  // the warm-up's
  v1::GenerateRequest request = TextRequest(std::string(20000, 'x') + " a b c d e f g h i", 2);
  absl::Status s = client->GenerateChunks(request, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("more than 8 tokens"), std::string::npos) << s;
  EXPECT_EQ(server->engine()->Stats().steps, steps);
}

TEST(TextServiceNoTokenizerTest, TextIsFailedPreconditionAndTokenIdsStillWork) {
  std::unique_ptr<GlmServer> server = StartServer();  // tiny, no tokenizer
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_tokenizer());
  EXPECT_FALSE(info->has_chat_template());

  v1::GenerateRequest text = TextRequest("hello", 4);
  absl::Status s = client->GenerateChunks(text, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tokenizer.json"), std::string::npos) << s;
  EXPECT_NE(s.message().find("prompt_text"), std::string::npos) << s;
  v1::GenerateRequest chat;
  *chat.add_messages() = Message("user", "hi");
  s = client->GenerateChunks(chat, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("messages"), std::string::npos) << s;
  v1::GenerateRequest stop = testing::GreedyRequest({1, 2}, 4);
  stop.mutable_stop()->add_stop_strings("x");
  EXPECT_EQ(client->GenerateChunks(stop, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::TokenizeRequest tokenize;
  tokenize.set_text("hi");
  EXPECT_EQ(client->Tokenize(tokenize).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::DetokenizeRequest detokenize;
  detokenize.add_token_ids(1);
  EXPECT_EQ(client->Detokenize(detokenize).status().code(), absl::StatusCode::kFailedPrecondition);

  // Token ids are served as before.
  absl::StatusOr<v1::Finished> done =
      client->Generate(testing::GreedyRequest({1, 2, 3}, 4), nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->generated_tokens(), 4);
}

TEST(TextServiceNoTokenizerTest, ATokenizerWithoutChatTemplateServesTextButNotMessages) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  ASSERT_NE(server, nullptr);
  TextAssets assets;
  assets.source = kTokenizerDir;
  assets.tokenizer = *Tokenizer::FromFile(kTokenizerDir + "/tokenizer.json");
  assets.chat_template_problem = "no chat_template in tokenizer_config.json or chat_template.jinja";
  DType dtype;
  ASSERT_TRUE(server->Serve(TextRunner(&dtype), dtype, std::move(assets)).ok());
  std::unique_ptr<Client> client = Connect(*server);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->has_tokenizer());
  EXPECT_FALSE(info->has_chat_template());
  EXPECT_NE(info->chat_template_problem().find("no chat_template"), std::string::npos);
  EXPECT_TRUE(client->GenerateChunks(TextRequest("hello", 2), nullptr).ok());
  v1::GenerateRequest chat;
  *chat.add_messages() = Message("user", "hi");
  absl::Status s = client->GenerateChunks(chat, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("chat template"), std::string::npos) << s;
}

TEST(TextServiceNoTokenizerTest, ATokenizerLargerThanTheModelIsRefusedAtLoad) {
  std::unique_ptr<GlmServer> server = StartServer(TinyOptions(), /*serve=*/false);
  ASSERT_NE(server, nullptr);
  DType dtype;
  std::unique_ptr<ModelRunner> runner = testing::TinyRunner(&dtype);  // 256 rows
  absl::Status s = server->Serve(std::move(runner), dtype, MiniAssets());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("8227"), std::string::npos) << s;
}

// The glm-server binary: the embedded default model finds its tokenizer next to the binary
// (copied there by the build), --tokenizer_dir overrides it, and a wrong tokenizer is refused.
TEST(GlmServerTextTest, TheDefaultModelServesTextAndTheFlagOverridesIt) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> server =
      testing::StartServerProcess({"--model=glm-4.5-mini", "--kv_capacity_tokens=2048"}, &target);
  EXPECT_NE(server->output().find("text        tokenizer "), std::string::npos) << server->output();
  std::unique_ptr<Client> client = Connect(target);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->has_tokenizer());
  EXPECT_TRUE(info->has_chat_template());
  EXPECT_TRUE(absl::EndsWith(info->tokenizer_source(), "/models/glm-4.5-mini"))
      << info->tokenizer_source();
  v1::GenerateRequest chat;
  *chat.add_messages() = Message("user", "Hello!");
  chat.mutable_stop()->set_max_new_tokens(8);
  chat.mutable_stop()->set_ignore_eos(true);
  std::vector<int32_t> tokens;
  std::string text;
  ASSERT_TRUE(client
                  ->GenerateChunks(chat,
                                   [&](const v1::GenerateResponse& r) {
                                     for (const auto& t : r.tokens())
                                       tokens.push_back(t.token_id());
                                     text += r.text();
                                   })
                  .ok());
  ASSERT_EQ(tokens.size(), 8u);
  // The 151,552-row random model samples only the tokenizer's 8,228 ids.
  for (int32_t id : tokens) EXPECT_LT(id, 8228);
  EXPECT_EQ(text, *DetokenizeIds(MiniAssets(), tokens, /*skip_special_tokens=*/true));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(30)), 0);

  server = testing::StartServerProcess(
      {"--model=glm-4.5-mini", "--kv_capacity_tokens=2048", "--tokenizer_dir=none"}, &target);
  info = Connect(target)->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_tokenizer());
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(30)), 0);

  // A tokenizer with more ids than the model has rows is not this model's: refused at load.
  testing::CommandResult r = testing::RunCommand(absl::StrCat(
      GLM_SERVER_PATH, " --model=tiny --port=0 --metrics_port=-1 --tokenizer_dir=", kTokenizerDir));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not this model's tokenizer"), std::string::npos) << r.output;
  r = testing::RunCommand(absl::StrCat(
      GLM_SERVER_PATH, " --model=tiny --port=0 --metrics_port=-1 --tokenizer_dir=/nonexistent"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--tokenizer_dir=/nonexistent is not a directory"), std::string::npos)
      << r.output;
}

}  // namespace
// glm-server with no --model serves the embedded default, glm-4.5-kjv (a trained checkpoint
// installed next to the binary by the build), with its own tokenizer; a chat message gets the
// reply Transformers' greedy decoding gives the same prompt (tests/golden/kjv/prompt.json:
// the chat template renders "Hello! What can you do?" to exactly its prompt), up to the stop
// token, and the reply is text of the chat format's answer part.
TEST(GlmServerTextTest, NoModelFlagServesTheTrainedDefaultModel) {
  std::string target;
  std::unique_ptr<testing::ChildProcess> server =
      testing::StartServerProcess({"--kv_capacity_tokens=4096"}, &target, /*default_model=*/true);
  std::unique_ptr<Client> client = Connect(target);
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model(), "glm-4.5-kjv");
  EXPECT_EQ(info->config().vocab_size(), 4160);
  EXPECT_TRUE(info->has_chat_template());
  EXPECT_TRUE(absl::EndsWith(info->tokenizer_source(), "/models/glm-4.5-kjv"))
      << info->tokenizer_source();

  std::ifstream f(testing::GoldenDir("kjv/prompt.json"));
  const nlohmann::json golden = nlohmann::json::parse(f);
  const std::vector<int32_t> reference = golden["greedy_64"].get<std::vector<int32_t>>();
  v1::GenerateRequest chat;
  *chat.add_messages() = Message("user", "Hello! What can you do?");
  chat.mutable_stop()->set_max_new_tokens(64);
  std::vector<int32_t> tokens;
  std::string text;
  ASSERT_TRUE(client
                  ->GenerateChunks(chat,
                                   [&](const v1::GenerateResponse& r) {
                                     for (const auto& t : r.tokens())
                                       tokens.push_back(t.token_id());
                                     text += r.text();
                                   })
                  .ok());
  ASSERT_FALSE(tokens.empty());
  ASSERT_LE(tokens.size(), reference.size());
  EXPECT_EQ(tokens, std::vector<int32_t>(reference.begin(), reference.begin() + tokens.size()));
  EXPECT_GT(text.size(), 20u) << text;
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(absl::Seconds(30)), 0);
}

}  // namespace glmserve
