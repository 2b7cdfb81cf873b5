#include "core/cpu/ops/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/base/parallel.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/norm.h"

namespace glmserve {

void IndexerProject(const float* x, const float* q_resid, int64_t tokens, const IndexerWeights& w,
                    const IndexerShape& shape, const RotaryEmbedding& rope,
                    const int32_t* positions, float* iq, float* ik, float* weights) {
  const LinearJob jobs[] = {{q_resid, tokens, &w.wq_b, nullptr, iq},
                            {x, tokens, &w.wk, nullptr, ik},
                            {x, tokens, &w.weights_proj, nullptr, weights}};
  LinearMany(jobs);
  // nn.LayerNorm(index_head_dim, eps=1e-6): the eps is fixed in the reference, not a config field.
  LayerNorm(ik, w.k_norm.data(), w.k_norm_bias.data(), tokens, shape.head_dim, 1e-6f, ik);
  rope.ApplyInterleaved(iq, tokens, shape.heads, shape.head_dim, 0, positions);
  rope.ApplyInterleaved(ik, tokens, 1, shape.head_dim, 0, positions);
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(shape.heads));
  for (int64_t i = 0; i < tokens * shape.heads; ++i) weights[i] *= head_scale;
}

std::vector<int32_t> TopkPositions(const float* scores, int64_t n, int64_t k) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  // A strict total order (score descending, then position ascending): the k chosen do not
  // depend on the algorithm's internal order.
  const auto before = [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), before);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

void IndexerSelect(const float* iq, const float* weights, absl::Span<const SequenceSlice> batch,
                   const KvCache& cache, int64_t layer, const MlaShape& mla,
                   const IndexerShape& shape, TopkSelection* out) {
  const int64_t bs = cache.shape().block_size, width = cache.kv_dim();
  const int64_t hi = shape.heads, di = shape.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(di));
  std::vector<int32_t> seq;
  std::vector<int64_t> pos;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t t = 0; t < batch[i].num_tokens; ++t) {
      seq.push_back(static_cast<int32_t>(i));
      pos.push_back(batch[i].start_position + t);
    }
  }
  const int64_t total = static_cast<int64_t>(seq.size());
  out->count.assign(total, -1);
  out->offset.assign(total, 0);
  // Tokens with more than topk causal keys get a list of exactly topk positions.
  int64_t listed = 0;
  for (int64_t t = 0; t < total; ++t) {
    out->offset[t] = listed;
    if (pos[t] + 1 > shape.topk) {
      out->count[t] = static_cast<int32_t>(shape.topk);
      listed += shape.topk;
    }
  }
  out->positions.assign(listed, 0);
  ParallelFor(total, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t t = begin; t < end; ++t) {
      if (out->count[t] < 0) continue;  // every causal key is kept: no scores needed
      const SequenceSlice& s = batch[seq[t]];
      const int64_t n = pos[t] + 1;
      scores.resize(n);
      const float* wt = weights + t * hi;
      for (int64_t p = 0; p < n; ++p) {
        const float* key =
            cache.keys(layer, (*s.blocks)[p / bs]) + (p % bs) * width + mla.index_offset();
        float sum = 0.f;  // heads in ascending order
        for (int64_t h = 0; h < hi; ++h) {
          const float dot = LaneDot(iq + (t * hi + h) * di, key, di) * scale;
          sum += wt[h] * std::max(dot, 0.f);
        }
        scores[p] = sum;
      }
      const std::vector<int32_t> top = TopkPositions(scores.data(), n, shape.topk);
      std::copy(top.begin(), top.end(), out->positions.begin() + out->offset[t]);
    }
  });
}

}  // namespace glmserve
