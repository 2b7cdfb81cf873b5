#include "core/model/weights.h"

namespace glmserve {
namespace {

int64_t VectorBytes(const std::vector<float>& v) {
  return static_cast<int64_t>(v.size() * sizeof(float));
}

int64_t FfnBytes(const FfnWeights& f) { return f.gate.bytes() + f.up.bytes() + f.down.bytes(); }

}  // namespace

int64_t ModelWeights::ParameterBytes() const {
  int64_t total = embed_tokens.bytes() + VectorBytes(final_norm);
  // A tied head is a view of the embedding: its bytes are already counted (when this span has
  // the embedding) or counted here once (a tail span that only needs it for the head).
  if (lm_head.data != embed_tokens.data) total += lm_head.bytes();
  for (const LayerWeights& l : layers) {
    total += VectorBytes(l.input_norm) + VectorBytes(l.post_attention_norm);
    const AttentionWeights& a = l.attn;
    total += a.q_proj.bytes() + a.k_proj.bytes() + a.v_proj.bytes() + a.o_proj.bytes();
    for (const std::vector<float>* v : {&a.q_bias, &a.k_bias, &a.v_bias, &a.q_norm, &a.k_norm}) {
      total += VectorBytes(*v);
    }
    const MlaWeights& m = l.mla;
    for (const Matrix* x : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj,
                            &m.indexer.wq_b, &m.indexer.wk, &m.indexer.weights_proj}) {
      total += x->bytes();
    }
    for (const std::vector<float>* v :
         {&m.q_a_norm, &m.kv_a_norm, &m.indexer.k_norm, &m.indexer.k_norm_bias}) {
      total += VectorBytes(*v);
    }
    if (l.is_moe) {
      total += l.moe.router.bytes() + VectorBytes(l.moe.router_bias) + FfnBytes(l.moe.shared);
      for (const FfnWeights& e : l.moe.experts) total += FfnBytes(e);
    } else {
      total += FfnBytes(l.dense);
    }
  }
  return total;
}

std::vector<Matrix*> ModelWeights::LinearMatrices() {
  std::vector<Matrix*> matrices;
  auto add = [&](Matrix* m) {
    if (!m->empty()) matrices.push_back(m);
  };
  for (LayerWeights& l : layers) {
    for (Matrix* m : {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) add(m);
    std::vector<FfnWeights*> ffns;
    if (l.is_moe) {
      for (FfnWeights& e : l.moe.experts) ffns.push_back(&e);
      if (l.moe.has_shared()) ffns.push_back(&l.moe.shared);
    } else {
      ffns.push_back(&l.dense);
    }
    for (FfnWeights* f : ffns) {
      for (Matrix* m : {&f->gate, &f->up, &f->down}) add(m);
    }
  }
  if (has_head() && lm_head.data != embed_tokens.data) add(&lm_head);
  return matrices;
}

}  // namespace glmserve
