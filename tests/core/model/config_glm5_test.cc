// GLM-5 (model_type glm_moe_dsa) configs: detection, the fields GlmMoeDsaConfig derives,
// validation and the presets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "core/model/checkpoint.h"
#include "core/model/config.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

// A small GLM-5 config.json with `extra` fields appended (later keys win).
std::string Glm5Json(const std::string& extra = "", bool with_type = true) {
  std::string base = std::string(with_type ? R"({"model_type": "glm_moe_dsa", )" : "{") +
                     R"("vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
          "moe_intermediate_size": 16, "num_hidden_layers": 6, "num_attention_heads": 4,
          "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
          "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
          "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8, "n_routed_experts": 8,
          "num_experts_per_tok": 2, "first_k_dense_replace": 1)";
  return base + (extra.empty() ? "" : ", " + extra) + "}";
}

std::vector<std::string> Words(std::initializer_list<const char*> w) {
  return {w.begin(), w.end()};
}

TEST(Glm5ConfigTest, DetectsTheArchitectureAndDerivesFields) {
  absl::StatusOr<ModelConfig> c = ParseConfigJson(Glm5Json());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_mla());
  EXPECT_EQ(c->head_dim, 8) << "head_dim is the rotary part (qk_rope_head_dim)";
  EXPECT_EQ(c->rotary_dim(), 8) << "RoPE spans the whole rotary part";
  EXPECT_EQ(c->qk_head_dim(), 24);
  // index_topk_freq 1 (the default): every layer runs its indexer.
  EXPECT_EQ(c->indexer_types, std::vector<std::string>(6, "full"));
  EXPECT_EQ(c->mlp_layer_types, Words({"dense", "sparse", "sparse", "sparse", "sparse", "sparse"}));
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_TRUE(c->is_moe_layer(5));
  // 32 latent + 8 rotary key + 16 indexer key per token and layer.
  EXPECT_EQ(c->cache_values_per_token_layer(), 56);
  // GlmMoeDsaConfig's defaults for what the file leaves out.
  EXPECT_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_EQ(c->max_position_embeddings, 202752);

  // Without model_type, `architectures` names it.
  c = ParseConfigJson(Glm5Json(R"("architectures": ["GlmMoeDsaForCausalLM"])", false));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_mla());
  c = ParseConfigJson(Glm5Json(R"("architectures": ["Glm4MoeForCausalLM"])"));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("architectures"));
}

TEST(Glm5ConfigTest, IndexerTypesFromFrequencyOffsetOrPattern) {
  // GlmMoeDsaConfig: full iff max(i - offset + 1, 0) % freq == 0.
  absl::StatusOr<ModelConfig> c =
      ParseConfigJson(Glm5Json(R"("index_topk_freq": 4, "index_skip_topk_offset": 3)"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types, Words({"full", "full", "full", "shared", "shared", "shared"}));
  c = ParseConfigJson(Glm5Json(R"("index_topk_pattern": "FSFSSF")"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types, Words({"full", "shared", "full", "shared", "shared", "full"}));
  // An explicit list wins over the derivation.
  c = ParseConfigJson(Glm5Json(
      R"("index_topk_freq": 2, "indexer_types": ["full", "full", "shared", "full", "full", "shared"])"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types[1], "full");
  EXPECT_EQ(c->cache_values_per_token_layer(), 56);
}

TEST(Glm5ConfigTest, RefusesWhatItCannotRun) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("index_topk_pattern": "SFFFFF")", "layer 0 is 'shared'"},
      {R"("index_topk_pattern": "FX")", "index_topk_pattern"},
      {R"("indexer_types": ["full", "shared"])", "has 2 entries for 6 layers"},
      {R"("mlp_layer_types": ["dense", "sparse", "moe", "sparse", "sparse", "sparse"])",
       "entry 2 is 'moe'"},
      {R"("qk_rope_head_dim": 7)", "qk_rope_head_dim"},
      {R"("index_head_dim": 4)", "index_head_dim"},
      {R"("kv_lora_rank": 0)", "kv_lora_rank"},
      {R"("kv_lora_rank": 100000000)", "kv_lora_rank"},
      {R"("indexer_types": "full")", "expected a list of strings"},
      {R"("model_type": "deepseek_v32")", "model_type"},
  };
  for (const auto& [extra, want] : cases) {
    absl::StatusOr<ModelConfig> c = ParseConfigJson(Glm5Json(extra));
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(want)) << extra;
  }
  // Supported by the reference but not here: UNIMPLEMENTED, naming the field.
  for (const char* extra : {R"("attention_bias": true)"}) {
    absl::StatusOr<ModelConfig> c = ParseConfigJson(Glm5Json(extra));
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << extra;
  }
  // FP8 GLM-5 (GLM-5-FP8): the config parses; the checkpoint loader reads the
  // quantization_config (core/model/fp8.h, refusing other methods by name there).
  absl::StatusOr<ModelConfig> fp8 = ParseConfigJson(Glm5Json(
      R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_TRUE(fp8.ok()) << fp8.status();
}

TEST(Glm5ConfigTest, PresetsAndLayerCuts) {
  absl::StatusOr<ModelConfig> c = PresetConfig("glm-5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 6144);
  EXPECT_EQ(c->num_hidden_layers, 78);
  EXPECT_EQ(c->vocab_size, 154880);
  EXPECT_EQ(c->n_routed_experts, 256);
  EXPECT_EQ(c->cache_values_per_token_layer(), 512 + 64 + 128);
  c = PresetConfig("glm-5:layers=4");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types.size(), 4u);
  EXPECT_EQ(c->mlp_layer_types, Words({"dense", "dense", "dense", "sparse"}));
  c = PresetConfig("tiny-glm5:layers=2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->indexer_types, Words({"full", "shared"}));
  EXPECT_THAT(DescribeConfig(*c), HasSubstr("glm_moe_dsa"));
}

// The config a GLM-5 checkpoint is saved with parses back to the same config.
TEST(Glm5ConfigTest, WrittenConfigRoundTrips) {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny-glm5");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string json = ConfigToJson(*c, DType::kBF16);
  EXPECT_THAT(json, HasSubstr("GlmMoeDsaForCausalLM"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("use_qk_norm")));
  absl::StatusOr<ModelConfig> back = ParseConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->indexer_types, c->indexer_types);
  EXPECT_EQ(back->mlp_layer_types, c->mlp_layer_types);
  EXPECT_EQ(back->index_topk, c->index_topk);
  EXPECT_EQ(back->head_dim, c->head_dim);
  // And a GLM-4.5 config carries none of GLM-5's fields.
  const std::string glm45 = ConfigToJson(*PresetConfig("tiny"), DType::kBF16);
  EXPECT_THAT(glm45, ::testing::Not(HasSubstr("kv_lora_rank")));
  EXPECT_THAT(glm45, HasSubstr("\"glm4_moe\""));
}

}  // namespace
}  // namespace glmserve
