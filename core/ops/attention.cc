#include "core/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kv_fp8.h"
#include "core/ops/lane_sum.h"
#include "core/ops/softmax.h"
#include "core/parallel.h"

namespace glmserve {

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

  // The FP8 cache (core/kv_fp8.h): each attended head row is decoded to fp32 (e4m3 x its
  // scale) into `row` and then used exactly as an fp32 row, in the same order; the result is
  // the fp32 path's on the decoded values, so it is as batch-invariant as that path.
  const bool fp8 = cache.host_fp8();
  const auto key_row = [&](const SequenceSlice& s, int64_t p, int64_t kv_head, float* row) {
    const int32_t block = (*s.blocks)[p / bs];
    if (!fp8) return cache.keys(layer, block) + (p % bs) * kv_dim + kv_head * head_dim;
    DecodeKvHead(cache.codes(layer, block, 0) + (p % bs) * kv_dim + kv_head * head_dim,
                 cache.scales(layer, block, 0)[(p % bs) * kv_heads + kv_head], head_dim, row);
    return static_cast<const float*>(row);
  };
  const auto value_row = [&](const SequenceSlice& s, int64_t p, int64_t kv_head, float* row) {
    const int32_t block = (*s.blocks)[p / bs];
    if (!fp8) return cache.values(layer, block) + (p % bs) * kv_dim + kv_head * head_dim;
    DecodeKvHead(cache.codes(layer, block, 1) + (p % bs) * kv_dim + kv_head * head_dim,
                 cache.scales(layer, block, 1)[(p % bs) * kv_heads + kv_head], head_dim, row);
    return static_cast<const float*>(row);
  };

  ParallelFor(total * heads, 4, [&](int64_t item_begin, int64_t item_end) {
    thread_local std::vector<float> probs, row;
    probs.resize(max_context);
    row.resize(head_dim);
    for (int64_t item = item_begin; item < item_end; ++item) {
      const int64_t t = item / heads, h = item % heads;
      const SequenceSlice& s = batch[token_seq[t]];
      const int64_t context = token_pos[t] + 1;  // causal: positions 0..pos
      const int64_t kv_head = h / group;
      const float* qv = q + (t * heads + h) * head_dim;

      for (int64_t p = 0; p < context; ++p) {
        probs[p] = LaneDot(qv, key_row(s, p, kv_head, row.data()), head_dim) * scale;
      }
      SoftmaxInPlace(probs.data(), context);
      float* o = out + (t * heads + h) * head_dim;
      std::fill_n(o, head_dim, 0.f);
      for (int64_t p = 0; p < context; ++p) {
        const float w = probs[p];
        const float* vv = value_row(s, p, kv_head, row.data());
        for (int64_t d = 0; d < head_dim; ++d) o[d] += w * vv[d];
      }
    }
  });
}

}  // namespace glmserve
