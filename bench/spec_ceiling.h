// The most speculative decoding with the MTP layer can gain at batch 1 when a step is bound by
// reading the weights (docs/mtp.md, "The ceiling where a step reads its weights"): a model
// config's bytes split into what every step reads whatever its tokens (attention, dense FFNs,
// shared experts, routers, head) and its routed experts, of which a step of T tokens reads the
// distinct ones its tokens chose. Counted from the config alone, through the one tensor list
// the loader walks (core/model/weight_layout.h), so the 355B and 744B shapes cost nothing.
//
// Routing is taken as independent and uniform across a step's tokens. A trained router is near
// that: glm-4.5-kjv's consecutive tokens choose 6.65 distinct experts of 16 per pair where
// independence gives 7.00 (bench/moe_routing_bench; docs/mtp.md). The MTP layer is charged one
// pass of one token per draft, the least the engine's chained drafting can cost.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/weight_layout.h"
#include "core/model/weights.h"

namespace glmserve::bench {

struct ModelReads {
  // Bytes per element of the matrices (2: bf16); the ratios below do not depend on it, except
  // through the fp32 KV cache term.
  double element_bytes = 2;
  double total = 0;        // every parameter of the checkpoint, MTP layer included (elements)
  double mtp_total = 0;    // the MTP layer's own parameters, its routed experts included
  double head = 0;         // the LM head (the embedding when tied), part of every_step
  double every_step = 0;   // elements every step of the model reads (the embedding's row aside)
  double expert = 0;       // elements of one routed expert (gate, up and down)
  int64_t moe_layers = 0;  // of the model (the MTP layer counted apart)
  int64_t experts = 0;     // routed experts per MoE layer
  int64_t top_k = 0;
  double mtp_every_pass = 0;  // elements an MTP pass reads besides its routed experts
  bool mtp_moe = false;
  double kv_per_position_layer = 0;  // bytes of one cached position in one layer (fp32 cache)
  int64_t layers = 0;

  // Elements of the parameters a one-token step of the model multiplies, the head included (the
  // published "active" counts leave out the embedding and the head).
  double Active() const { return every_step + moe_layers * top_k * expert; }
};

inline ModelReads ReadsOf(const ModelConfig& c) {
  ModelWeights w;
  PrepareWeights(c, 0, c.num_hidden_layers, &w);
  if (c.num_nextn_predict_layers > 0) PrepareMtp(&w);
  ModelReads r;
  r.experts = c.n_routed_experts;
  r.top_k = c.num_experts_per_tok;
  r.layers = c.num_hidden_layers;
  r.mtp_moe = w.mtp.has_value() && MtpLayerIsMoe(c);
  r.kv_per_position_layer = 4.0 * c.cache_values_per_token_layer();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) r.moe_layers += c.is_moe_layer(l) ? 1 : 0;
  int64_t expert_layer = -1;
  for (const WeightSlot& slot : ListWeightSlots(&w)) {
    double n = 1;
    for (const int64_t d : slot.shape) n *= static_cast<double>(d);
    r.total += n;
    const bool mtp = slot.layer == c.num_hidden_layers;
    if (mtp) r.mtp_total += n;
    if (slot.name == "model.embed_tokens.weight") {
      if (!c.tie_word_embeddings) continue;  // a row gather
      r.head = n;                            // else the head reads it whole
      r.every_step += n;
      continue;
    }
    if (slot.name == "lm_head.weight") r.head = n;
    if (slot.expert >= 0) {  // a routed expert's matrix: charged per chosen expert below
      if (expert_layer < 0) expert_layer = slot.layer;
      if (slot.expert == 0 && slot.layer == expert_layer) r.expert += n;  // one expert's size
      continue;
    }
    (mtp ? r.mtp_every_pass : r.every_step) += n;
  }
  // The MTP layer's head is the model's unless it stores shared_head.head (then a slot above).
  if (w.mtp.has_value() && !w.mtp_head_stored) r.mtp_every_pass += r.head;
  return r;
}

// Expected distinct experts per MoE layer that `tokens` independently, uniformly routed tokens
// choose (each picks top_k of `experts` without repeats).
inline double DistinctExperts(int64_t experts, int64_t top_k, int64_t tokens) {
  if (experts <= 0) return 0;
  const double miss = 1.0 - static_cast<double>(top_k) / static_cast<double>(experts);
  return static_cast<double>(experts) * (1.0 - std::pow(miss, static_cast<double>(tokens)));
}

// Bytes a step of `tokens` new tokens of one sequence reads after `context` cached positions
// (every cached key and value read once, as a step that shares them among its tokens does).
inline double StepBytes(const ModelReads& r, int64_t tokens, int64_t context) {
  const double experts = r.moe_layers * DistinctExperts(r.experts, r.top_k, tokens) * r.expert;
  return (r.every_step + experts) * r.element_bytes +
         r.kv_per_position_layer * r.layers * static_cast<double>(context);
}

// Bytes of one MTP pass of one token (its layer's own cache: context positions of one layer).
inline double MtpPassBytes(const ModelReads& r, int64_t context) {
  const double experts = r.mtp_moe ? r.top_k * r.expert : 0.0;
  return (r.mtp_every_pass + experts) * r.element_bytes +
         r.kv_per_position_layer * static_cast<double>(context);
}

// Time per output token without drafts over time per output token with k drafts, when a step
// takes its bytes' reading time and a verify step yields `accept_len` tokens (at most k + 1).
inline double CeilingSpeedup(const ModelReads& r, int k, double accept_len, int64_t context) {
  return accept_len * StepBytes(r, 1, context) /
         (StepBytes(r, k + 1, context) + k * MtpPassBytes(r, context));
}

}  // namespace glmserve::bench
