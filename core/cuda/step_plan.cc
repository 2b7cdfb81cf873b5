#include "core/cuda/step_plan.h"

#include <algorithm>
#include <cstring>

namespace glmserve::cuda {

void BuildStepPlan(const ForwardBatch& batch, LogitsRows logits, int64_t block_size,
                   int tile_tokens, const StepPadding& pad, bool with_ids, StepPlan* plan) {
  plan->ids.clear();
  plan->positions.clear();
  plan->slots.clear();
  plan->logit_index.clear();
  plan->tiles.clear();
  plan->block_tables.clear();
  plan->max_kv_len = 0;

  int64_t row = 0;
  for (const SequenceSlice& s : batch.sequences) {
    const int32_t bt_offset = static_cast<int32_t>(plan->block_tables.size());
    plan->block_tables.insert(plan->block_tables.end(), s.blocks->begin(), s.blocks->end());
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t pos = s.start_position + i;
      plan->positions.push_back(static_cast<int32_t>(pos));
      plan->slots.push_back(
          static_cast<int32_t>((*s.blocks)[pos / block_size] * block_size + pos % block_size));
    }
    for (int64_t i = 0; i < s.num_tokens; i += tile_tokens) {
      const int64_t num_q = std::min<int64_t>(tile_tokens, s.num_tokens - i);
      const int64_t pos0 = s.start_position + i;
      plan->tiles.insert(
          plan->tiles.end(),
          {static_cast<int32_t>(row + i), static_cast<int32_t>(num_q), static_cast<int32_t>(pos0),
           bt_offset, static_cast<int32_t>(pos0 + num_q)});
    }
    plan->max_kv_len = std::max(plan->max_kv_len, s.start_position + s.num_tokens);
    row += s.num_tokens;
  }
  plan->real_tokens = row;
  ForwardOptions policy;
  policy.logits = logits;
  for (int64_t r : ReturnedLogitRows(batch, policy)) {
    plan->logit_index.push_back(static_cast<int32_t>(r));
  }
  plan->real_logit_rows = static_cast<int64_t>(plan->logit_index.size());
  if (with_ids) plan->ids.assign(batch.token_ids.begin(), batch.token_ids.end());

  // Padding rows: harmless inputs, no KV writes, zero attention (finite values for the
  // layers after it), their own logits rows.
  const int64_t real = row;
  for (; row < pad.tokens; ++row) {
    if (with_ids) plan->ids.push_back(0);
    plan->positions.push_back(0);
    plan->slots.push_back(-1);
    plan->tiles.insert(plan->tiles.end(), {static_cast<int32_t>(row), 1, 0, 0, 0});
  }
  plan->tokens = row;
  while (static_cast<int64_t>(plan->tiles.size()) < pad.tiles * kAttentionTileInts) {
    plan->tiles.insert(plan->tiles.end(), {0, 0, 0, 0, 0});
  }
  if (logits != LogitsRows::kNone) {
    for (int64_t i = 0; plan->real_logit_rows + i < pad.logit_rows; ++i) {
      plan->logit_index.push_back(static_cast<int32_t>(real + i < row ? real + i : 0));
    }
  }
  plan->logit_rows = static_cast<int64_t>(plan->logit_index.size());
  plan->num_tiles = static_cast<int64_t>(plan->tiles.size()) / kAttentionTileInts;
}

int64_t WriteMeta(const StepPlan& plan, const MetaLayout& layout, int32_t* meta) {
  const auto put = [meta](int64_t at, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(meta + at, v.data(), v.size() * sizeof(int32_t));
  };
  put(layout.ids(), plan.ids);
  put(layout.positions(), plan.positions);
  put(layout.slots(), plan.slots);
  put(layout.logit_index(), plan.logit_index);
  put(layout.tiles(), plan.tiles);
  put(layout.block_tables(), plan.block_tables);
  return layout.block_tables() + static_cast<int64_t>(plan.block_tables.size());
}

}  // namespace glmserve::cuda
