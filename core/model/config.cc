#include "core/model/config.h"

#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/file_io.h"
#include "core/base/status_macros.h"
#include "core/model/row_math.h"
#include "nlohmann/json.hpp"

namespace glmserve {
namespace {
// config.json of a released model is ~2 KiB; anything near this bound is not a config.
constexpr uint64_t kMaxConfigBytes = 1 << 20;
}  // namespace
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config field '", field, "': ", why));
}

// Reads an optional integer field; absent or null keeps the default.
absl::Status ReadInt(const Json& j, const char* field, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return FieldError(field, "expected an integer");
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadFloat(const Json& j, const char* field, double* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return FieldError(field, "expected a number");
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(field, "expected true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& j, const char* field, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return FieldError(field, "expected a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// eos_token_id is an integer or a list of integers.
absl::Status ReadTokenIds(const Json& j, const char* field, std::vector<int32_t>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  out->clear();
  if (it->is_number_integer()) {
    out->push_back(it->get<int32_t>());
    return absl::OkStatus();
  }
  if (!it->is_array()) return FieldError(field, "expected an integer or a list of integers");
  for (const Json& v : *it) {
    if (!v.is_number_integer()) return FieldError(field, "expected a list of integers");
    out->push_back(v.get<int32_t>());
  }
  return absl::OkStatus();
}

// Reads a field of any of ModelConfig's member types from object `j` under `key`.
absl::Status ReadField(const Json& j, const char* key, int64_t* out) {
  return ReadInt(j, key, out);
}
absl::Status ReadField(const Json& j, const char* key, double* out) {
  return ReadFloat(j, key, out);
}
absl::Status ReadField(const Json& j, const char* key, bool* out) { return ReadBool(j, key, out); }
absl::Status ReadField(const Json& j, const char* key, std::string* out) {
  return ReadString(j, key, out);
}
absl::Status ReadField(const Json& j, const char* key, std::vector<int32_t>* out) {
  return ReadTokenIds(j, key, out);
}
// A list of strings (indexer_types, mlp_layer_types).
absl::Status ReadField(const Json& j, const char* key, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return FieldError(key, "expected a list of strings");
  out->clear();
  for (const Json& v : *it) {
    if (!v.is_string()) return FieldError(key, "expected a list of strings");
    out->push_back(v.get<std::string>());
  }
  return absl::OkStatus();
}

constexpr char kGlm45Type[] = "glm4_moe";
constexpr char kGlm5Type[] = "glm_moe_dsa";

// model_type, or the architecture named in `architectures` when model_type is absent; the
// two must agree when both are given.
absl::Status ReadModelType(const Json& j, ModelConfig* c) {
  std::string model_type;
  RETURN_IF_ERROR(ReadString(j, "model_type", &model_type));
  std::string from_arch;
  auto it = j.find("architectures");
  if (it != j.end() && it->is_array()) {
    for (const Json& a : *it) {
      if (a == "Glm4MoeForCausalLM") from_arch = kGlm45Type;
      if (a == "GlmMoeDsaForCausalLM") from_arch = kGlm5Type;
    }
  }
  if (model_type.empty()) model_type = from_arch.empty() ? kGlm45Type : from_arch;
  if (model_type != kGlm45Type && model_type != kGlm5Type) {
    return FieldError("model_type", absl::StrCat("'", model_type, "' is neither '", kGlm45Type,
                                                 "' (GLM-4.5) nor '", kGlm5Type, "' (GLM-5)"));
  }
  if (!from_arch.empty() && from_arch != model_type) {
    return FieldError("architectures", absl::StrCat("names a ", from_arch,
                                                    " model but model_type is '", model_type, "'"));
  }
  c->model_type = model_type;
  return absl::OkStatus();
}

// What GlmMoeDsaConfig.__post_init__ derives: head_dim is the rotary part of a query head
// (the reference's RoPE spans all of it, partial_rotary_factor is not used), indexer_types
// from index_topk_pattern ("F"/"S" per layer) or index_topk_freq / index_skip_topk_offset,
// mlp_layer_types from first_k_dense_replace.
absl::Status DeriveGlm5Fields(const Json& j, ModelConfig* c) {
  c->head_dim = c->qk_rope_head_dim;
  c->partial_rotary_factor = 1.0;
  const int64_t layers = c->num_hidden_layers;
  if (c->indexer_types.empty() && layers > 0 && layers <= (int64_t{1} << 20)) {
    auto pattern = j.find("index_topk_pattern");
    if (pattern != j.end() && pattern->is_string()) {
      for (char ch : pattern->get<std::string>()) {
        if (ch != 'F' && ch != 'S') {
          return FieldError("index_topk_pattern", "expected only 'F' (full) and 'S' (shared)");
        }
        c->indexer_types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else if (pattern != j.end() && !pattern->is_null()) {
      RETURN_IF_ERROR(ReadField(j, "index_topk_pattern", &c->indexer_types));
    } else {
      int64_t freq = 1, offset = 2;
      RETURN_IF_ERROR(ReadInt(j, "index_topk_freq", &freq));
      RETURN_IF_ERROR(ReadInt(j, "index_skip_topk_offset", &offset));
      freq = std::max<int64_t>(freq, 1);
      for (int64_t i = 0; i < layers; ++i) {
        const bool full = std::max<int64_t>(i - offset + 1, 0) % freq == 0;
        c->indexer_types.push_back(full ? "full" : "shared");
      }
    }
  }
  if (c->mlp_layer_types.empty() && layers > 0 && layers <= (int64_t{1} << 20)) {
    const int64_t dense = std::min(c->first_k_dense_replace, layers);
    for (int64_t i = 0; i < layers; ++i)
      c->mlp_layer_types.push_back(i < dense ? "dense" : "sparse");
  }
  return absl::OkStatus();
}

// The per-layer lists: one entry per layer, each one of two words.
absl::Status CheckLayerList(const char* field, const std::vector<std::string>& list, int64_t layers,
                            const char* a, const char* b) {
  if (static_cast<int64_t>(list.size()) != layers) {
    return FieldError(field, absl::StrCat("has ", list.size(), " entries for ", layers, " layers"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] != a && list[i] != b) {
      return FieldError(
          field, absl::StrCat("entry ", i, " is '", list[i], "', not '", a, "' or '", b, "'"));
    }
  }
  return absl::OkStatus();
}

// GlmMoeDsaConfig's defaults (the released GLM-5 shape; rope_theta and eos_token_id as the
// library's, the per-layer lists derived after parsing).
ModelConfig Glm5Defaults() {
  ModelConfig c;
  c.model_type = kGlm5Type;
  c.vocab_size = 154880;
  c.hidden_size = 6144;
  c.num_hidden_layers = 78;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 64;
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 2048;
  c.n_routed_experts = 256;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 3;
  c.max_position_embeddings = 202752;
  c.rope_theta = 10000.0;
  c.eos_token_ids = {1};
  c.num_nextn_predict_layers = 0;
  return c;  // the MLA fields' ModelConfig defaults are GlmMoeDsaConfig's
}

absl::Status ValidateGlm5(const ModelConfig& c) {
  RETURN_IF_ERROR(
      CheckLayerList("indexer_types", c.indexer_types, c.num_hidden_layers, "full", "shared"));
  if (c.indexer_types[0] != "full") {
    return FieldError("indexer_types",
                      "layer 0 is 'shared' but a shared layer reuses the previous full layer's "
                      "top-k, and there is none");
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return FieldError("qk_rope_head_dim", absl::StrCat("must be even, got ", c.qk_rope_head_dim));
  }
  if (c.head_dim != c.qk_rope_head_dim) {
    return FieldError("head_dim", absl::StrCat("must equal qk_rope_head_dim ", c.qk_rope_head_dim,
                                               " for glm_moe_dsa, got ", c.head_dim));
  }
  if (c.index_head_dim < c.qk_rope_head_dim) {
    return FieldError(
        "index_head_dim",
        absl::StrCat(c.index_head_dim, " is narrower than its rotary part ", c.qk_rope_head_dim));
  }
  if (c.attention_bias) {
    return absl::UnimplementedError(
        "config field 'attention_bias': biased MLA projections are not supported (GLM-5 has "
        "none)");
  }
  // Bound the cache row and the per-head matrices before anything sizes buffers from them.
  constexpr int64_t kMaxWidth = int64_t{1} << 16;
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"q_lora_rank", c.q_lora_rank},
                                    {"kv_lora_rank", c.kv_lora_rank},
                                    {"qk_nope_head_dim", c.qk_nope_head_dim},
                                    {"qk_rope_head_dim", c.qk_rope_head_dim},
                                    {"v_head_dim", c.v_head_dim},
                                    {"index_n_heads", c.index_n_heads},
                                    {"index_head_dim", c.index_head_dim}}) {
    if (value > kMaxWidth) return FieldError(name, absl::StrCat(value, " is over ", kMaxWidth));
  }
  return absl::OkStatus();
}

// RoPE fields may also sit in a rope_parameters / rope_scaling object, which then wins over
// the legacy top-level value. Only the default (unscaled) rope type is what GLM-4.5 uses; any
// other type is refused rather than silently computed wrong.
absl::Status ReadRopeObjects(const Json& j, ModelConfig* c) {
  for (const char* name : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return FieldError(name, "expected an object");
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (!ReadString(*it, key, &type).ok()) {
        return FieldError(absl::StrCat(name, ".", key), "expected a string");
      }
    }
    if (type != "default") {
      return absl::UnimplementedError(absl::StrCat("config field '", name, ".rope_type': '", type,
                                                   "' is not supported (only 'default')"));
    }
    absl::Status status;
    ForEachConfigField(*c, [&](const ConfigField& f, auto& member) {
      if (!f.rope || !status.ok()) return;
      if (!ReadField(*it, f.key(), &member).ok()) {
        status = FieldError(absl::StrCat(name, ".", f.key()), "expected a number");
      }
    });
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseConfigJson(absl::string_view json_text) {
  Json j = Json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");

  ModelConfig c;
  RETURN_IF_ERROR(ReadModelType(j, &c));
  // Absent fields take the architecture's own library defaults.
  if (c.is_mla()) c = Glm5Defaults();
  absl::Status status;
  ForEachConfigField(c, [&](const ConfigField& f, auto& member) {
    if (status.ok() && std::string_view(f.name) != "model_type") {
      status = ReadField(j, f.key(), &member);
    }
  });
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(ReadRopeObjects(j, &c));
  if (c.is_mla()) RETURN_IF_ERROR(DeriveGlm5Fields(j, &c));

  if (c.head_dim == 0 && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return FieldError("head_dim",
                        "absent, and hidden_size is not divisible by num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

absl::StatusOr<ModelConfig> LoadConfigFile(const std::string& path) {
  // Real configs are a few KiB; the bound keeps a hostile file from being read whole.
  ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxConfigBytes));
  absl::StatusOr<ModelConfig> c = ParseConfigJson(text);
  if (!c.ok())
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

namespace {

// A number's bound, for ValidateConfig's walk over the field list (other types have none).
template <class T>
absl::Status CheckBound(const ConfigField& f, const T& value) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (f.bound == ConfigField::Bound::kPositive && !(value > 0)) {
      return FieldError(f.key(), absl::StrCat("must be positive, got ", value));
    }
    if (f.bound == ConfigField::Bound::kNonNegative && !(value >= 0)) {
      return FieldError(f.key(), absl::StrCat("must not be negative, got ", value));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const ModelConfig& c) {
  absl::Status status;
  ForEachConfigField(c, [&](const ConfigField& f, const auto& member) {
    if (status.ok()) status = CheckBound(f, member);
  });
  RETURN_IF_ERROR(status);
  // GLM-5's own rules first: its rotary width is qk_rope_head_dim, named as such.
  if (c.is_mla()) RETURN_IF_ERROR(ValidateGlm5(c));
  // The rules that relate fields to each other.
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat(c.num_attention_heads, " attention heads are not divisible by ",
                                   c.num_key_value_heads, " kv heads"));
  }
  if (!(c.partial_rotary_factor <= 1.0)) {
    return FieldError("partial_rotary_factor",
                      absl::StrCat("must be in (0, 1], got ", c.partial_rotary_factor));
  }
  if (c.rotary_dim() % 2 != 0 || c.rotary_dim() == 0) {
    return FieldError("partial_rotary_factor",
                      absl::StrCat("gives rotary width ", c.rotary_dim(), " of head_dim ",
                                   c.head_dim, "; it must be even and positive"));
  }
  // The router's per-row limits (core/model/row_math.h), the same on every backend.
  if (c.n_routed_experts > rowmath::kMaxExperts) {
    return FieldError("n_routed_experts", absl::StrCat(c.n_routed_experts, " is over the limit of ",
                                                       rowmath::kMaxExperts));
  }
  if (c.num_experts_per_tok > rowmath::kMaxTopK) {
    return FieldError(
        "num_experts_per_tok",
        absl::StrCat(c.num_experts_per_tok, " is over the limit of ", rowmath::kMaxTopK));
  }
  if (c.n_group > rowmath::kMaxGroups) {
    return FieldError("n_group",
                      absl::StrCat(c.n_group, " is over the limit of ", rowmath::kMaxGroups));
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat(c.num_experts_per_tok, " is larger than n_routed_experts ",
                                   c.n_routed_experts));
  }
  if (c.n_routed_experts % c.n_group != 0) {
    return FieldError(
        "n_group",
        absl::StrCat(c.n_routed_experts, " experts are not divisible into ", c.n_group, " groups"));
  }
  if (c.topk_group > c.n_group) {
    return FieldError("topk_group",
                      absl::StrCat(c.topk_group, " is larger than n_group ", c.n_group));
  }
  // A group's score is the sum of its two best experts, so groups need at least two (HF
  // would fail the same way); with one group the group step is a no-op.
  if (c.n_group > 1 && c.n_routed_experts / c.n_group < 2) {
    return FieldError("n_group", "each expert group needs at least two experts");
  }
  // Experts outside the kept groups can never be chosen, so the kept groups must hold at
  // least num_experts_per_tok experts (otherwise the reference picks among -inf ties).
  if (c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok) {
    return FieldError("topk_group", absl::StrCat(c.topk_group, " of ", c.n_group,
                                                 " groups hold fewer experts than "
                                                 "num_experts_per_tok ",
                                                 c.num_experts_per_tok));
  }
  if (!c.mlp_layer_types.empty()) {
    RETURN_IF_ERROR(CheckLayerList("mlp_layer_types", c.mlp_layer_types, c.num_hidden_layers,
                                   "dense", "sparse"));
  }
  if (!c.is_mla() && c.model_type != kGlm45Type) {
    return FieldError("model_type", absl::StrCat("'", c.model_type, "' is neither '", kGlm45Type,
                                                 "' nor '", kGlm5Type, "'"));
  }
  if (!c.is_mla() && !c.indexer_types.empty()) {
    return FieldError("indexer_types", "is a glm_moe_dsa field; this is a glm4_moe config");
  }
  if (c.hidden_act != "silu") {
    return FieldError("hidden_act", absl::StrCat("'", c.hidden_act, "' is not supported (silu)"));
  }
  for (int32_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return FieldError("eos_token_id", absl::StrCat(id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

namespace {

ModelConfig Glm45() {
  ModelConfig c;
  c.hidden_size = 5120;
  c.num_hidden_layers = 92;
  c.num_attention_heads = 96;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.partial_rotary_factor = 0.5;
  c.rope_theta = 1e6;
  c.use_qk_norm = true;
  c.attention_bias = true;
  c.intermediate_size = 12288;
  c.moe_intermediate_size = 1536;
  c.n_routed_experts = 160;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 8;
  c.routed_scaling_factor = 2.5;
  c.first_k_dense_replace = 3;
  c.num_nextn_predict_layers = 1;
  c.eos_token_ids = {151329, 151336, 151338};
  c.pad_token_id = 151329;
  return c;
}

ModelConfig Glm45Air() {
  ModelConfig c = Glm45();
  c.hidden_size = 4096;
  c.num_hidden_layers = 46;
  c.use_qk_norm = false;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.n_routed_experts = 128;
  c.routed_scaling_factor = 1.0;
  c.first_k_dense_replace = 1;
  return c;
}

// GLM-4.5's architecture (QK-norm, attention bias, partial RoPE, GQA, a dense first layer,
// sigmoid-routed experts with a shared one) and its real vocabulary, at a width a laptop CPU
// serves interactively.
ModelConfig Glm45Mini() {
  ModelConfig c = Glm45();
  c.hidden_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  c.moe_intermediate_size = 256;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 8192;
  return c;
}

// A test shape: every feature on, everything small.
ModelConfig Tiny() {
  ModelConfig c = Glm45();
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_group = 2;
  c.topk_group = 1;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 1024;
  c.eos_token_ids = {255};
  c.pad_token_id = 255;
  return c;
}

// GLM-5 (GlmMoeDsaForCausalLM, 744B-A40B): GlmMoeDsaConfig's defaults are the released
// shape; rope_theta and the end tokens are from released GLM-5.x config.json files (a
// checkpoint's own config.json always wins; docs/glm5.md).
ModelConfig Glm5() {
  ModelConfig c = Glm5Defaults();
  c.rope_theta = 8e6;
  c.num_nextn_predict_layers = 1;
  c.eos_token_ids = {154820, 154827, 154829};
  c.q_lora_rank = 2048;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.head_dim = c.qk_rope_head_dim;
  c.partial_rotary_factor = 1.0;
  c.indexer_types.assign(78, "full");  // index_topk_freq 1: every layer runs its indexer
  for (int i = 0; i < 78; ++i) c.mlp_layer_types.push_back(i < 3 ? "dense" : "sparse");
  return c;
}

// A GLM-5 test shape: dense and MoE layers, full and shared indexer layers, index_topk 8 so
// that short contexts already exercise the sparse selection.
ModelConfig TinyGlm5() {
  ModelConfig c = Glm5();
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 1024;
  c.rope_theta = 10000.0;
  c.eos_token_ids = {255};
  c.pad_token_id = 255;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 8;
  c.head_dim = c.qk_rope_head_dim;
  c.indexer_types = {"full", "shared", "full", "shared"};
  c.mlp_layer_types = {"dense", "sparse", "sparse", "sparse"};
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};
constexpr Preset kPresets[] = {
    {"glm-4.5", Glm45},
    {"glm-4.5-air", Glm45Air},
    {"glm-4.5-mini", Glm45Mini},
    {"tiny", Tiny},
    {"glm-5", Glm5},
    {"tiny-glm5", TinyGlm5},
    // The FP8 releases' shapes are the bf16 ones; PresetIsFp8 makes their weights e4m3.
    {"glm-4.5-fp8", Glm45},
    {"glm-4.5-air-fp8", Glm45Air},
    {"tiny-fp8", Tiny},
    {"glm-5-fp8", Glm5},
    {"tiny-glm5-fp8", TinyGlm5},
};

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

bool PresetIsFp8(absl::string_view spec) {
  const absl::string_view name = spec.substr(0, spec.find(':'));
  return absl::EndsWith(name, "-fp8");
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets) {
    if (parts[0] == p.name) preset = &p;
  }
  if (preset == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown preset '", parts[0],
                                            "'; known: ", absl::StrJoin(PresetNames(), ", ")));
  }
  ModelConfig c = preset->make();
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(parts[i], '=');
    int64_t value = 0;
    if (kv.first == "layers" && absl::SimpleAtoi(kv.second, &value)) {
      if (value <= 0 || value > c.num_hidden_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "preset option layers=", kv.second, " must be in [1, ", c.num_hidden_layers, "]"));
      }
      c.num_hidden_layers = value;
      // The per-layer lists keep their first N entries, as the layers do.
      if (!c.indexer_types.empty()) c.indexer_types.resize(value);
      if (!c.mlp_layer_types.empty()) c.mlp_layer_types.resize(value);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown preset option '", parts[i], "' (known: layers=N)"));
    }
  }
  RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

std::string DescribeConfig(const ModelConfig& c) {
  if (c.is_mla()) {
    int64_t dense = 0, full = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      dense += c.is_moe_layer(l) ? 0 : 1;
      full += c.has_indexer(l) ? 1 : 0;
    }
    return absl::StrCat(
        "glm_moe_dsa: hidden ", c.hidden_size, ", ", c.num_hidden_layers, " layers (", dense,
        " dense, ", full, " with a DSA indexer), ", c.num_attention_heads, " heads, MLA q_lora ",
        c.q_lora_rank, " kv_lora ", c.kv_lora_rank, " qk ", c.qk_nope_head_dim, "+",
        c.qk_rope_head_dim, " v ", c.v_head_dim, ", indexer ", c.index_n_heads, "x",
        c.index_head_dim, " top-", c.index_topk, ", ", c.n_routed_experts, " experts top-",
        c.num_experts_per_tok, " + ", c.n_shared_experts, " shared, vocab ", c.vocab_size);
  }
  return absl::StrCat(
      "hidden ", c.hidden_size, ", ", c.num_hidden_layers, " layers (", c.first_k_dense_replace,
      " dense), ", c.num_attention_heads, " heads / ", c.num_key_value_heads, " kv heads x ",
      c.head_dim, " (rotary ", c.rotary_dim(), "), ", c.n_routed_experts, " experts top-",
      c.num_experts_per_tok, " + ", c.n_shared_experts, " shared, vocab ", c.vocab_size,
      c.use_qk_norm ? ", qk-norm" : "", c.attention_bias ? ", qkv bias" : "");
}

rowmath::RouterRowParams RouterParamsOf(const ModelConfig& c) {
  rowmath::RouterRowParams p;
  p.n_experts = static_cast<int>(c.n_routed_experts);
  p.top_k = static_cast<int>(c.num_experts_per_tok);
  p.n_group = static_cast<int>(c.n_group);
  p.topk_group = static_cast<int>(c.topk_group);
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return p;
}

}  // namespace glmserve
