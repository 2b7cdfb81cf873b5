// ModelConfig: every Glm4MoeConfig field that changes the forward math, parsed once from a
// Hugging Face config.json (or taken from a preset) and validated before anything uses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/row_math.h"

namespace glmserve {

struct ModelConfig {
  // Defaults are Glm4MoeConfig's library defaults (used when config.json omits a field). The
  // field list itself is written once, in ForEachConfigField below.
  int64_t vocab_size = 151552;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 10944;     // dense FFN width
  int64_t moe_intermediate_size = 1408;  // width of each routed expert
  int64_t num_hidden_layers = 46;        // not counting the MTP layer(s)
  int64_t num_attention_heads = 96;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 0;  // 0 until parsed: defaults to hidden_size / num_attention_heads
  double partial_rotary_factor = 0.5;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool use_qk_norm = false;
  bool attention_bias = false;
  int64_t n_routed_experts = 128;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 8;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 1;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 131072;
  int64_t num_nextn_predict_layers = 0;
  std::vector<int32_t> eos_token_ids;
  int64_t pad_token_id = -1;  // -1: none

  // The architecture: "glm4_moe" (GLM-4.5, Glm4MoeForCausalLM: grouped-query attention) or
  // "glm_moe_dsa" (GLM-5, GlmMoeDsaForCausalLM: multi-head latent attention + the DSA
  // indexer; docs/glm5.md). The fields below are GLM-5's (GlmMoeDsaConfig's defaults, the
  // released shape); a glm4_moe config ignores them.
  std::string model_type = "glm4_moe";
  int64_t q_lora_rank = 2048;
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 192;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 256;
  int64_t index_n_heads = 32;
  int64_t index_head_dim = 128;
  int64_t index_topk = 2048;
  // Per layer: "full" (runs the indexer) or "shared" (reuses the previous full layer's
  // top-k). Derived when config.json omits it (ParseConfigJson, as GlmMoeDsaConfig does).
  std::vector<std::string> indexer_types;
  // Per layer: "dense" or "sparse" (MoE); empty: layers >= first_k_dense_replace are MoE.
  std::vector<std::string> mlp_layer_types;

  // Derived facts (valid after Validate()).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  bool is_moe_layer(int64_t layer) const {
    if (!mlp_layer_types.empty()) return mlp_layer_types[static_cast<size_t>(layer)] == "sparse";
    return layer >= first_k_dense_replace;
  }
  // GLM-5's latent attention (model_type glm_moe_dsa).
  bool is_mla() const { return model_type == "glm_moe_dsa"; }
  // Layer num_hidden_layers is the MTP layer, which keeps its own indexer (GLM-5).
  bool has_indexer(int64_t layer) const {
    if (layer >= num_hidden_layers) return is_mla();
    return is_mla() && indexer_types[static_cast<size_t>(layer)] == "full";
  }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values per token slot and layer in the KV cache: K and V of every KV head (GLM-4.5), or
  // the latent row (GLM-5): normed latent, rotary key and, when any layer has an indexer,
  // the indexer key (core/cpu/ops/mla.h).
  int64_t cache_values_per_token_layer() const {
    if (!is_mla()) return 2 * kv_dim();
    bool any_full = false;
    for (const std::string& t : indexer_types) any_full |= t == "full";
    return kv_lora_rank + qk_rope_head_dim + (any_full ? index_head_dim : 0);
  }
  int64_t shared_intermediate_size() const { return moe_intermediate_size * n_shared_experts; }
};

// What the field list says about one field beyond its name and type.
struct ConfigField {
  enum class Bound { kAny, kNonNegative, kPositive };
  // Which architecture's config.json carries the field (the writer leaves the others out).
  enum class Arch { kBoth, kGlm45, kGlm5 };
  const char* name;                // the member's name, and the v1.ModelConfig field's
  Bound bound = Bound::kAny;       // checked by ValidateConfig
  const char* json_key = nullptr;  // config.json's key where it differs from `name`
  bool rope = false;  // also found inside config.json's rope_parameters / rope_scaling object
  Arch arch = Arch::kBoth;

  const char* key() const { return json_key != nullptr ? json_key : name; }
};

