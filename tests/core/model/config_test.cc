#include "core/model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, PresetsValidate) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
}

// A small valid config as JSON, with `extra` fields appended (later keys win in the parser, so
// extra fields override the base ones).
std::string Json(const std::string& extra = "") {
  std::string base =
      R"({"model_type": "glm4_moe", "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1)";
  return base + (extra.empty() ? "" : ", " + extra) + "}";
}

// The error message of parsing Json(extra); fails the test if it parses.
std::string ParseError(const std::string& extra) {
  absl::StatusOr<ModelConfig> c = ParseConfigJson(Json(extra));
  EXPECT_FALSE(c.ok()) << extra;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(ConfigTest, ParsesSmallConfig) {
  absl::StatusOr<ModelConfig> c = ParseConfigJson(Json(R"("eos_token_id": [1, 2])"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rotary_dim(), 8);
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_TRUE(c->is_moe_layer(1));
  absl::StatusOr<ModelConfig> single = ParseConfigJson(Json(R"("eos_token_id": 7)"));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->eos_token_ids, std::vector<int32_t>{7});
}

TEST(ConfigTest, DefaultsWhenAbsent) {
  // Only head_dim: the library default hidden 4096 / 96 heads is not an integer.
  absl::StatusOr<ModelConfig> c = ParseConfigJson(R"({"head_dim": 128})");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelConfig d;
  EXPECT_EQ(c->vocab_size, 151552);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 10944);
  EXPECT_EQ(c->moe_intermediate_size, 1408);
  EXPECT_EQ(c->num_hidden_layers, 46);
  EXPECT_EQ(c->num_attention_heads, 96);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->partial_rotary_factor, 0.5);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, d.rope_theta);
  EXPECT_FALSE(c->use_qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->n_routed_experts, 128);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->n_group, 1);
  EXPECT_EQ(c->topk_group, 1);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->routed_scaling_factor, 1.0);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_TRUE(c->eos_token_ids.empty());
  // Nulls count as absent.
  EXPECT_TRUE(ParseConfigJson(Json(R"("rope_scaling": null, "pad_token_id": null)")).ok());
  // head_dim defaults to hidden / heads when that divides.
  absl::StatusOr<ModelConfig> derived =
      ParseConfigJson(R"({"hidden_size": 1536, "num_attention_heads": 96})");
  ASSERT_TRUE(derived.ok()) << derived.status();
  EXPECT_EQ(derived->head_dim, 16);
  EXPECT_THAT(ParseConfigJson("{}").status().message(), HasSubstr("head_dim"));
}

