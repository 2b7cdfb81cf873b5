// The mixture-of-experts FFN: sigmoid router with a selection-only correction bias,
// group-limited top-k, normalised and scaled weights, routed experts plus a shared expert.
#pragma once

#include <cstdint>

#include "core/cpu/ops/linear.h"
#include "core/model/config.h"
#include "core/model/row_math.h"
#include "core/model/weights.h"

namespace glmserve {

// The router's parameters: one field list for both backends (core/model/row_math.h), made
// from the config by RouterParamsOf (core/model/config.h).
using RouterParams = rowmath::RouterRowParams;

// For each token: s = sigmoid(logits); c = s + correction_bias; keep the topk_group groups
// with the best sum of their two largest c (experts of the other groups are masked to -inf,
// as Transformers 5.x does: never chosen, even when kept experts score below 0); choose the top_k
// experts by c (ties: lower index); weights are the chosen s, divided by (their sum + 1e-20) if
// norm_topk_prob, times routed_scaling_factor. logits: [tokens, n_experts]; experts, weights:
// [tokens, top_k], experts ascending by score rank (best first).
void RouteTokens(const float* logits, int64_t tokens, const float* correction_bias,
                 const RouterParams& p, int32_t* experts, float* weights);

// y = sum_k w_k Expert_k(x) + Shared(x), routed sum accumulated in fp32 in ascending expert
// order (independent of the other tokens in the batch). x, y: [tokens, hidden].
// math: the experts' arithmetic (core/cpu/ops/linear.h); the router is always exact fp32, as the
// reference computes it in fp32 even in its bf16 forward. choices, when not null
// ([tokens, top_k]), receives RouteTokens' experts.
void MoeFfn(const float* x, int64_t tokens, const MoeWeights& w, const RouterParams& p, float* y,
            CpuMath math = CpuMath::kExact, int32_t* choices = nullptr);

}  // namespace glmserve
