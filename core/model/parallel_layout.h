// How a model is cut across the ranks of a tensor-parallel group (docs/parallel.md): which
// slice of every weight and of the KV cache rank r of N holds. One set of rules, used by the
// weight slicer (core/model/weight_shard.h), the memory planner and the tests, so the bytes a
// plan promises are the bytes a rank loads.
//
//   attention (GQA)  query heads split evenly (N must divide them); KV heads split evenly when
//                    N divides them, else each rank holds the one KV head its query heads read
//                    (N a multiple of the KV heads: replicated N / kv_heads times)
//   attention (MLA)  query heads split evenly (q_b_proj, kv_b_proj rows; o_proj columns);
//                    q_a/kv_a projections, their norms, the DSA indexer and the latent cache
//                    replicated: every rank stores every token's latent row
//   dense FFN,       the width split in whole units (the FP8 scale block when block-scaled,
//   shared expert    else 1): units [r U / N, (r + 1) U / N), so block scales stay aligned
//                    (with fewer units U than ranks N, some ranks hold none: zero width)
//   routed experts   expert parallel (default): whole experts [r E / N, (r + 1) E / N), E not
//                    necessarily divisible by N; else each expert's width split as the FFN's
//   embedding, head  vocabulary rows [r V / N, (r + 1) V / N)
//   router, norms    replicated
//
// Every output a rank computes is a partial sum (o_proj, down projections) or a slice of the
// vocabulary; the group sums partials in rank order 0..N-1 and gathers slices in rank order
// (core/model/communicator.h), the same order for every step and every batch.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/config.h"

namespace glmserve {

struct ParallelConfig {
  int tensor_parallel = 1;      // ranks in the group (N)
  bool expert_parallel = true;  // routed experts whole per rank (else their width is split)
};

// [begin, begin + count) of some dimension.
struct IndexRange {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
  bool operator==(const IndexRange& o) const { return begin == o.begin && count == o.count; }
};

// Part r of N of [0, extent) in whole units of `unit` (the last unit may be short):
// units [r U / N, (r + 1) U / N) with U = ceil(extent / unit).
IndexRange SplitRange(int64_t extent, int64_t unit, int rank, int size);

// What rank `rank` holds. Widths are in elements of the split dimension.
struct RankLayout {
  int rank = 0;
  int size = 1;
  IndexRange q_heads;   // query heads (GQA and MLA)
  IndexRange kv_heads;  // GQA KV heads (MLA: the one latent "head", replicated)
  IndexRange vocab;     // embedding and LM head rows
  IndexRange experts;   // routed experts held whole (all of them when their width is split)
  bool expert_width_split = false;
  // Split unit of the FFN widths: the weights' FP8 scale block along the width (1 if none).
  int64_t width_unit = 1;

  IndexRange DenseWidth(const ModelConfig& c) const {
    return SplitRange(c.intermediate_size, width_unit, rank, size);
  }
  IndexRange SharedWidth(const ModelConfig& c) const {
    return SplitRange(c.shared_intermediate_size(), width_unit, rank, size);
  }
  // The columns of one routed expert's width this rank computes (all of them under EP).
  IndexRange ExpertWidth(const ModelConfig& c) const {
    return expert_width_split ? SplitRange(c.moe_intermediate_size, width_unit, rank, size)
                              : IndexRange{0, c.moe_intermediate_size};
  }
  // The rank's config: the same model with its own query and KV head counts (what its
  // attention kernels and its KV cache see). Every other field is the whole model's.
  ModelConfig LocalConfig(const ModelConfig& c) const;
};

// INVALID_ARGUMENT, naming the numbers, when `config` cannot be cut this way: N < 1, query heads
// not divisible by N, KV heads neither dividing nor divided by N, o_proj head columns that are
// not whole scale blocks, a vocabulary smaller than N, fewer experts than ranks under EP. An
// FFN width of fewer units than ranks is fine: the ranks past its last unit hold none of it
// (zero width) and add zeros to its sum.
absl::Status CheckParallelLayout(const ModelConfig& config, const ParallelConfig& parallel,
                                 int64_t width_unit = 1);

// Rank `rank`'s slice (CheckParallelLayout must have passed).
RankLayout LayoutOf(const ModelConfig& config, const ParallelConfig& parallel, int rank,
                    int64_t width_unit = 1);

// "TP 4, experts EP (32 each, 2 ranks hold 33), KV heads 2 per rank" for logs and plans.
std::string DescribeParallel(const ModelConfig& config, const ParallelConfig& parallel);

}  // namespace glmserve
