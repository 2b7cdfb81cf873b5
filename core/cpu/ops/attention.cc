#include "core/cpu/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/parallel.h"
#include "core/cpu/ops/attention_simd.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"
#include "core/model/kv_fp8.h"

namespace glmserve {
namespace internal {

void AttentionScoresGeneric(const AttentionRows& rows, const float* q, float scale, float* scores) {
  for (int64_t p = 0; p < rows.context; ++p) {
    scores[p] = LaneDot(q, rows.Key(p), rows.head_dim) * scale;
  }
}

void AttentionWeightedSumGeneric(const AttentionRows& rows, const float* probs, float* out) {
  std::fill_n(out, rows.head_dim, 0.f);
  for (int64_t p = 0; p < rows.context; ++p) {
    const float w = probs[p];
    const float* v = rows.Value(p);
    for (int64_t d = 0; d < rows.head_dim; ++d) out[d] += w * v[d];
  }
}

}  // namespace internal

void WriteKv(const float* k, const float* v, absl::Span<const SequenceSlice> batch, int64_t layer,
             KvCache* cache) {
  const int64_t bs = cache->shape().block_size, dim = cache->kv_dim();
  int64_t row = 0;
  for (const SequenceSlice& s : batch) {
    for (int64_t t = 0; t < s.num_tokens; ++t, ++row) {
      const int64_t pos = s.start_position + t;
      const int32_t block = (*s.blocks)[pos / bs];
      const int64_t slot = pos % bs;
      if (cache->host_fp8()) {  // codes and one scale per KV head, from this row alone
        const int64_t heads = cache->shape().kv_heads, hd = cache->shape().head_dim;
        EncodeKvRow(k + row * dim, heads, hd, cache->codes(layer, block, 0) + slot * dim,
                    cache->scales(layer, block, 0) + slot * heads);
        EncodeKvRow(v + row * dim, heads, hd, cache->codes(layer, block, 1) + slot * dim,
                    cache->scales(layer, block, 1) + slot * heads);
        continue;
      }
      std::copy_n(k + row * dim, dim, cache->keys(layer, block) + slot * dim);
      std::copy_n(v + row * dim, dim, cache->values(layer, block) + slot * dim);
    }
  }
}

void PagedAttention(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                    int64_t layer, int64_t heads, float scale, float* out) {
  const int64_t bs = cache.shape().block_size;
  const int64_t head_dim = cache.shape().head_dim;
  const int64_t kv_heads = cache.shape().kv_heads;
  const int64_t kv_dim = kv_heads * head_dim;
  const int64_t group = heads / kv_heads;

  // Flatten (token, head) work items so that one long prompt and many decodes both spread
  // over all threads. token_seq[t] and token_pos[t] locate each batch row.
  std::vector<int32_t> token_seq;
  std::vector<int64_t> token_pos;
  int64_t max_context = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t t = 0; t < batch[i].num_tokens; ++t) {
      token_seq.push_back(static_cast<int32_t>(i));
      token_pos.push_back(batch[i].start_position + t);
    }
    max_context = std::max(max_context, batch[i].start_position + batch[i].num_tokens);
  }
  const int64_t total = static_cast<int64_t>(token_seq.size());

  if (cache.host_fp8()) {
    // The FP8 cache (core/model/kv_fp8.h): one work item per (token, KV head) decodes each attended
    // key and value row once to fp32 (e4m3 x its scale) and serves the `group` query heads
    // that share it. Every head's scores, softmax and weighted sum are the fp32 path's below,
    // in the same order, on the decoded rows: as batch-invariant as that path.
    ParallelFor(total * kv_heads, 1, [&](int64_t item_begin, int64_t item_end) {
      thread_local std::vector<float> probs, row;
      probs.resize(group * max_context);  // [group, context]
      row.resize(head_dim);               // one decoded K or V head row
      for (int64_t item = item_begin; item < item_end; ++item) {
        const int64_t t = item / kv_heads, kv_head = item % kv_heads;
        const SequenceSlice& s = batch[token_seq[t]];
        const int64_t context = token_pos[t] + 1;  // causal: positions 0..pos
        const int64_t h0 = kv_head * group;        // first query head of the group
        const auto decode = [&](int64_t p, int kind) {
          const int32_t block = (*s.blocks)[p / bs];
          const int64_t slot = p % bs;
          DecodeKvHead(cache.codes(layer, block, kind) + slot * kv_dim + kv_head * head_dim,
                       cache.scales(layer, block, kind)[slot * kv_heads + kv_head], head_dim,
                       row.data());
        };
        for (int64_t p = 0; p < context; ++p) {
          decode(p, 0);
          for (int64_t j = 0; j < group; ++j) {
            const float* qv = q + (t * heads + h0 + j) * head_dim;
            probs[j * max_context + p] = LaneDot(qv, row.data(), head_dim) * scale;
          }
        }
        for (int64_t j = 0; j < group; ++j) {
          SoftmaxInPlace(probs.data() + j * max_context, context);
          std::fill_n(out + (t * heads + h0 + j) * head_dim, head_dim, 0.f);
        }
        for (int64_t p = 0; p < context; ++p) {
          decode(p, 1);
          for (int64_t j = 0; j < group; ++j) {
            const float w = probs[j * max_context + p];
            float* o = out + (t * heads + h0 + j) * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) o[d] += w * row[d];
          }
        }
      }
    });
    return;
  }

  // The scores and the weighted sum in the portable code, on AVX-512 or on AVX2: the same bits.
  const bool avx512 = internal::CpuHasAvx512(), avx2 = internal::CpuHasAvx2Fma();
  const auto scores_fn = avx512 ? internal::AttentionScoresAvx512
                         : avx2 ? internal::AttentionScoresAvx2
                                : internal::AttentionScoresGeneric;
  const auto sum_fn = avx512 ? internal::AttentionWeightedSumAvx512
                      : avx2 ? internal::AttentionWeightedSumAvx2
                             : internal::AttentionWeightedSumGeneric;
  ParallelFor(total * heads, 4, [&](int64_t item_begin, int64_t item_end) {
    thread_local std::vector<float> probs;
    probs.resize(max_context);
    for (int64_t item = item_begin; item < item_end; ++item) {
      const int64_t t = item / heads, h = item % heads;
      const internal::AttentionRows rows{.cache = &cache,
                                         .blocks = batch[token_seq[t]].blocks,
                                         .layer = layer,
                                         .kv_off = (h / group) * head_dim,
                                         .kv_dim = kv_dim,
                                         .block_size = bs,
                                         .head_dim = head_dim,
                                         .context = token_pos[t] + 1};  // causal: 0..pos
      scores_fn(rows, q + (t * heads + h) * head_dim, scale, probs.data());
      SoftmaxInPlace(probs.data(), rows.context);
      sum_fn(rows, probs.data(), out + (t * heads + h) * head_dim);
    }
  });
}

}  // namespace glmserve
