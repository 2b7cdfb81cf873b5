// What one forward step of a model reads and computes, for the benchmarks' roofline
// fractions (bench/cpu_bench.cc, bench/batch_bench.cc).
#pragma once

#include <cstdint>

#include "core/weights.h"

namespace glmserve::bench {

struct StepCost {
  double weight_bytes = 0;  // weights read by one step
  double kv_bytes = 0;      // KV cache read by one step
  double flops = 0;         // multiply-adds x 2
};

// What one step reads and computes: every matrix is read once per step (the batch shares
// it), each token multiplies the dense matrices and its top-k experts.
inline StepCost Cost(const ModelWeights& w, int64_t tokens, int64_t context_after,
                     int64_t distinct_experts) {
  const ModelConfig& c = w.config;
  StepCost cost;
  auto mat = [&](const Matrix& m, double rows_used_fraction = 1.0) {
    cost.weight_bytes += m.bytes() * rows_used_fraction;
  };
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* m : {&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj}) {
      mat(*m);
      cost.flops += 2.0 * tokens * m->rows * m->cols;
    }
    const FfnWeights* ffns[] = {&l.dense};
    if (l.is_moe) {
      mat(l.moe.router);
      cost.flops += 2.0 * tokens * l.moe.router.rows * l.moe.router.cols;
      const FfnWeights& e = l.moe.experts[0];
      const double expert_bytes = e.gate.bytes() + e.up.bytes() + e.down.bytes();
      cost.weight_bytes += expert_bytes * distinct_experts;
      cost.flops += 2.0 * tokens * c.num_experts_per_tok * 3 * e.gate.rows * e.gate.cols;
      ffns[0] = &l.moe.shared;
    }
    for (const Matrix* m : {&ffns[0]->gate, &ffns[0]->up, &ffns[0]->down}) {
      mat(*m);
      cost.flops += 2.0 * tokens * m->rows * m->cols;
    }
    // Attention reads every cached key and value of the context once per step.
    cost.kv_bytes += 2.0 * context_after * c.kv_dim() * sizeof(float);
    cost.flops += 4.0 * tokens * (context_after - tokens / 2.0) * c.q_dim();
  }
  mat(w.lm_head);
  cost.flops += 2.0 * w.lm_head.rows * w.lm_head.cols;  // logits of one row per sequence
  return cost;
}

}  // namespace glmserve::bench
