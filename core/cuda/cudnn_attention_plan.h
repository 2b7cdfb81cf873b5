// The host-side half of cuDNN's fused attention (core/cuda/cudnn_attention.h): a step's
// attention tiles (step_plan.h) regrouped into what cuDNN's SDPA takes, one entry per
// sequence: query and key counts, ragged offsets of the packed query and output rows, and a
// dense page table; and the bucketed shape cuDNN's execution plans are cached under.
//
// Plain host code (no CUDA or cuDNN types), built and unit-tested in every build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/step_plan.h"

namespace glmserve::cuda {

// The shape a cuDNN execution plan is built for. Every dimension is a bucket (a power of two,
// BucketUp) of the step's own: sequences (`batch`), the longest query run (`max_q`) and the
// longest context in cache blocks (`max_pages`), so that steps of similar shapes share a plan.
// The real lengths travel as device data (seq_len_q / seq_len_kv), the plan only bounds them.
struct CudnnPlanKey {
  int64_t batch = 0;
  int64_t max_q = 0;
  int64_t max_pages = 0;

  bool operator==(const CudnnPlanKey& o) const {
    return batch == o.batch && max_q == o.max_q && max_pages == o.max_pages;
  }
  bool operator<(const CudnnPlanKey& o) const {
    if (batch != o.batch) return batch < o.batch;
    if (max_q != o.max_q) return max_q < o.max_q;
    return max_pages < o.max_pages;
  }
};

// The smallest power of two >= n (1 for n <= 1).
int64_t BucketUp(int64_t n);

// One step's SDPA inputs, for `key.batch` entries: the step's sequences in batch order, then
// empty ones (no query rows, one key, page 0) up to the bucket.
struct CudnnAttentionBatch {
  CudnnPlanKey key;
  int64_t sequences = 0;            // the step's sequences (<= key.batch)
  std::vector<int32_t> seq_len_q;   // [key.batch] query rows of each sequence
  std::vector<int32_t> seq_len_kv;  // [key.batch] keys each sequence's last row sees
  // [key.batch + 1] element offsets of each sequence's first query row in the packed
  // [tokens, heads, head_dim] Q (and O: the same layout); the last is tokens * heads * head_dim.
  std::vector<int32_t> ragged;
  // [key.batch, key.max_pages] cache block ids: each sequence's first ceil(seq_len_kv /
  // block_size) table entries, then block 0 (never read: beyond seq_len_kv).
  std::vector<int32_t> page_table;

  // The int32 upload, in this order: seq_len_q, seq_len_kv, ragged, page_table.
  int64_t total_ints() const {
    return static_cast<int64_t>(seq_len_q.size() + seq_len_kv.size() + ragged.size() +
                                page_table.size());
  }
  int64_t seq_len_q_offset() const { return 0; }
  int64_t seq_len_kv_offset() const { return static_cast<int64_t>(seq_len_q.size()); }
  int64_t ragged_offset() const {
    return seq_len_kv_offset() + static_cast<int64_t>(seq_len_kv.size());
  }
  int64_t page_table_offset() const {
    return ragged_offset() + static_cast<int64_t>(ragged.size());
  }
  // Writes total_ints() ints.
  void Write(int32_t* out) const;
};

// Fills `out` from a step's tiles and block tables (consecutive tiles of one sequence share
// its block-table offset and continue its positions). False, with the reason in *why, for a
// step cuDNN cannot take as it stands: padding rows (kv_len 0: CUDA-graph steps), rows not in
// sequence order, or offsets beyond int32. `heads * head_dim`: elements per query row.
bool BuildCudnnAttentionBatch(const StepPlan& plan, int64_t block_size, int64_t row_elems,
                              CudnnAttentionBatch* out, std::string* why);

}  // namespace glmserve::cuda