TEST(ConfigTest, BothRopeFormsAgree) {
  absl::StatusOr<ModelConfig> legacy =
      ParseConfigJson(Json(R"("rope_theta": 1000000.0, "partial_rotary_factor": 0.25)"));
  absl::StatusOr<ModelConfig> nested = ParseConfigJson(Json(
      R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                             "partial_rotary_factor": 0.25})"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(legacy->rope_theta, 1e6);
  EXPECT_EQ(nested->rope_theta, 1e6);
  EXPECT_EQ(legacy->partial_rotary_factor, 0.25);
  EXPECT_EQ(nested->partial_rotary_factor, 0.25);
  EXPECT_EQ(nested->rotary_dim(), 4);
  EXPECT_EQ(legacy->rotary_dim(), nested->rotary_dim());
  // Integer theta is a number too.
  absl::StatusOr<ModelConfig> int_theta = ParseConfigJson(Json(R"("rope_theta": 500000)"));
  ASSERT_TRUE(int_theta.ok());
  EXPECT_EQ(int_theta->rope_theta, 5e5);
  // Scaled RoPE is refused rather than computed wrong.
  absl::StatusOr<ModelConfig> yarn =
      ParseConfigJson(Json(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
  EXPECT_EQ(yarn.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(ParseError(R"("rope_parameters": 5)"), HasSubstr("rope_parameters"));
  EXPECT_THAT(ParseError(R"("rope_parameters": {"rope_theta": "big"})"),
              HasSubstr("rope_parameters.rope_theta"));
}

TEST(ConfigTest, HeadsNotDivisibleByKvHeads) {
  EXPECT_THAT(ParseError(R"("num_key_value_heads": 3)"), HasSubstr("num_key_value_heads"));
}

TEST(ConfigTest, OddOrZeroRotaryWidth) {
  EXPECT_THAT(ParseError(R"("head_dim": 10)"), HasSubstr("partial_rotary_factor"));  // 5 dims
  EXPECT_THAT(ParseError(R"("partial_rotary_factor": 0.0)"), HasSubstr("partial_rotary_factor"));
  EXPECT_THAT(ParseError(R"("partial_rotary_factor": 1.5)"), HasSubstr("partial_rotary_factor"));
}

TEST(ConfigTest, RouterFields) {
  EXPECT_THAT(ParseError(R"("num_experts_per_tok": 9)"), HasSubstr("num_experts_per_tok"));
  EXPECT_THAT(ParseError(R"("n_group": 3)"), HasSubstr("not divisible into 3 groups"));
  EXPECT_THAT(ParseError(R"("topk_group": 3)"), HasSubstr("topk_group"));
  EXPECT_THAT(ParseError(R"("n_group": 8)"), HasSubstr("at least two experts"));
  // One kept group of 4 experts cannot supply 5.
  EXPECT_THAT(ParseError(R"("num_experts_per_tok": 5)"), HasSubstr("topk_group"));
}

TEST(ConfigTest, UnknownActivationAndModelType) {
  EXPECT_THAT(ParseError(R"("hidden_act": "gelu")"), HasSubstr("hidden_act"));
  EXPECT_THAT(ParseError(R"("model_type": "llama")"), HasSubstr("model_type"));
}

TEST(ConfigTest, NonPositiveSizes) {
  for (const char* field :
       {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
        "max_position_embeddings"}) {
    for (const char* value : {"0", "-4"}) {
      // head_dim 0 means "derive from hidden_size / num_attention_heads", like absent.
      if (std::string(field) == "head_dim" && std::string(value) == "0") continue;
      const std::string message = ParseError(std::string("\"") + field + "\": " + value);
      EXPECT_THAT(message, HasSubstr(field)) << field << "=" << value;
    }
  }
  EXPECT_THAT(ParseError(R"("n_shared_experts": -1)"), HasSubstr("n_shared_experts"));
  EXPECT_THAT(ParseError(R"("first_k_dense_replace": -1)"), HasSubstr("first_k_dense_replace"));
  EXPECT_THAT(ParseError(R"("rms_norm_eps": 0)"), HasSubstr("rms_norm_eps"));
  EXPECT_THAT(ParseError(R"("rope_theta": -1)"), HasSubstr("rope_theta"));
  EXPECT_THAT(ParseError(R"("routed_scaling_factor": 0)"), HasSubstr("routed_scaling_factor"));
  EXPECT_THAT(ParseError(R"("eos_token_id": 256)"), HasSubstr("eos_token_id"));
  // Zero shared experts is allowed.
  EXPECT_TRUE(ParseConfigJson(Json(R"("n_shared_experts": 0)")).ok());
}

TEST(ConfigTest, WrongJsonTypes) {
  EXPECT_THAT(ParseError(R"("hidden_size": "64")"),
              HasSubstr("'hidden_size': expected an integer"));
  EXPECT_THAT(ParseError(R"("hidden_size": 64.5)"), HasSubstr("hidden_size"));
  EXPECT_THAT(ParseError(R"("use_qk_norm": 1)"), HasSubstr("use_qk_norm"));
  EXPECT_THAT(ParseError(R"("rms_norm_eps": "1e-5")"), HasSubstr("rms_norm_eps"));
  EXPECT_THAT(ParseError(R"("hidden_act": 3)"), HasSubstr("hidden_act"));
  EXPECT_THAT(ParseError(R"("eos_token_id": "x")"), HasSubstr("eos_token_id"));
  EXPECT_THAT(ParseError(R"("eos_token_id": [1, "x"])"), HasSubstr("eos_token_id"));
  EXPECT_THAT(ParseConfigJson("[1]").status().message(), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseConfigJson("{\"a\": ").status().message(), HasSubstr("not valid JSON"));
}

TEST(ConfigTest, PresetOptions) {
  absl::StatusOr<ModelConfig> c = PresetConfig("glm-4.5-air:layers=2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_FALSE(PresetConfig("glm-4.5:layers=0").ok());
  EXPECT_FALSE(PresetConfig("glm-4.5:bogus=1").ok());
  EXPECT_EQ(PresetConfig("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, LoadConfigFileNamesThePath) {
  absl::StatusOr<ModelConfig> c = LoadConfigFile("/nonexistent/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/config.json"));
}

}  // namespace
}  // namespace glmserve

namespace glmserve {
namespace {

// A FIFO or an oversized file as config.json is refused at once (never a blocked read or a
// gigabyte parsed).
TEST(ConfigTest, ConfigMustBeASmallRegularFile) {
  const std::string dir = testing::MakeTempDir("config_test_");
  ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0600), 0);
  absl::StatusOr<ModelConfig> c = LoadConfigFile(dir + "/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("not a regular file"));
  const std::string big = dir + "/big.json";
  std::ofstream(big) << std::string((1 << 20) + 1, ' ');
  c = LoadConfigFile(big);
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("the limit is 1048576"));
}

}  // namespace
}  // namespace glmserve
