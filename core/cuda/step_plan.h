// The host-side description of one forward step for the GPU kernels: per-token ids,
// positions and KV slots, the attention tiles, the concatenated block tables and the rows
// whose logits are wanted, all int32, copied to the device in one transfer.
//
// Plain host code (no CUDA types), so that it is unit-tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/forward_types.h"

namespace glmserve::cuda {

// Attention tile fields (see core/cuda/kernels.h): row0, num_q, pos0, bt_offset, kv_len.
inline constexpr int kAttentionTileInts = 5;

struct StepPlan {
  int64_t tokens = 0;           // rows the kernels run over: real_tokens plus padding
  int64_t real_tokens = 0;      // the batch's tokens
  int64_t logit_rows = 0;       // rows of logits computed (real plus padding)
  int64_t real_logit_rows = 0;  // rows of logits returned
  int64_t num_tiles = 0;
  int64_t max_kv_len = 0;
  std::vector<int32_t> ids;           // [tokens] token ids (when the span has the embedding)
  std::vector<int32_t> positions;     // [tokens]
  std::vector<int32_t> slots;         // [tokens] block * block_size + offset; -1 for padding
  std::vector<int32_t> logit_index;   // [logit_rows] batch row of each logits row
  std::vector<int32_t> tiles;         // [num_tiles * kAttentionTileInts]
  std::vector<int32_t> block_tables;  // every sequence's table, concatenated
};

// A CUDA-graph step's fixed shape: the counts a captured graph bakes into its launches.
// 0 leaves that count as the batch makes it.
struct StepPadding {
  int64_t tokens = 0;      // rows the kernels run over
  int64_t tiles = 0;       // attention tiles launched
  int64_t logit_rows = 0;  // logits rows computed (when the step computes logits)
};

// Fills `plan` for `batch` (already validated: tables cover positions, ids in range).
// `tile_tokens`: query tokens per attention tile. `pad` (CUDA-graph buckets): padding rows
// read token 0 at position 0, store no KV and attend to nothing (each a one-row tile with
// kv_len 0, output 0); tiles beyond those are empty (num_q 0: no rows, no work); logits rows
// beyond the batch's are the padding rows' own, then row 0 again (computed, never returned).
// `with_ids`: copy batch.token_ids (the span starts at layer 0).
void BuildStepPlan(const ForwardBatch& batch, LogitsRows logits, int64_t block_size,
                   int tile_tokens, const StepPadding& pad, bool with_ids, StepPlan* plan);

// Where each part of a plan lives in the int32 metadata buffer, for buffers sized for
// `token_cap` tokens and `block_table_cap` block-table entries. Fixed offsets for fixed
// capacities, so that captured CUDA graphs keep reading the right addresses.
struct MetaLayout {
  int64_t token_cap = 0;
  int64_t block_table_cap = 0;

  int64_t ids() const { return 0; }
  int64_t positions() const { return token_cap; }
  int64_t slots() const { return 2 * token_cap; }
  int64_t logit_index() const { return 3 * token_cap; }
  int64_t tiles() const { return 4 * token_cap; }
  int64_t block_tables() const { return (4 + kAttentionTileInts) * token_cap; }
  int64_t total() const { return block_tables() + block_table_cap; }
  bool Fits(const StepPlan& plan) const {
    return plan.tokens <= token_cap && plan.logit_rows <= token_cap &&
           plan.num_tiles <= token_cap &&
           static_cast<int64_t>(plan.block_tables.size()) <= block_table_cap;
  }
};

// Writes `plan` into `meta` (MetaLayout::total() ints); returns how many leading ints of
// `meta` must be copied to the device.
int64_t WriteMeta(const StepPlan& plan, const MetaLayout& layout, int32_t* meta);

}  // namespace glmserve::cuda
