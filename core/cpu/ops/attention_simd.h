// The two inner loops of PagedAttention's fp32 path, per (token, query head), in a portable
// form (attention.cc) and AVX-512 and AVX2 ones (attention_avx512.cc, attention_avx2.cc) that
// give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cpu/ops/attention_items.h"
#include "core/model/forward_types.h"
#include "core/model/kv_cache.h"

namespace glmserve::internal {

// Where one query head's keys and values lie: positions [begin, context) of a sequence's blocks,
// head_dim values each, at kv_off within a cache row of layer `layer`; consecutive positions'
// rows lie kv_dim floats apart.
struct AttentionRows {
  const KvCache* cache;
  const BlockTable* blocks;
  int64_t layer, kv_off, kv_dim, block_size, head_dim, context;
  int64_t begin = 0;
  // Set when this head's rows of positions [packed_begin, context) were copied contiguously
  // (PagedAttention packs a position block's keys, then its values, for the rows that share
  // them; kv_dim is then head_dim): the loops read them there, whichever kind they read.
  const float* packed = nullptr;
  int64_t packed_begin = 0;
  // Where set, the AVX-512 multi-row loops prefetch from it as they go (the next block's rows).
  LinesAhead* ahead = nullptr;
  // f(p, row) for p = begin .. context - 1 in order, row the key (or value) row of position p:
  // one block lookup per block of positions, not a division per position (a 64-bit division
  // per position held the decode loops to its latency). T: the cache's element, float (the
  // fp32 cache, or `packed`) or uint16_t (the bf16 cache's bits, KvCache::bf16_rows).
  template <typename T = float, typename F>
  void ForEach(bool values, F&& f) const {
    ForEachRun<T>(values, [&f, this](int64_t p, const T* row, int64_t count) {
      for (int64_t i = 0; i < count; ++i, row += kv_dim) f(p + i, row);
    });
  }
  // f(p, row, count) for each run of consecutive positions p .. p + count - 1 in one block
  // (their rows kv_dim apart from `row`), in order.
  template <typename T = float, typename F>
  void ForEachRun(bool values, F&& f) const {
    if constexpr (std::is_same_v<T, float>) {
      if (packed != nullptr) {
        if (begin < context) f(begin, packed + (begin - packed_begin) * kv_dim, context - begin);
        return;
      }
    }
    for (int64_t p = begin; p < context;) {
      const int64_t block = p / block_size, end = std::min(context, (block + 1) * block_size);
      f(p, Rows<T>(values, (*blocks)[block]) + (p % block_size) * kv_dim + kv_off, end - p);
      p = end;
    }
  }

 private:
  template <typename T>
  const T* Rows(bool values, int32_t id) const {
    if constexpr (std::is_same_v<T, float>) {
      return values ? cache->values(layer, id) : cache->keys(layer, id);
    } else {
      static_assert(std::is_same_v<T, uint16_t>);
      return cache->bf16_rows(layer, id, values ? 1 : 0);
    }
  }
};

// The cached rows a two-pass attention packs after `rows`' block [.., p1) of an item whose rows
// read positions [0, item_context): the pass's next block, after the keys' last block the
// values' first, after the values' last none. Into `ahead`, for the loops to prefetch.
inline void PlanRowsAhead(const AttentionRows& rows, bool values, int64_t p1, int64_t item_context,
                          RowsAhead* ahead) {
  ahead->Clear();
  AttentionRows next = rows;
  next.packed = nullptr;
  next.begin = p1;
  if (p1 >= item_context) {
    if (values) return;
    values = true;
    next.begin = 0;
  }
  next.context = std::min(item_context, next.begin + kPositionBlock);
  if (rows.cache->host_bf16()) {
    next.ForEach<uint16_t>(values, [&](int64_t, const uint16_t* row) {
      ahead->Add(row, static_cast<int64_t>(sizeof(uint16_t)) * rows.head_dim);
    });
  } else {
    next.ForEach<float>(values, [&](int64_t, const float* row) {
      ahead->Add(row, static_cast<int64_t>(sizeof(float)) * rows.head_dim);
    });
  }
}

// scores[p] = LaneDot<8>(q, key p, head_dim) * scale, begin <= p < context.
void AttentionScoresGeneric(const AttentionRows& rows, const float* q, float scale, float* scores);
void AttentionScoresAvx512(const AttentionRows& rows, const float* q, float scale, float* scores);
void AttentionScoresAvx2(const AttentionRows& rows, const float* q, float scale, float* scores);
// out[d] += probs[p] * value p [d] for p = begin, begin + 1, ..., context - 1 in turn (one
// rounding for the product, one for the sum), d < head_dim. A row's whole weighted sum starts
// from out = +0 and may be taken in consecutive ranges of p: the same bits.
void AttentionWeightedSumGeneric(const AttentionRows& rows, const float* probs, float* out);
void AttentionWeightedSumAvx512(const AttentionRows& rows, const float* probs, float* out);
void AttentionWeightedSumAvx2(const AttentionRows& rows, const float* probs, float* out);
// The same loops for n rows that read the same positions (`rows`; PagedAttention's rows of one
// position block): q[r] / probs[r] and scores[r] / out[r] as above for each r < n, each row's
// bits a lone row's. The AVX-512 forms load each key and value vector once for several rows,
// packed or in place in the cache (then prefetching `rows.ahead`'s lines as they go); a head
// dim off the 8-lane grid goes row by row.
void AttentionScoresRowsAvx512(const AttentionRows& rows, int64_t n, const float* const* q,
                               float scale, float* const* scores);
void AttentionWeightedSumRowsAvx512(const AttentionRows& rows, int64_t n, const float* const* probs,
                                    float* const* out);

}  // namespace glmserve::internal
