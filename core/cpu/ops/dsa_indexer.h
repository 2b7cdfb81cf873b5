// The DSA "lightning indexer" of GLM-5 (DeepSeek Sparse Attention): picks, for every query
// token, the index_topk key positions its layer's MLA attends to (core/cpu/ops/mla.h).
//
// With x [T, hidden] the layer's normed input and q_resid [T, Q] = q_a_layernorm(q_a_proj x):
//
//   iq[t]   = RoPE_interleaved(first dr dims of each head of  wq_b q_resid[t])   [Hi, Di]
//   ik[p]   = RoPE_interleaved(first dr dims of  LayerNorm(wk x[p]))            [Di]
//             (LayerNorm with gain and bias, eps 1e-6; ik is kept in the latent cache row)
//   w[t]    = weights_proj x[t] * Hi^-0.5                                       [Hi]
//   s[t, p] = sum_h w[t, h] * relu(iq[t, h] . ik[p] * Di^-0.5)                  fp32
//
// Query t at position pos keeps the index_topk largest s[t, p] over p <= pos, or every
// p <= pos when there are at most index_topk of them. The reference (torch.topk) breaks ties
// at the k-th place in an unspecified order; here the lower position wins, so the choice is
// deterministic (docs/glm5.md). "shared" layers run no indexer: they reuse the selection of
// the previous "full" layer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/cpu/ops/mla.h"
#include "core/cpu/ops/rope.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"
#include "core/model/weights.h"

namespace glmserve {

// Computes iq [T, Hi, Di], ik [T, Di] and w [T, Hi] for the new tokens (x: [T, hidden],
// q_resid: [T, Q]). `rope` is the layer's RotaryEmbedding over dr dims.
void IndexerProject(const float* x, const float* q_resid, int64_t tokens, const IndexerWeights& w,
                    const IndexerShape& shape, const RotaryEmbedding& rope,
                    const int32_t* positions, float* iq, float* ik, float* weights);

// The selection of every new token against the keys in the cache (the new tokens' ik must
// already be written: WriteLatentRows). iq, weights as from IndexerProject.
void IndexerSelect(const float* iq, const float* weights, absl::Span<const SequenceSlice> batch,
                   const KvCache& cache, int64_t layer, const MlaShape& mla,
                   const IndexerShape& shape, TopkSelection* out);

// The k largest of scores[0, n) (k < n), ties to the lower index, returned ascending.
std::vector<int32_t> TopkPositions(const float* scores, int64_t n, int64_t k);

}  // namespace glmserve
