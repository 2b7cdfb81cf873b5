#include "core/weight_layout.h"

#include "absl/strings/str_cat.h"

namespace glmserve {

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

void PrepareWeights(const ModelConfig& config, int64_t begin, int64_t end, ModelWeights* w) {
  w->config = config;
  w->layer_begin = begin;
  w->layer_end = end;
  w->layers.assign(static_cast<size_t>(end - begin), LayerWeights{});
  for (int64_t l = begin; l < end; ++l) {
    LayerWeights& layer = w->layers[static_cast<size_t>(l - begin)];
    layer.layer_index = l;
    layer.is_moe = config.is_moe_layer(l);
    if (layer.is_moe) layer.moe.experts.assign(static_cast<size_t>(config.n_routed_experts), {});
  }
}

namespace {

void AddFfn(const std::string& prefix, int64_t width, int64_t hidden, int64_t layer, FfnWeights* f,
            std::vector<WeightSlot>* slots) {
  slots->push_back(
      {prefix + "gate_proj.weight", {width, hidden}, &f->gate, nullptr, ParamInit::kNormal, layer});
  slots->push_back(
      {prefix + "up_proj.weight", {width, hidden}, &f->up, nullptr, ParamInit::kNormal, layer});
  slots->push_back(
      {prefix + "down_proj.weight", {hidden, width}, &f->down, nullptr, ParamInit::kNormal, layer});
}

}  // namespace

std::vector<WeightSlot> ListWeightSlots(ModelWeights* w) {
  const ModelConfig& c = w->config;
  const int64_t hidden = c.hidden_size;
  const bool has_head = w->layer_end == c.num_hidden_layers;
  std::vector<WeightSlot> slots;
  auto matrix = [&](std::string name, int64_t rows, int64_t cols, Matrix* m, int64_t layer) {
    slots.push_back({std::move(name), {rows, cols}, m, nullptr, ParamInit::kNormal, layer});
  };
  auto vec = [&](std::string name, int64_t n, std::vector<float>* v, ParamInit init,
                 int64_t layer) {
    slots.push_back({std::move(name), {n}, nullptr, v, init, layer});
  };

  if (w->layer_begin == 0) {
    matrix("model.embed_tokens.weight", c.vocab_size, hidden, &w->embed_tokens, -1);
  } else if (has_head && c.tie_word_embeddings && !w->head_stored_despite_tie) {
    // The tied head needs the embedding matrix even though this span does not embed.
    matrix("model.embed_tokens.weight", c.vocab_size, hidden, &w->lm_head, -1);
  }

  for (LayerWeights& layer : w->layers) {
    const int64_t l = layer.layer_index;
    const std::string p = LayerPrefix(l);
    vec(p + "input_layernorm.weight", hidden, &layer.input_norm, ParamInit::kOnes, l);
    vec(p + "post_attention_layernorm.weight", hidden, &layer.post_attention_norm, ParamInit::kOnes,
        l);
    AttentionWeights& a = layer.attn;
    const std::string ap = p + "self_attn.";
    matrix(ap + "q_proj.weight", c.q_dim(), hidden, &a.q_proj, l);
    matrix(ap + "k_proj.weight", c.kv_dim(), hidden, &a.k_proj, l);
    matrix(ap + "v_proj.weight", c.kv_dim(), hidden, &a.v_proj, l);
    matrix(ap + "o_proj.weight", hidden, c.q_dim(), &a.o_proj, l);
    if (c.attention_bias) {
      vec(ap + "q_proj.bias", c.q_dim(), &a.q_bias, ParamInit::kZeros, l);
      vec(ap + "k_proj.bias", c.kv_dim(), &a.k_bias, ParamInit::kZeros, l);
      vec(ap + "v_proj.bias", c.kv_dim(), &a.v_bias, ParamInit::kZeros, l);
    }
    if (c.use_qk_norm) {
      vec(ap + "q_norm.weight", c.head_dim, &a.q_norm, ParamInit::kOnes, l);
      vec(ap + "k_norm.weight", c.head_dim, &a.k_norm, ParamInit::kOnes, l);
    }
    const std::string mp = p + "mlp.";
    if (!layer.is_moe) {
      AddFfn(mp, c.intermediate_size, hidden, l, &layer.dense, &slots);
      continue;
    }
    MoeWeights& moe = layer.moe;
    matrix(mp + "gate.weight", c.n_routed_experts, hidden, &moe.router, l);
    vec(mp + "gate.e_score_correction_bias", c.n_routed_experts, &moe.router_bias,
        ParamInit::kZeros, l);
    const int64_t width = c.moe_intermediate_size;
    for (int64_t e = 0; e < static_cast<int64_t>(moe.experts.size()); ++e) {
      FfnWeights& f = moe.experts[static_cast<size_t>(e)];
      const std::string ep = absl::StrCat(mp, "experts.", e, ".");
      slots.push_back({ep + "gate_proj.weight",
                       {width, hidden},
                       &f.gate,
                       nullptr,
                       ParamInit::kNormal,
                       l,
                       e,
                       ExpertPart::kGate});
      slots.push_back({ep + "up_proj.weight",
                       {width, hidden},
                       &f.up,
                       nullptr,
                       ParamInit::kNormal,
                       l,
                       e,
                       ExpertPart::kUp});
      slots.push_back({ep + "down_proj.weight",
                       {hidden, width},
                       &f.down,
                       nullptr,
                       ParamInit::kNormal,
                       l,
                       e,
                       ExpertPart::kDown});
    }
    if (c.n_shared_experts > 0) {
      AddFfn(mp + "shared_experts.", c.shared_intermediate_size(), hidden, l, &moe.shared, &slots);
    }
  }

  if (has_head) {
    vec("model.norm.weight", hidden, &w->final_norm, ParamInit::kOnes, -1);
    if (!c.tie_word_embeddings || w->head_stored_despite_tie) {
      matrix("lm_head.weight", c.vocab_size, hidden, &w->lm_head, -1);
    }
  }
  return slots;
}

void FinishWeights(ModelWeights* w) {
  const ModelConfig& c = w->config;
  if (c.tie_word_embeddings && w->layer_end == c.num_hidden_layers && w->layer_begin == 0 &&
      !w->head_stored_despite_tie) {
    w->lm_head = w->embed_tokens;
  }
  if (!w->layers.empty()) {
    w->weight_dtype = w->layers.front().attn.q_proj.dtype;
  } else if (w->has_embedding()) {
    w->weight_dtype = w->embed_tokens.dtype;
  }
}

}  // namespace glmserve
