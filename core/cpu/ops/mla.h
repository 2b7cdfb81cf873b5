// Multi-head latent attention (MLA, GLM-5 / DeepSeek) over the paged LATENT KV cache, for a
// ragged batch, restricted per query to the DSA indexer's selection (core/cpu/ops/dsa_indexer.h).
//
// The cache keeps, per token slot and layer, one row (KvCacheShape::latent):
//
//   row = [ latent (R = kv_lora_rank, after kv_a_layernorm) | k_rot (dr, after RoPE)
//           | index key (Di, after LayerNorm and RoPE; full indexer layers only) ]
//
// Per-head keys and values are never stored. With W = kv_b_proj [H * (dn + dv), R] and per
// head h its rows W_uk[h] [dn, R] (key no-position part) and W_uv[h] [dv, R] (value), the
// reference computes, per key position p,
//
//   k[h, p] = [ W_uk[h] latent[p] | k_rot[p] ],   v[h, p] = W_uv[h] latent[p]
//   out[h]  = sum_p softmax_p( (q_nope[h] . W_uk[h] latent[p] + q_rot[h] . k_rot[p]) * scale )
//             * W_uv[h] latent[p]
//
// and by associativity the same numbers come from the ABSORBED form used here, for prefill
// and decode alike:
//
//   q_lat[h]   = W_uk[h]^T q_nope[h]                         [R]   (AbsorbQuery)
//   score[h,p] = (q_lat[h] . latent[p] + q_rot[h] . k_rot[p]) * scale
//   o_lat[h]   = sum_p softmax_p(score[h, p]) latent[p]       [R]   (LatentAttention)
//   out[h]     = W_uv[h] o_lat[h]                             [dv]  (ExpandValues)
//
// Only the rounding differs from the expanded form (tests/core/cpu/ops/mla_test.cc measures it);
// every token takes the same path, so a token's result does not depend on its batch, its chunk or
// whether it is decoded.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"
#include "core/model/mla_shape.h"
#include "core/model/weights.h"

namespace glmserve {

// Which key positions each query attends to: all causal positions, or a sorted list.
struct TopkSelection {
  std::vector<int32_t> count;      // [T]: selected positions of token t; -1: every p <= pos
  std::vector<int64_t> offset;     // [T]: where token t's list starts in `positions`
  std::vector<int32_t> positions;  // concatenated lists, each ascending
};

// Stores the new tokens' latent [T, R], k_rot [T, dr] and (when index_key is not null)
// index key [T, Di] into their rows of `layer`.
void WriteLatentRows(const float* latent, const float* k_rot, const float* index_key,
                     absl::Span<const SequenceSlice> batch, const MlaShape& shape, int64_t layer,
                     KvCache* cache);

// W_uk[h]^T for every head, [H, R, dn] in kv_b_proj's own dtype, so that AbsorbQuery is one
// Linear per head. Built once per layer; transposing copies values, so it is exact (and for
// bf16 weights half the size of an fp32 copy: 12.6 MB per GLM-5 layer). An FP8 kv_b_proj
// (kFp8Scaled) is widened to fp32 instead, each element e4m3 x its block's scale, the value
// the FP8 kernels use: exact too, 25.2 MB per GLM-5 layer (1.97 GB for all 78).
struct AbsorbedKey {
  DType dtype = DType::kF32;
  std::vector<char> bytes;                              // [H, R, dn] elements of dtype
  Matrix Head(int64_t h, const MlaShape& shape) const;  // [R, dn]
};
AbsorbedKey AbsorbedKeyWeights(const Matrix& kv_b_proj, const MlaShape& shape);

// q: [T, H, dn + dr] (q_b_proj output, rotary part already rotated); absorbed: from
// AbsorbedKeyWeights. Writes q_lat [H, T, R].
void AbsorbQuery(const float* q, int64_t tokens, const AbsorbedKey& absorbed, const MlaShape& shape,
                 float* q_lat);

// Softmax attention of every (token, head) over its selected positions of its own sequence.
// q_lat: [H, T, R]; q: [T, H, dn + dr] (its rotary part is read); out_lat: [H, T, R].
// Scores, softmax and the weighted sum are fp32, positions in ascending order.
void LatentAttention(const float* q_lat, const float* q, absl::Span<const SequenceSlice> batch,
                     const KvCache& cache, int64_t layer, const TopkSelection& selection,
                     const MlaShape& shape, float* out_lat);

// out[t, h, :] = W_uv[h] out_lat[h, t, :]: out [T, H * dv], ready for o_proj.
void ExpandValues(const float* out_lat, int64_t tokens, const Matrix& kv_b_proj,
                  const MlaShape& shape, float* out);

}  // namespace glmserve
