// The FP8 KV cache's codec (docs/kv_cache.md): one token's key (or value) row of the GQA cache
// as e4m3 codes plus one fp32 scale per KV head, computed from that row's own values.
//
// Why per token and per head: the scale of a cached row then depends only on the values
// written into it, never on other requests, the batch, the chunking or what was cached
// before, so a token's logits stay bit-identical whatever the batch (the determinism
// contract), and a prefix-cache hit reads exactly what a recompute would write.
//
//   scale[h]      = amax[h] / 448, amax[h] = max |x[h, d]| over the head's finite values
//                   (1 when the head is all zeros; never below FLT_MIN, so x / scale is finite)
//   code[h, d]    = e4m3(x[h, d] / scale[h])   round to nearest even, saturating at +-448
//   decoded[h, d] = e4m3_value(code[h, d]) * scale[h]   (one fp32 rounding)
//
// NaN inputs stay NaN (code 0x7f: the model already failed, and the cache does not hide it);
// +-inf saturates to +-448 x scale of the finite values (scale ignores it).
#pragma once

#include <cstdint>

namespace glmserve {

// x: [heads, head_dim] fp32. Writes codes [heads, head_dim] and scales [heads].
void EncodeKvRow(const float* x, int64_t heads, int64_t head_dim, uint8_t* codes, float* scales);

// One head of a row: codes [head_dim] and its scale to out [head_dim] fp32.
void DecodeKvHead(const uint8_t* codes, float scale, int64_t head_dim, float* out);

}  // namespace glmserve
