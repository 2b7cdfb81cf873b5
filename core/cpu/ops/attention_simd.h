// The two inner loops of PagedAttention's fp32 path, per (token, query head), in a portable
// form (attention.cc) and AVX-512 and AVX2 ones (attention_avx512.cc, attention_avx2.cc) that
// give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve::internal {

// Where one query head's keys and values lie: positions [0, context) of a sequence's blocks,
// head_dim values each, at kv_off within a cache row of layer `layer`.
struct AttentionRows {
  const KvCache* cache;
  const BlockTable* blocks;
  int64_t layer, kv_off, kv_dim, block_size, head_dim, context;
  const float* Key(int64_t p) const {
    return cache->keys(layer, (*blocks)[p / block_size]) + (p % block_size) * kv_dim + kv_off;
  }
  const float* Value(int64_t p) const {
    return cache->values(layer, (*blocks)[p / block_size]) + (p % block_size) * kv_dim + kv_off;
  }
};

// scores[p] = LaneDot<8>(q, key p, head_dim) * scale, p < context.
void AttentionScoresGeneric(const AttentionRows& rows, const float* q, float scale, float* scores);
void AttentionScoresAvx512(const AttentionRows& rows, const float* q, float scale, float* scores);
void AttentionScoresAvx2(const AttentionRows& rows, const float* q, float scale, float* scores);
// out[d] = sum over p in order of probs[p] * value p [d], from +0, d < head_dim.
void AttentionWeightedSumGeneric(const AttentionRows& rows, const float* probs, float* out);
void AttentionWeightedSumAvx512(const AttentionRows& rows, const float* probs, float* out);
void AttentionWeightedSumAvx2(const AttentionRows& rows, const float* probs, float* out);

}  // namespace glmserve::internal
