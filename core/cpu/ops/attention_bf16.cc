// PagedAttentionBf16 (attention_bf16.h): the driver, and the portable packing and loops that
// define the arithmetic (the AVX512_BF16 forms are in attention_bf16_avx512bf16.cc).
#include "core/cpu/ops/attention_bf16.h"

#include <algorithm>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/dtype.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/attention_items.h"
#include "core/cpu/ops/bf16_math.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/softmax.h"

namespace glmserve {
namespace internal {

const char* AttentionBf16KernelName() {
  return CpuHasAvx512Bf16() ? "avx512_bf16" : CpuHasAvx2Fma() ? "avx2_bf16" : "generic_bf16";
}

void RoundPairsGeneric(const float* x, int64_t n, uint32_t* out) {
  for (int64_t j = 0; 2 * j < n; ++j)
    out[j] = Bf16Pair(x[2 * j], 2 * j + 1 < n ? x[2 * j + 1] : 0.f);
}

namespace {

// A cached element's bf16 bits: an fp32 cache's value rounded, a bf16 cache's bits as stored
// (which WriteKv rounded the same way).
inline uint32_t Bf16Bits(float x) { return FloatToBf16(x); }
inline uint32_t Bf16Bits(uint16_t x) { return x; }

template <typename T>
void PackKeysFrom(const AttentionRows& rows, uint32_t* keys) {
  const int64_t hd = rows.head_dim;
  rows.ForEach<T>(false, [&](int64_t p, const T* key) {
    for (int64_t i = 0; 2 * i < hd; ++i) {
      keys[i * kPositionBlock + p - rows.begin] =
          Bf16Bits(key[2 * i]) | (2 * i + 1 < hd ? Bf16Bits(key[2 * i + 1]) << 16 : 0u);
    }
  });
}

template <typename T>
void PackValuesFrom(const AttentionRows& rows, uint32_t* values) {
  const int64_t hd = rows.head_dim, width = (hd + 15) / 16 * 16;
  const int64_t n = rows.context - rows.begin;
  std::fill_n(values, (n + 1) / 2 * width, 0u);  // the dims past head_dim, an odd last position
  rows.ForEach<T>(true, [&](int64_t p, const T* value) {
    const int64_t j = (p - rows.begin) / 2, high = (p - rows.begin) % 2;
    for (int64_t d = 0; d < hd; ++d) values[j * width + d] |= Bf16Bits(value[d]) << (16 * high);
  });
}

}  // namespace

void PackKeysBf16Generic(const AttentionRows& rows, uint32_t* keys) {
  rows.cache->host_bf16() ? PackKeysFrom<uint16_t>(rows, keys) : PackKeysFrom<float>(rows, keys);
}

void PackValuesBf16Generic(const AttentionRows& rows, uint32_t* values) {
  rows.cache->host_bf16() ? PackValuesFrom<uint16_t>(rows, values)
                          : PackValuesFrom<float>(rows, values);
}

void AttentionScoresBf16Generic(const Bf16Block& b, int64_t n, const uint32_t* const* q,
                                float scale, float* const* scores) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = b.p0; p < b.end; ++p) {
      float acc = 0.f;
      for (int64_t i = 0; i < b.key_pairs; ++i) {
        acc = DpBf16Lane(acc, q[r][i], b.keys[i * kPositionBlock + p - b.p0]);
      }
      scores[r][p] = acc * scale;
    }
  }
}

void AttentionWeightedSumBf16Generic(const Bf16Block& b, int64_t n, const uint32_t* const* probs,
                                     float* const* out) {
  const int64_t pairs = (b.end - b.p0 + 1) / 2;
  // An odd count ends at the row's own position (a block cut short by the run's rows is cut at a
  // full block): the last pair's second value reads as +0, as its probability is.
  const uint32_t last_mask = (b.end - b.p0) % 2 != 0 ? 0xffffu : 0xffffffffu;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < pairs; ++j) {
      const uint32_t mask = j + 1 == pairs ? last_mask : 0xffffffffu;
      for (int64_t d = 0; d < b.head_dim; ++d) {
        out[r][d] = DpBf16Lane(out[r][d], probs[r][j], b.values[j * b.value_width + d] & mask);
      }
    }
  }
}

}  // namespace internal

