#include "core/cpu/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/dtype.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/attention_items.h"
#include "core/cpu/ops/attention_simd.h"
#include "core/cpu/ops/lane_sum.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"
#include "core/model/kv_fp8.h"

namespace glmserve {
namespace internal {

void AttentionScoresGeneric(const AttentionRows& rows, const float* q, float scale, float* scores) {
  rows.ForEach(
      false, [&](int64_t p, const float* k) { scores[p] = LaneDot(q, k, rows.head_dim) * scale; });
}

void AttentionWeightedSumGeneric(const AttentionRows& rows, const float* probs, float* out) {
  rows.ForEach(true, [&](int64_t p, const float* v) {
    const float w = probs[p];
    for (int64_t d = 0; d < rows.head_dim; ++d) out[d] += w * v[d];
  });
}

std::vector<AttentionItem> AttentionItems(absl::Span<const SequenceSlice> batch, int64_t kv_heads,
                                          int64_t group, ItemLimits limits) {
  std::vector<AttentionItem> items;
  int64_t row0 = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceSlice& s = batch[i];
    const int64_t longest = s.start_position + s.num_tokens;
    const int64_t tb = std::clamp<int64_t>(limits.probs / (group * longest), 1, limits.tokens);
    for (int64_t t0 = 0; t0 < s.num_tokens; t0 += tb) {
      for (int64_t g = 0; g < kv_heads; ++g) {
        items.push_back(
            {static_cast<int32_t>(i), row0, t0, std::min(tb, s.num_tokens - t0), g, 0, group});
      }
    }
    row0 += s.num_tokens;
  }
  // Splitting a group re-reads its keys and values once per part: only to give each thread an
  // item.
  const int64_t want = NumThreads();
  if (static_cast<int64_t>(items.size()) < want && group > 1) {
    const int64_t split = std::min<int64_t>(group, (want + items.size() - 1) / items.size());
    std::vector<AttentionItem> parts;
    for (const AttentionItem& item : items) {
      for (int64_t j = 0; j < split; ++j) {
        AttentionItem part = item;
        part.head0 = group * j / split;
        part.heads = group * (j + 1) / split - part.head0;
        parts.push_back(part);
      }
    }
    items = std::move(parts);
  }
  std::stable_sort(items.begin(), items.end(), [&](const AttentionItem& a, const AttentionItem& b) {
    return batch[a.seq].start_position + a.token0 > batch[b.seq].start_position + b.token0;
  });
  return items;
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
      if (cache->host_bf16()) {  // FloatToBf16 of each value: what the bf16 attentions read
        internal::RoundToBf16(k + row * dim, dim, cache->bf16_rows(layer, block, 0) + slot * dim);
        internal::RoundToBf16(v + row * dim, dim, cache->bf16_rows(layer, block, 1) + slot * dim);
        continue;
      }
      std::copy_n(k + row * dim, dim, cache->keys(layer, block) + slot * dim);
      std::copy_n(v + row * dim, dim, cache->values(layer, block) + slot * dim);
    }
  }
}

namespace {

// The multi-row form of a single-row loop (the portable and AVX2 ones): each row in turn.
template <auto kScores>
void ScoresEachRow(const internal::AttentionRows& rows, int64_t n, const float* const* q,
                   float scale, float* const* scores) {
  for (int64_t r = 0; r < n; ++r) kScores(rows, q[r], scale, scores[r]);
}
template <auto kSum>
void SumEachRow(const internal::AttentionRows& rows, int64_t n, const float* const* probs,
                float* const* out) {
  for (int64_t r = 0; r < n; ++r) kSum(rows, probs[r], out[r]);
}

// `rows`' positions [p0, p1) (keys, or values) copied to buf [p1 - p0, head_dim], and the view
// of them that the loops read. In the cache a head's slice of each position lies kv_dim floats
// from the next (4 KiB on GLM-4.5 Air): a block's rows share cache sets, so rereading them for
// each query row missed even L2, and the hardware prefetchers do not follow the stride.
// Contiguous, they stay in L2 and stream: worth the copy for an item of many rows (a prompt), not
// for a decode step's few (kInPlaceRows). A copy (from a bf16 cache: each value widened,
// exactly): no bit changes.
template <typename T>
internal::AttentionRows PackBlock(const internal::AttentionRows& rows, bool values, int64_t p0,
                                  int64_t p1, float* buf) {
  internal::AttentionRows block = rows;
  block.begin = p0;
  block.context = p1;
  const int64_t hd = rows.head_dim, stride = rows.kv_dim;
  block.template ForEachRun<T>(values, [&](int64_t p, const T* row, int64_t count) {
    for (int64_t i = 0; i < count; ++i, row += stride) {
      if (i + 4 < count) {
        for (int64_t d = 0; d < hd; d += 64 / sizeof(T)) __builtin_prefetch(row + 4 * stride + d);
      }
      float* dst = buf + (p + i - p0) * hd;
      if constexpr (std::is_same_v<T, float>) {
        std::copy_n(row, hd, dst);
      } else {
        std::transform(row, row + hd, dst, Bf16ToFloat);
      }
    }
  });
  block.packed = buf;
  block.packed_begin = p0;
  block.kv_dim = hd;
  return block;
}

}  // namespace

