// The tokenizer shipped for the embedded default model (models/glm-4.5-mini, made by
// tools/make_default_tokenizer.py): it loads with its chat template and stop tokens, every id
// fits the default model's embedding rows, and it encodes as Hugging Face `tokenizers` did.
#include <fstream>
#include <string>

#include "core/model/config.h"
#include "core/text/chat_format.h"
#include "core/text/text_assets.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {

const std::string kDir = std::string(GLMSERVE_SOURCE_DIR) + "/models/glm-4.5-mini";

TEST(DefaultModelTokenizer, LoadsAndFitsTheDefaultModel) {
  auto assets = LoadTextAssets(kDir);
  ASSERT_TRUE(assets.ok()) << assets.status();
  ASSERT_NE(assets->tokenizer, nullptr);
  EXPECT_TRUE(assets->has_chat_template) << assets->chat_template_problem;
  auto config = PresetConfig("glm-4.5-mini");
  ASSERT_TRUE(config.ok());
  EXPECT_LE(assets->tokenizer->id_limit(), config->vocab_size);
  ASSERT_EQ(assets->eos_token_ids.size(), 3u);
  EXPECT_EQ(assets->eos_token_ids[0], *assets->tokenizer->AddedTokenId("<|endoftext|>"));

  std::ifstream f(kDir + "/samples.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const auto c = nlohmann::json::parse(line);
    auto ids = assets->tokenizer->Encode(c.at("t").get<std::string>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c.at("ids").get<std::vector<int32_t>>()) << line;
    ++n;
  }
  EXPECT_GE(n, 4);
}

}  // namespace
}  // namespace glmserve