namespace {
// Items of up to 32 tokens, 16 MiB of scores per thread (and 8 MiB of their bf16 pairs): the
// packing (rounding, and the keys' transpose) costs more per position than the fp32 path's
// copy, so it pays to share it among more rows. attention_bench --modes=bf16 --threads=2
// --tokens=2048 --context=6144 (an 8k prompt's last chunk): 3.2-3.5 s with fp32's limits, 3.1
// with 32 tokens and 8 MiB (21 tokens at 8k), 2.9 with these.
constexpr internal::ItemLimits kItemLimits = {32, int64_t{1} << 22};
}  // namespace

void PagedAttentionBf16(const float* q, absl::Span<const SequenceSlice> batch, const KvCache& cache,
                        int64_t layer, int64_t heads, float scale, float* out) {
  using internal::kPositionBlock;
  using internal::kRunRows;
  const int64_t head_dim = cache.shape().head_dim, kv_heads = cache.shape().kv_heads;
  const int64_t group = heads / kv_heads;
  const int64_t key_pairs = (head_dim + 1) / 2, value_width = (head_dim + 15) / 16 * 16;
  const bool simd = internal::CpuHasAvx512Bf16();
  const auto round_pairs = simd ? internal::RoundPairsAvx512 : internal::RoundPairsGeneric;
  const bool avx2 = !simd && internal::CpuHasAvx2Fma();
  const auto pack_keys = simd   ? internal::PackKeysBf16Avx512
                         : avx2 ? internal::PackKeysBf16Avx2
                                : internal::PackKeysBf16Generic;
  const auto pack_values = simd   ? internal::PackValuesBf16Avx512
                           : avx2 ? internal::PackValuesBf16Avx2
                                  : internal::PackValuesBf16Generic;
  const auto scores_fn = simd   ? internal::AttentionScoresBf16Avx512Bf16
                         : avx2 ? internal::AttentionScoresBf16Avx2
                                : internal::AttentionScoresBf16Generic;
  const auto sum_fn = simd   ? internal::AttentionWeightedSumBf16Avx512Bf16
                      : avx2 ? internal::AttentionWeightedSumBf16Avx2
                             : internal::AttentionWeightedSumBf16Generic;
  // AVX-512 reads a bf16 cache's values where they lie (Bf16Block::value_rows) for items of at
  // most one run of rows (a decode step's), which read each value once: no packing. Longer items
  // read a block once per run, and a packed block stays in L1 between them.
  const bool direct_values = simd && cache.host_bf16() && head_dim % 32 == 0;
  const std::vector<internal::AttentionItem> items =
      internal::AttentionItems(batch, kv_heads, group, kItemLimits);
  ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t item_begin, int64_t item_end) {
    thread_local AlignedVector<float> probs, sums;            // [n_rows, item_context], [n_rows]
    thread_local AlignedVector<uint32_t> q_pairs, exp_pairs;  // [n_rows, key / context pairs]
    thread_local AlignedVector<uint32_t> keys, values;        // one block's (Bf16Block)
    thread_local internal::RowsAhead rows_ahead;              // the next block's rows
    const uint16_t* value_rows[kPositionBlock];               // or its value rows (direct_values)
    internal::LinesAhead ahead;
    keys.resize(key_pairs * kPositionBlock);
    values.resize(kPositionBlock / 2 * value_width);
    for (int64_t i = item_begin; i < item_end; ++i) {
      const internal::ItemRows row_of{items[i], batch[items[i].seq], heads, group};
      const int64_t n_rows = row_of.count(), item_context = row_of.context();
      const int64_t context_pairs = (item_context + 1) / 2;
      probs.resize(n_rows * item_context);
      sums.resize(n_rows);
      q_pairs.resize(n_rows * key_pairs);
      exp_pairs.resize(n_rows * context_pairs);
      for (int64_t r = 0; r < n_rows; ++r) {
        round_pairs(q + row_of(r).first * head_dim, head_dim, q_pairs.data() + r * key_pairs);
      }
      internal::AttentionRows rows{.cache = &cache,
                                   .blocks = row_of.slice.blocks,
                                   .layer = layer,
                                   .kv_off = items[i].kv_head * head_dim,
                                   .kv_dim = kv_heads * head_dim,
                                   .block_size = cache.shape().block_size,
                                   .head_dim = head_dim,
                                   .context = 0};
      internal::Bf16Block block{.head_dim = head_dim,
                                .key_pairs = key_pairs,
                                .value_width = value_width,
                                .keys = keys.data(),
                                .values = values.data(),
                                .value_rows = nullptr,
                                .ahead = &ahead};
      if (direct_values && n_rows <= kRunRows) block.value_rows = value_rows;
      // The AVX2 loops' condition for dropping their DAZ/FTZ masks (attention_bf16_avx2.cc): the
      // packed block's smallest exponents, over its n positions.
      auto block_exponents = [&](bool values_pass, int64_t n) {
        if (values_pass) {
          block.value_exp_min =
              internal::MinExponentOfPairs(values.data(), (n + 1) / 2 * value_width);
          return;
        }
        int low = 255;
        for (int64_t i = 0; i < key_pairs; ++i) {
          low = std::min(low, internal::MinExponentOfPairs(keys.data() + i * kPositionBlock, n));
        }
        block.key_exp_min = low;
      };
      // Each position block packed once for the item's rows; f(r, n) for each run, `block` set
      // to the run's positions.
      auto each_block = [&](bool values_pass, auto&& f) {
        internal::ForEachBlockRun(
            row_of,
            [&](int64_t p0, int64_t p1) {
              rows.begin = p0;
              rows.context = p1;
              if (values_pass && block.value_rows != nullptr) {
                rows.ForEach<uint16_t>(
                    true, [&](int64_t p, const uint16_t* row) { value_rows[p - p0] = row; });
              } else if (values_pass) {
                pack_values(rows, values.data());
              } else {
                pack_keys(rows, keys.data());
              }
              if (avx2) block_exponents(values_pass, p1 - p0);
              if (simd || avx2) {  // (the portable loops do not read ahead)
                internal::PlanRowsAhead(rows, values_pass, p1, item_context, &rows_ahead);
                ahead = rows_ahead.lines();
              }
            },
            [&](int64_t p0, int64_t end, int64_t r, int64_t n) {
              block.p0 = p0;
              block.end = end;
              f(r, n);
            });
      };
      const uint32_t* in[kRunRows];  // a run's query pairs, or exp pairs
      float* res[kRunRows];          // and its scores, or outputs
      each_block(false, [&](int64_t r, int64_t n) {
        for (int64_t j = 0; j < n; ++j) {
          in[j] = q_pairs.data() + (r + j) * key_pairs;
          res[j] = probs.data() + (r + j) * item_context;
        }
        scores_fn(block, n, in, scale, res);
      });
      for (int64_t r = 0; r < n_rows; ++r) {
        const auto [qh, context] = row_of(r);
        float* row = probs.data() + r * item_context;
        sums[r] = SoftmaxExpInPlace(row, context);
        round_pairs(row, context, exp_pairs.data() + r * context_pairs);
        std::fill_n(out + qh * head_dim, head_dim, 0.f);
      }
      each_block(true, [&](int64_t r, int64_t n) {
        for (int64_t j = 0; j < n; ++j) {
          in[j] = exp_pairs.data() + (r + j) * context_pairs + block.p0 / 2;
          res[j] = out + row_of(r + j).first * head_dim;
        }
        sum_fn(block, n, in, res);
      });
      for (int64_t r = 0; r < n_rows; ++r) {
        float* o = out + row_of(r).first * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = o[d] / sums[r];
      }
    }
  });
}

}  // namespace glmserve