void PagedAttention(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                    int64_t layer, int64_t heads, float scale, float* out) {
  const int64_t bs = cache.shape().block_size;
  const int64_t head_dim = cache.shape().head_dim;
  const int64_t kv_heads = cache.shape().kv_heads;
  const int64_t kv_dim = kv_heads * head_dim;
  const int64_t group = heads / kv_heads;

  if (cache.host_fp8()) {
    // Flatten (token, KV head) work items so that one long prompt and many decodes both spread
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
    // The FP8 cache (core/model/kv_fp8.h): one work item per (token, KV head) decodes each attended
    // key and value row once to fp32 (e4m3 x its scale) and serves the `group` query heads
    // that share it. Every head's scores, softmax and weighted sum are the fp32 path's below,
    // in the same order, on the decoded rows: as batch-invariant as that path.
    ParallelFor(total * kv_heads, 1, [&](int64_t item_begin, int64_t item_end) {
      thread_local AlignedVector<float> probs, row;
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
  // They take the rows that read the same positions together; AVX-512 loads each key and
  // value vector once for several of them.
  const bool avx512 = internal::CpuHasAvx512(), avx2 = internal::CpuHasAvx2Fma();
  const auto scores_fn = avx512 ? internal::AttentionScoresRowsAvx512
                         : avx2 ? ScoresEachRow<internal::AttentionScoresAvx2>
                                : ScoresEachRow<internal::AttentionScoresGeneric>;
  const auto sum_fn = avx512 ? internal::AttentionWeightedSumRowsAvx512
                      : avx2 ? SumEachRow<internal::AttentionWeightedSumAvx2>
                             : SumEachRow<internal::AttentionWeightedSumGeneric>;
  const std::vector<internal::AttentionItem> items =
      internal::AttentionItems(batch, kv_heads, group, internal::kFp32ItemLimits);
  ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t item_begin, int64_t item_end) {
    thread_local AlignedVector<float> probs, packed;
    thread_local internal::RowsAhead rows_ahead;  // the next block's rows, for the loops
    internal::LinesAhead ahead;
    packed.resize(internal::kPositionBlock * head_dim);
    for (int64_t i = item_begin; i < item_end; ++i) {
      const internal::ItemRows row_of{items[i], batch[items[i].seq], heads, group};
      const int64_t n_rows = row_of.count(), item_context = row_of.context();
      // A decode step's item (one token's rows) reads each fp32 block a few times: the AVX-512
      // loops read it in place, the next block's lines planned ahead, where copying it cost
      // more than it saved. Longer items pack: their passes reuse the block from L1 and L2.
      const bool in_place = avx512 && n_rows <= internal::kInPlaceRows;
      probs.resize(n_rows * item_context);  // [n_rows, item_context]
      const internal::AttentionRows rows{.cache = &cache,
                                         .blocks = row_of.slice.blocks,
                                         .layer = layer,
                                         .kv_off = items[i].kv_head * head_dim,
                                         .kv_dim = kv_dim,
                                         .block_size = bs,
                                         .head_dim = head_dim,
                                         .context = 0};
      // Each position block's keys (then values) come from memory once, packed when several
      // rows read them; f(view, r, n) for each run, the view set to its part of the block.
      internal::AttentionRows view = rows;
      auto each_block = [&](bool values, auto&& f) {
        internal::ForEachBlockRun(
            row_of,
            [&](int64_t p0, int64_t p1) {
              // A bf16 cache's rows are widened here, whatever the item's rows.
              view = cache.host_bf16() ? PackBlock<uint16_t>(rows, values, p0, p1, packed.data())
                     : n_rows > 1 && !in_place
                         ? PackBlock<float>(rows, values, p0, p1, packed.data())
                         : rows;
              view.begin = p0;
              // (The portable and AVX2 loops prefetch a lone row's rows themselves.)
              if (view.packed != nullptr || in_place) {
                internal::PlanRowsAhead(rows, values, p1, item_context, &rows_ahead);
                ahead = rows_ahead.lines();
                view.ahead = &ahead;
              }
            },
            [&](int64_t, int64_t end, int64_t r, int64_t n) {
              view.context = end;
              f(view, r, n);
            });
      };
      const float* in[internal::kRunRows];  // a run's query rows, or probabilities
      float* res[internal::kRunRows];       // and its scores, or outputs
      each_block(false, [&](const internal::AttentionRows& view, int64_t r, int64_t n) {
        for (int64_t j = 0; j < n; ++j) {
          in[j] = q + row_of(r + j).first * head_dim;
          res[j] = probs.data() + (r + j) * item_context;
        }
        scores_fn(view, n, in, scale, res);
      });
      for (int64_t r = 0; r < n_rows; ++r) {
        const auto [qh, context] = row_of(r);
        SoftmaxInPlace(probs.data() + r * item_context, context);
        std::fill_n(out + qh * head_dim, head_dim, 0.f);
      }
      each_block(true, [&](const internal::AttentionRows& view, int64_t r, int64_t n) {
        for (int64_t j = 0; j < n; ++j) {
          in[j] = probs.data() + (r + j) * item_context;
          res[j] = out + row_of(r + j).first * head_dim;
        }
        sum_fn(view, n, in, res);
      });
    }
  });
}

}  // namespace glmserve
