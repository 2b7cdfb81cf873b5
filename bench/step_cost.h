// What one forward step of a model reads and computes, for the benchmarks' roofline
// fractions (bench/cpu_bench.cc, bench/batch_bench.cc).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/model/weights.h"

namespace glmserve::bench {

struct StepCost {
  double weight_bytes = 0;  // weights read by one step
  double kv_bytes = 0;      // KV cache read by one step
  double flops = 0;         // multiply-adds x 2
};

// GLM-5's attention (docs/glm5.md): its projections (the indexer's on full layers), the
// absorbed W_uk^T copy, and per token the latent rows of min(context, index_topk)
// positions (scores over R + dr values, a weighted sum of R) plus the indexer's scores over
// the whole context; every latent row of the context is read once.
inline void AddMlaCost(const MlaWeights& m, const ModelConfig& c, int64_t tokens,
                       int64_t context_after, double kv_element_bytes, StepCost* cost) {
  for (const Matrix* x : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.o_proj,
                          &m.indexer.wq_b, &m.indexer.wk, &m.indexer.weights_proj}) {
    cost->weight_bytes += x->bytes();
    cost->flops += 2.0 * tokens * x->rows * x->cols;
  }
  const double heads = c.num_attention_heads, r = c.kv_lora_rank;
  cost->weight_bytes += heads * r * c.qk_nope_head_dim * DTypeSize(m.kv_b_proj.dtype);
  const double ctx = context_after - tokens / 2.0;  // mean causal context of the step's tokens
  const double attended = std::min<double>(ctx, c.index_topk);
  cost->kv_bytes +=
      static_cast<double>(context_after) * c.cache_values_per_token_layer() * kv_element_bytes;
  cost->flops += 2.0 * tokens * heads * attended * (2 * r + c.qk_rope_head_dim);
  if (!m.indexer.empty()) cost->flops += 2.0 * tokens * ctx * c.index_n_heads * c.index_head_dim;
}

// What one step reads and computes: every matrix is read once per step (the batch shares
// it), each token multiplies the dense matrices and its top-k experts. `out_rows` rows leave
// the step (one per sequence: its logits row): the last layer runs attention (GQA), o_proj and
// the FFN on those alone (CpuModel::Forward), and the head multiplies only them. The cache holds
// kv_element_bytes per value (fp32: 4; the CPU's bf16 cache: 2).
inline StepCost Cost(const ModelWeights& w, int64_t tokens, int64_t context_after,
                     int64_t distinct_experts, int64_t out_rows, double kv_element_bytes = 4) {
  const ModelConfig& c = w.config;
  StepCost cost;
  auto mat = [&](const Matrix& m, double rows_used_fraction = 1.0) {
    cost.weight_bytes += m.bytes() * rows_used_fraction;
  };
  for (const LayerWeights& l : w.layers) {
    const bool last = &l == &w.layers.back();
    const int64_t ffn_tokens = last ? out_rows : tokens;
    if (c.is_mla()) {
      AddMlaCost(l.mla, c, tokens, context_after, kv_element_bytes, &cost);
      if (last) cost.flops -= 2.0 * (tokens - out_rows) * l.mla.o_proj.rows * l.mla.o_proj.cols;
    } else {
      for (const Matrix* m : {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) {
        mat(*m);
        cost.flops += 2.0 * (m == &l.attn.o_proj ? ffn_tokens : tokens) * m->rows * m->cols;
      }
      // Attention reads every cached key and value of the context once per step. The last
      // layer attends from the rows that leave the step alone (the context's last rows, each
      // over all of it: CpuModel::Forward).
      cost.kv_bytes += 2.0 * context_after * c.kv_dim() * kv_element_bytes;
      cost.flops += last && out_rows < tokens
                        ? 4.0 * out_rows * context_after * c.q_dim()
                        : 4.0 * tokens * (context_after - tokens / 2.0) * c.q_dim();
    }
    const FfnWeights* ffns[] = {&l.dense};
    if (l.is_moe) {
      mat(l.moe.router);
      cost.flops += 2.0 * ffn_tokens * l.moe.router.rows * l.moe.router.cols;
      const FfnWeights& e = l.moe.experts[0];
      const double expert_bytes = e.gate.bytes() + e.up.bytes() + e.down.bytes();
      const int64_t distinct =
          last ? std::min<int64_t>(distinct_experts, out_rows * c.num_experts_per_tok)
               : distinct_experts;
      cost.weight_bytes += expert_bytes * distinct;
      cost.flops += 2.0 * ffn_tokens * c.num_experts_per_tok * 3 * e.gate.rows * e.gate.cols;
      ffns[0] = &l.moe.shared;
    }
    for (const Matrix* m : {&ffns[0]->gate, &ffns[0]->up, &ffns[0]->down}) {
      mat(*m);
      cost.flops += 2.0 * ffn_tokens * m->rows * m->cols;
    }
  }
  mat(w.lm_head);
  cost.flops += 2.0 * out_rows * w.lm_head.rows * w.lm_head.cols;
  return cost;
}

}  // namespace glmserve::bench
