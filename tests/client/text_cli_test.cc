// glm-client's text commands (chat, generate --text, tokenize, detokenize) against an
// in-process server with the embedded default model's tokenizer: what they print is what the
// client library gets for the same request.
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_server.h"

namespace glmserve {
namespace {

using testing::CommandResult;
using testing::RunCommand;

CommandResult Cli(const std::string& target, const std::string& args) {
  return RunCommand(absl::StrCat(GLM_CLIENT_PATH, " --target=", target, " ", args));
}

class TextCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartTextServer();
    ASSERT_NE(server_, nullptr);
    client_ = testing::Connect(*server_);
  }
  std::unique_ptr<GlmServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(TextCliTest, ChatOneShotPrintsWhatTheServerGenerates) {
  const CommandResult r =
      Cli(server_->target(), "--json --max_new_tokens=24 --thinking=off chat --message='Hi there'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json reply = nlohmann::json::parse(r.output);
  EXPECT_EQ(reply["role"], "assistant");

  v1::GenerateRequest request;
  v1::ChatMessage* m = request.add_messages();
  m->set_role("user");
  m->set_content("Hi there");
  request.set_enable_thinking(false);
  request.mutable_stop()->set_max_new_tokens(24);
  std::string content, reasoning;
  absl::StatusOr<v1::Finished> finished =
      client_->GenerateChunks(request, [&](const v1::GenerateResponse& chunk) {
        content += chunk.content();
        reasoning += chunk.reasoning_content();
      });
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(reply["content"], content);
  EXPECT_EQ(reply["reasoning_content"], reasoning);
  EXPECT_EQ(reply["finished"]["prompt_tokens"], finished->prompt_tokens());
  EXPECT_EQ(reply["finished"]["generated_tokens"], finished->generated_tokens());

  // Without --json the answer streams under its label, the summary on stderr.
  const CommandResult text =
      Cli(server_->target(), "--max_new_tokens=24 --thinking=off chat --message='Hi there'");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  if (!content.empty()) {
    EXPECT_NE(text.output.find("[answer] " + content), std::string::npos) << text.output;
  }
  EXPECT_NE(text.output.find("finished: FINISH_REASON_"), std::string::npos) << text.output;
}

TEST_F(TextCliTest, InteractiveChatKeepsTheConversation) {
  const CommandResult r = RunCommand(
      absl::StrCat("printf 'hello\\n\\nhow are you\\n/exit\\nignored\\n' | ", GLM_CLIENT_PATH,
                   " --target=", server_->target(), " --max_new_tokens=6 --ignore_eos chat"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Two turns (the blank line is skipped, nothing after /exit is sent); the second prompt
  // holds the first turn and its reply.
  std::vector<int64_t> prompts;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    const size_t at = line.find("finished: ");
    if (at == absl::string_view::npos) continue;
    const size_t comma = line.find(", ", at);
    int64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(comma + 2, line.find(' ', comma + 2) - comma - 2), &n))
        << line;
    prompts.push_back(n);
  }
  ASSERT_EQ(prompts.size(), 2u) << r.output;
  EXPECT_GT(prompts[1], prompts[0] + 6) << r.output;
}

TEST_F(TextCliTest, GenerateTextTokenizeAndDetokenize) {
  CommandResult r = Cli(server_->target(),
                        "--json --max_new_tokens=16 --ignore_eos "
                        "generate --text='Once upon a time'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output);
  ASSERT_EQ(out["tokens"].size(), 16u);
  std::vector<int32_t> ids;
  for (const auto& t : out["tokens"]) ids.push_back(t["token_id"].get<int32_t>());
  v1::DetokenizeRequest detokenize;
  detokenize.mutable_token_ids()->Add(ids.begin(), ids.end());
  detokenize.set_skip_special_tokens(true);
  absl::StatusOr<v1::DetokenizeResponse> text = client_->Detokenize(detokenize);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(out["text"], text->text());

  r = Cli(server_->target(), "tokenize --text='Hello, 世界!'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string id_line = r.output.substr(0, r.output.find('\n'));
  EXPECT_NE(r.output.find(" tokens"), std::string::npos) << r.output;
  r = Cli(server_->target(), absl::StrCat("detokenize --ids=", id_line));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Hello, 世界!\n");

  r = Cli(server_->target(), "--json tokenize --message=hi");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["text"], "[gMASK]<sop><|user|>\nhi<|assistant|>");
}

TEST_F(TextCliTest, BadFlagsAndServersWithoutATokenizerFailClearly) {
  CommandResult r = Cli(server_->target(), "--thinking=maybe chat --message=hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--thinking must be auto, on or off"), std::string::npos) << r.output;
  r = Cli(server_->target(), "detokenize --ids=1,x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--ids"), std::string::npos) << r.output;

  std::unique_ptr<GlmServer> plain = testing::StartServer();  // tiny, token ids only
  r = Cli(plain->target(), "chat --message=hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("FAILED_PRECONDITION"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace glmserve
