// Causal grouped-query attention over the paged KV cache, for a ragged batch.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve {

// Stores the new tokens' keys and values ([total_tokens, kv_heads * head_dim] each, rows in
// batch order) into their slots of `layer` (an FP8 cache: encoded, core/model/kv_fp8.h).
void WriteKv(const float* k, const float* v, absl::Span<const SequenceSlice> batch, int64_t layer,
             KvCache* cache);

// out[t, h, :] = softmax(q[t, h] . K^T * scale) V over the positions <= t's position of t's
// own sequence, with K, V of kv head h / (heads / kv_heads) (from an FP8 cache: its rows
// decoded to fp32, core/model/kv_fp8.h; from a bf16 cache: widened, exactly, so the bits are
// those of an fp32 cache holding the rounded values). Scores, softmax and the
// weighted sum are fp32 (the bf16 modes on bf16 weights take their own: attention_bf16.h,
// attention_amx.h). q: [total_tokens, heads, head_dim]; out: same shape.
void PagedAttention(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                    int64_t layer, int64_t heads, float scale, float* out);

}  // namespace glmserve