// The one list of ModelConfig's fields (as gemma.cpp's visitors): the config.json parser and
// writer, the field-bound checks and the v1.ModelConfig conversion all walk it, so a new
// field is added here and nowhere else. `Config` is ModelConfig or const ModelConfig; the
// visitor is called as visitor(const ConfigField&, member&) for every field, in order.
template <class Config, class Visitor>
void ForEachConfigField(Config& c, Visitor&& v) {
  using B = ConfigField::Bound;
  using A = ConfigField::Arch;
  v(ConfigField{"vocab_size", B::kPositive}, c.vocab_size);
  v(ConfigField{"hidden_size", B::kPositive}, c.hidden_size);
  v(ConfigField{"intermediate_size", B::kPositive}, c.intermediate_size);
  v(ConfigField{"moe_intermediate_size", B::kPositive}, c.moe_intermediate_size);
  v(ConfigField{"num_hidden_layers", B::kPositive}, c.num_hidden_layers);
  v(ConfigField{"num_attention_heads", B::kPositive}, c.num_attention_heads);
  v(ConfigField{"num_key_value_heads", B::kPositive}, c.num_key_value_heads);
  v(ConfigField{"head_dim", B::kPositive}, c.head_dim);
  v(ConfigField{"partial_rotary_factor", B::kPositive, nullptr, /*rope=*/true, A::kGlm45},
    c.partial_rotary_factor);
  v(ConfigField{"rope_theta", B::kPositive, nullptr, /*rope=*/true}, c.rope_theta);
  v(ConfigField{"rms_norm_eps", B::kPositive}, c.rms_norm_eps);
  v(ConfigField{"use_qk_norm", B::kAny, nullptr, false, A::kGlm45}, c.use_qk_norm);
  v(ConfigField{"attention_bias"}, c.attention_bias);
  v(ConfigField{"n_routed_experts", B::kPositive}, c.n_routed_experts);
  v(ConfigField{"n_shared_experts", B::kNonNegative}, c.n_shared_experts);
  v(ConfigField{"num_experts_per_tok", B::kPositive}, c.num_experts_per_tok);
  v(ConfigField{"n_group", B::kPositive}, c.n_group);
  v(ConfigField{"topk_group", B::kPositive}, c.topk_group);
  v(ConfigField{"norm_topk_prob"}, c.norm_topk_prob);
  v(ConfigField{"routed_scaling_factor", B::kPositive}, c.routed_scaling_factor);
  v(ConfigField{"first_k_dense_replace", B::kNonNegative}, c.first_k_dense_replace);
  v(ConfigField{"tie_word_embeddings"}, c.tie_word_embeddings);
  v(ConfigField{"hidden_act"}, c.hidden_act);
  v(ConfigField{"max_position_embeddings", B::kPositive}, c.max_position_embeddings);
  v(ConfigField{"num_nextn_predict_layers", B::kNonNegative}, c.num_nextn_predict_layers);
  v(ConfigField{"eos_token_ids", B::kAny, "eos_token_id"}, c.eos_token_ids);
  v(ConfigField{"pad_token_id"}, c.pad_token_id);
  v(ConfigField{"model_type"}, c.model_type);
  v(ConfigField{"q_lora_rank", B::kPositive, nullptr, false, A::kGlm5}, c.q_lora_rank);
  v(ConfigField{"kv_lora_rank", B::kPositive, nullptr, false, A::kGlm5}, c.kv_lora_rank);
  v(ConfigField{"qk_nope_head_dim", B::kPositive, nullptr, false, A::kGlm5}, c.qk_nope_head_dim);
  v(ConfigField{"qk_rope_head_dim", B::kPositive, nullptr, false, A::kGlm5}, c.qk_rope_head_dim);
  v(ConfigField{"v_head_dim", B::kPositive, nullptr, false, A::kGlm5}, c.v_head_dim);
  v(ConfigField{"index_n_heads", B::kPositive, nullptr, false, A::kGlm5}, c.index_n_heads);
  v(ConfigField{"index_head_dim", B::kPositive, nullptr, false, A::kGlm5}, c.index_head_dim);
  v(ConfigField{"index_topk", B::kPositive, nullptr, false, A::kGlm5}, c.index_topk);
  v(ConfigField{"indexer_types", B::kAny, nullptr, false, A::kGlm5}, c.indexer_types);
  v(ConfigField{"mlp_layer_types", B::kAny, nullptr, false, A::kGlm5}, c.mlp_layer_types);
}

// Parses the text of a config.json. Accepts both the legacy top-level rope_theta /
// partial_rotary_factor and the newer rope_parameters object. The result is validated.
absl::StatusOr<ModelConfig> ParseConfigJson(absl::string_view json_text);
absl::StatusOr<ModelConfig> LoadConfigFile(const std::string& path);

// Checks every invariant the kernels rely on; the error names the offending field.
absl::Status ValidateConfig(const ModelConfig& config);

// Presets: "glm-4.5", "glm-4.5-air", "glm-5" (released shapes), "glm-4.5-mini" (GLM-4.5-shaped
// but small enough to serve on a laptop CPU: the embedded default model), "tiny" and
// "tiny-glm5" (test shapes). Options follow a colon: "glm-4.5-air:layers=2" keeps the first
// two layers (and the first two entries of the per-layer lists).
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view spec);

// Whether a preset spec names an FP8 preset ("glm-4.5-air-fp8", "glm-4.5-fp8", "tiny-fp8":
// the shapes of their bf16 namesakes, random weights in e4m3 with per-channel scales; the
// embedding, routers and head bf16). LoadModel and the benches generate them so.
bool PresetIsFp8(absl::string_view spec);

// Names of the presets PresetConfig accepts (without options).
std::vector<std::string> PresetNames();

// Short human-readable summary ("hidden 4096, 46 layers, 128 experts top-8, ...").
std::string DescribeConfig(const ModelConfig& config);

// The router's parameters as both backends' router reads them (RouteRow, core/model/
// row_math.h): made here once from the config's fields (bounded by ValidateConfig).
rowmath::RouterRowParams RouterParamsOf(const ModelConfig& c);

}  // namespace glmserve
