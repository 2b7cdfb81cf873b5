#include "core/text/text_assets.h"

#include <filesystem>
#include <fstream>

#include "core/text/chat_format.h"
#include "gtest/gtest.h"

namespace glmserve {
namespace {

namespace fs = std::filesystem;
const std::string kSmall = std::string(GLMSERVE_GOLDEN_DIR) + "/tokenizer/glm45_small";

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("glm_text_assets_" + name + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(TextAssets, LoadsTokenizerTemplateAndEos) {
  auto a = LoadTextAssets(kSmall);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->tokenizer, nullptr);
  EXPECT_TRUE(a->has_chat_template) << a->chat_template_problem;
  ASSERT_EQ(a->eos_token_ids.size(), 3u);
  EXPECT_EQ(a->eos_token_ids[0], *a->tokenizer->AddedTokenId("<|endoftext|>"));
  EXPECT_EQ(a->eos_token_ids[1], *a->tokenizer->AddedTokenId("<|user|>"));
  EXPECT_TRUE(MissingTextError(*a, true, "messages").ok());
  // The whole path: a chat rendered and encoded starts with [gMASK]<sop>.
  ChatMessage m{ChatRole::kUser, "hello", std::nullopt, {}};
  auto prompt = RenderGlm45Chat({m}, {});
  ASSERT_TRUE(prompt.ok());
  auto ids = a->tokenizer->Encode(*prompt);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], *a->tokenizer->AddedTokenId("[gMASK]"));
  EXPECT_EQ((*ids)[1], *a->tokenizer->AddedTokenId("<sop>"));
  EXPECT_EQ(ids->back(), *a->tokenizer->AddedTokenId("<|assistant|>"));
}

TEST(TextAssets, MissingPiecesAreNamed) {
  fs::path empty = TempDir("empty");
  auto a = LoadTextAssets(empty.string());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tokenizer, nullptr);
  absl::Status s = MissingTextError(*a, false, "prompt_text");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tokenizer.json"), std::string::npos);

  fs::path no_template = TempDir("notemplate");
  fs::copy_file(kSmall + "/tokenizer.json", no_template / "tokenizer.json");
  a = LoadTextAssets(no_template.string());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(MissingTextError(*a, false, "prompt_text").ok());
  s = MissingTextError(*a, true, "messages");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("chat_template"), std::string::npos);

  std::ofstream(no_template / "chat_template.jinja") << "{{ messages }}";
  a = LoadTextAssets(no_template.string());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->has_chat_template);
  EXPECT_NE(a->chat_template_problem.find("not GLM-4.5's"), std::string::npos);

  std::ofstream(no_template / "generation_config.json") << R"({"eos_token_id": [99999999]})";
  EXPECT_EQ(LoadTextAssets(no_template.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::ofstream(no_template / "tokenizer.json") << "{}";
  EXPECT_EQ(LoadTextAssets(no_template.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::remove_all(empty);
  fs::remove_all(no_template);
}

}  // namespace
}  // namespace glmserve
