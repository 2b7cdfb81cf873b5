#include "core/model/weight_layout.h"

#include <tuple>

#include "absl/strings/str_cat.h"

namespace glmserve {

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

namespace {

void PrepareLayer(const ModelConfig& config, int64_t l, bool is_moe, LayerWeights* layer) {
  layer->layer_index = l;
  layer->is_moe = is_moe;
  if (is_moe) layer->moe.experts.assign(static_cast<size_t>(config.n_routed_experts), {});
}

}  // namespace

void PrepareWeights(const ModelConfig& config, int64_t begin, int64_t end, ModelWeights* w) {
  w->config = config;
  w->layer_begin = begin;
  w->layer_end = end;
  w->layers.assign(static_cast<size_t>(end - begin), LayerWeights{});
  for (int64_t l = begin; l < end; ++l) {
    PrepareLayer(config, l, config.is_moe_layer(l), &w->layers[static_cast<size_t>(l - begin)]);
  }
  w->mtp.reset();
}

bool MtpLayerIsMoe(const ModelConfig& config) {
  // mlp_layer_types lists the main layers only; the MTP layer is sparse in every released GLM
  // model (vLLM and SGLang build it with MoE too). Without the list, first_k_dense_replace's
  // rule extends to it.
  const int64_t n = config.num_hidden_layers;
  if (static_cast<int64_t>(config.mlp_layer_types.size()) > n) {
    return config.mlp_layer_types[static_cast<size_t>(n)] == "sparse";
  }
  if (!config.mlp_layer_types.empty()) return config.n_routed_experts > 0;
  return n >= config.first_k_dense_replace;
}

void PrepareMtp(ModelWeights* w) {
  const ModelConfig& c = w->config;
  w->mtp.emplace();
  PrepareLayer(c, c.num_hidden_layers, MtpLayerIsMoe(c), &w->mtp->layer);
}

namespace {

void AddFfn(const std::string& prefix, int64_t width, int64_t hidden, int64_t layer, FfnWeights* f,
            std::vector<WeightSlot>* slots) {
  for (const auto& [name, m, rows, cols] :
       {std::tuple{"gate_proj.weight", &f->gate, width, hidden},
        std::tuple{"up_proj.weight", &f->up, width, hidden},
        std::tuple{"down_proj.weight", &f->down, hidden, width}}) {
    WeightSlot slot{prefix + name, {rows, cols}, m, nullptr, ParamInit::kNormal, layer};
    slot.linear = true;
    slots->push_back(std::move(slot));
  }
}

// GLM-5's latent attention and, on "full" layers, its DSA indexer (docs/glm5.md).
void AddMla(const ModelConfig& c, const std::string& ap, int64_t l, bool indexer, MlaWeights* m,
            std::vector<WeightSlot>* slots) {
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;
  auto matrix = [&](const char* name, int64_t rows, int64_t cols, Matrix* out) {
    slots->push_back({ap + name, {rows, cols}, out, nullptr, ParamInit::kNormal, l});
  };
  auto vec = [&](const char* name, int64_t n, std::vector<float>* out, ParamInit init) {
    slots->push_back({ap + name, {n}, nullptr, out, init, l});
  };
  matrix("q_a_proj.weight", c.q_lora_rank, hidden, &m->q_a_proj);
  vec("q_a_layernorm.weight", c.q_lora_rank, &m->q_a_norm, ParamInit::kOnes);
  matrix("q_b_proj.weight", heads * c.qk_head_dim(), c.q_lora_rank, &m->q_b_proj);
  matrix("kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, hidden, &m->kv_a_proj);
  vec("kv_a_layernorm.weight", c.kv_lora_rank, &m->kv_a_norm, ParamInit::kOnes);
  matrix("kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
         &m->kv_b_proj);
  matrix("o_proj.weight", hidden, heads * c.v_head_dim, &m->o_proj);
  if (!indexer) return;
  IndexerWeights& x = m->indexer;
  matrix("indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank, &x.wq_b);
  matrix("indexer.wk.weight", c.index_head_dim, hidden, &x.wk);
  vec("indexer.k_norm.weight", c.index_head_dim, &x.k_norm, ParamInit::kOnes);
  vec("indexer.k_norm.bias", c.index_head_dim, &x.k_norm_bias, ParamInit::kZeros);
  matrix("indexer.weights_proj.weight", c.index_n_heads, hidden, &x.weights_proj);
}

// Appends slots to a list: a 2-D weight (kept in its stored dtype; `linear`: quantization at
// load converts it) or a 1-D parameter (widened to fp32).
struct SlotAppender {
  std::vector<WeightSlot>* slots;
  void matrix(std::string name, int64_t rows, int64_t cols, Matrix* m, int64_t layer,
              bool linear = false) const {
    slots->push_back({std::move(name), {rows, cols}, m, nullptr, ParamInit::kNormal, layer});
    slots->back().linear = linear;
  }
  void vec(std::string name, int64_t n, std::vector<float>* v, ParamInit init,
           int64_t layer) const {
    slots->push_back({std::move(name), {n}, nullptr, v, init, layer});
  }
};

// One decoder layer's tensors (a main layer, or the MTP layer's decoder part).
void AddLayer(const ModelConfig& c, LayerWeights* layer_ptr, std::vector<WeightSlot>* out) {
  LayerWeights& layer = *layer_ptr;
  std::vector<WeightSlot>& slots = *out;
  const int64_t hidden = c.hidden_size;
  const SlotAppender add{&slots};
  const int64_t l = layer.layer_index;
  const std::string p = LayerPrefix(l);
  add.vec(p + "input_layernorm.weight", hidden, &layer.input_norm, ParamInit::kOnes, l);
  add.vec(p + "post_attention_layernorm.weight", hidden, &layer.post_attention_norm,
          ParamInit::kOnes, l);
  if (c.is_mla()) {
    AddMla(c, p + "self_attn.", l, c.has_indexer(l), &layer.mla, &slots);
  } else {
    AttentionWeights& a = layer.attn;
    const std::string ap = p + "self_attn.";
    add.matrix(ap + "q_proj.weight", c.q_dim(), hidden, &a.q_proj, l, true);
    add.matrix(ap + "k_proj.weight", c.kv_dim(), hidden, &a.k_proj, l, true);
    add.matrix(ap + "v_proj.weight", c.kv_dim(), hidden, &a.v_proj, l, true);
    add.matrix(ap + "o_proj.weight", hidden, c.q_dim(), &a.o_proj, l, true);
    if (c.attention_bias) {
      add.vec(ap + "q_proj.bias", c.q_dim(), &a.q_bias, ParamInit::kZeros, l);
      add.vec(ap + "k_proj.bias", c.kv_dim(), &a.k_bias, ParamInit::kZeros, l);
      add.vec(ap + "v_proj.bias", c.kv_dim(), &a.v_bias, ParamInit::kZeros, l);
    }
    if (c.use_qk_norm) {
      add.vec(ap + "q_norm.weight", c.head_dim, &a.q_norm, ParamInit::kOnes, l);
      add.vec(ap + "k_norm.weight", c.head_dim, &a.k_norm, ParamInit::kOnes, l);
    }
  }
  const std::string mp = p + "mlp.";
  if (!layer.is_moe) {
    AddFfn(mp, c.intermediate_size, hidden, l, &layer.dense, &slots);
    return;
  }
  MoeWeights& moe = layer.moe;
  add.matrix(mp + "gate.weight", c.n_routed_experts, hidden, &moe.router, l);
  add.vec(mp + "gate.e_score_correction_bias", c.n_routed_experts, &moe.router_bias,
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
                     ExpertPart::kGate,
                     /*linear=*/true});
    slots.push_back({ep + "up_proj.weight",
                     {width, hidden},
                     &f.up,
                     nullptr,
                     ParamInit::kNormal,
                     l,
                     e,
                     ExpertPart::kUp,
                     /*linear=*/true});
    slots.push_back({ep + "down_proj.weight",
                     {hidden, width},
                     &f.down,
                     nullptr,
                     ParamInit::kNormal,
                     l,
                     e,
                     ExpertPart::kDown,
                     /*linear=*/true});
  }
  if (c.n_shared_experts > 0) {
    AddFfn(mp + "shared_experts.", c.shared_intermediate_size(), hidden, l, &moe.shared, &slots);
  }
}

}  // namespace

std::vector<WeightSlot> ListWeightSlots(ModelWeights* w) {
  const ModelConfig& c = w->config;
  const int64_t hidden = c.hidden_size;
  const bool has_head = w->layer_end == c.num_hidden_layers;
  std::vector<WeightSlot> slots;
  const SlotAppender add{&slots};

  if (w->layer_begin == 0) {
    add.matrix("model.embed_tokens.weight", c.vocab_size, hidden, &w->embed_tokens, -1);
  } else if (has_head && c.tie_word_embeddings && !w->head_stored_despite_tie) {
    // The tied head needs the embedding matrix even though this span does not embed.
    add.matrix("model.embed_tokens.weight", c.vocab_size, hidden, &w->lm_head, -1, /*linear=*/true);
  }

  for (LayerWeights& layer : w->layers) AddLayer(c, &layer, &slots);

  if (has_head) {
    add.vec("model.norm.weight", hidden, &w->final_norm, ParamInit::kOnes, -1);
    if (!c.tie_word_embeddings || w->head_stored_despite_tie) {
      add.matrix("lm_head.weight", c.vocab_size, hidden, &w->lm_head, -1, true);
    }
  }
  if (w->mtp) {
    // The MTP layer (docs/mtp.md): its decoder layer, then what joins it to the model;
    // shared_head.head is optional (else the model's lm_head).
    MtpWeights& m = *w->mtp;
    const int64_t l = c.num_hidden_layers;
    const std::string p = LayerPrefix(l);
    AddLayer(c, &m.layer, &slots);
    add.vec(p + "enorm.weight", hidden, &m.enorm, ParamInit::kOnes, l);
    add.vec(p + "hnorm.weight", hidden, &m.hnorm, ParamInit::kOnes, l);
    add.matrix(p + "eh_proj.weight", hidden, 2 * hidden, &m.eh_proj, l, /*linear=*/true);
    add.vec(p + "shared_head.norm.weight", hidden, &m.head_norm, ParamInit::kOnes, l);
    if (w->mtp_head_stored) {
      add.matrix(p + "shared_head.head.weight", c.vocab_size, hidden, &m.head, l, /*linear=*/true);
    }
  }
  return slots;
}

void FinishWeights(ModelWeights* w) {
  const ModelConfig& c = w->config;
  if (w->mtp && !w->mtp_head_stored) w->mtp->head = w->lm_head;
  if (c.tie_word_embeddings && w->layer_end == c.num_hidden_layers && w->layer_begin == 0 &&
      !w->head_stored_despite_tie) {
    w->lm_head = w->embed_tokens;
  }
  if (!w->layers.empty()) {
    const LayerWeights& first = w->layers.front();
    w->weight_dtype = c.is_mla() ? first.mla.q_a_proj.dtype : first.attn.q_proj.dtype;
  } else if (w->has_embedding()) {
    w->weight_dtype = w->embed_tokens.dtype;
  }
}

}  // namespace glmserve
