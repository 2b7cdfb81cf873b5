#include "core/model/weight_shard.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/model/weight_layout.h"

namespace glmserve {
namespace {

// What a rank keeps of one tensor: all of it, a range of its rows (output features; a
// vector's elements), a range of its columns (input features), or nothing (a routed expert
// another rank holds).
enum class Cut { kAll, kRows, kColumns, kNone };
struct SliceRule {
  Cut cut = Cut::kAll;
  IndexRange range;
};

// The rule for one tensor, by its Hugging Face name (core/model/weight_layout.h lists them).
SliceRule RuleFor(const WeightSlot& slot, const ModelConfig& c, const RankLayout& l) {
  const std::string& n = slot.name;
  const auto times = [](IndexRange r, int64_t width) {
    return IndexRange{r.begin * width, r.count * width};
  };
  if (absl::EndsWith(n, "embed_tokens.weight") || absl::EndsWith(n, "lm_head.weight") ||
      absl::EndsWith(n, "shared_head.head.weight")) {
    return {Cut::kRows, l.vocab};
  }
  if (slot.expert >= 0) {  // a routed expert
    if (!l.expert_width_split) {
      const bool held = slot.expert >= l.experts.begin && slot.expert < l.experts.end();
      return {held ? Cut::kAll : Cut::kNone, {}};
    }
    return {slot.part == ExpertPart::kDown ? Cut::kColumns : Cut::kRows, l.ExpertWidth(c)};
  }
  const bool down = absl::EndsWith(n, "down_proj.weight");
  if (absl::StrContains(n, "mlp.shared_experts.")) {
    return {down ? Cut::kColumns : Cut::kRows, l.SharedWidth(c)};
  }
  if (absl::EndsWith(n, "mlp.gate_proj.weight") || absl::EndsWith(n, "mlp.up_proj.weight") ||
      absl::EndsWith(n, "mlp.down_proj.weight")) {
    return {down ? Cut::kColumns : Cut::kRows, l.DenseWidth(c)};
  }
  if (!absl::StrContains(n, "self_attn.")) return {};  // norms, router, eh_proj: replicated
  if (c.is_mla()) {
    if (absl::EndsWith(n, "q_b_proj.weight")) return {Cut::kRows, times(l.q_heads, c.qk_head_dim())};
    if (absl::EndsWith(n, "kv_b_proj.weight")) {
      return {Cut::kRows, times(l.q_heads, c.qk_nope_head_dim + c.v_head_dim)};
    }
    if (absl::EndsWith(n, "o_proj.weight")) return {Cut::kColumns, times(l.q_heads, c.v_head_dim)};
    return {};  // q_a / kv_a projections, their norms, the indexer
  }
  if (absl::EndsWith(n, "q_proj.weight") || absl::EndsWith(n, "q_proj.bias")) {
    return {Cut::kRows, times(l.q_heads, c.head_dim)};
  }
  if (absl::EndsWith(n, "k_proj.weight") || absl::EndsWith(n, "v_proj.weight") ||
      absl::EndsWith(n, "k_proj.bias") || absl::EndsWith(n, "v_proj.bias")) {
    return {Cut::kRows, times(l.kv_heads, c.head_dim)};
  }
  if (absl::EndsWith(n, "o_proj.weight")) return {Cut::kColumns, times(l.q_heads, c.head_dim)};
  return {};  // q_norm, k_norm
}

// Columns [begin, begin + count) of every row, copied into a buffer added to `storage`.
absl::StatusOr<Matrix> ColumnSlice(const Matrix& m, IndexRange cols, const std::string& name,
                                   std::vector<std::shared_ptr<const void>>* storage) {
  Matrix out = m;
  out.cols = cols.count;
  // Scales along a row come in blocks of `group` columns; a slice must start on a block and
  // end on one (or at the row's end) so the rank's scales are whole blocks of the original.
  int64_t group = 0;
  if (m.format == WeightFormat::kInt8Groups) group = kInt8Group;
  if (m.format == WeightFormat::kFp8Scaled && m.scale_block_cols < m.cols) {
    group = m.scale_block_cols;
  }
  if (group > 0 && (cols.begin % group != 0 || (cols.count % group != 0 && cols.end() != m.cols))) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": columns [", cols.begin, ", ", cols.end(),
                     ") do not fall on its scale blocks of ", group, " columns"));
  }
  const int64_t elem = m.format == WeightFormat::kDense ? DTypeSize(m.dtype) : 1;
  auto codes = std::shared_ptr<char[]>(new char[m.rows * cols.count * elem]);
  const char* src = static_cast<const char*>(m.data);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(codes.get() + r * cols.count * elem, src + (r * m.cols + cols.begin) * elem,
                cols.count * elem);
  }
  out.data = codes.get();
  storage->push_back(codes);
  if (group > 0) {  // the scale columns of the kept blocks, every scale row
    const int64_t in_cols = m.scale_cols(), kept = out.scale_cols(), rows = m.scale_rows();
    auto scales = std::shared_ptr<float[]>(new float[rows * kept]);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(m.scales + r * in_cols + cols.begin / group, kept, scales.get() + r * kept);
    }
    out.scales = scales.get();
    storage->push_back(scales);
  }
  return out;
}

}  // namespace

int64_t WeightSplitUnit(const ModelWeights& weights) {
  if (weights.linear_format == WeightFormat::kInt8Groups) return kInt8Group;
  int64_t unit = 1;
  for (Matrix* m : const_cast<ModelWeights&>(weights).LinearMatrices()) {
    if (m->format == WeightFormat::kFp8Scaled && m->scale_block_cols < m->cols) {
      unit = std::max<int64_t>(unit, m->scale_block_cols);
    }
  }
  return unit;
}

absl::StatusOr<ModelWeights> ShardWeights(const ModelWeights& whole, const RankLayout& layout) {
  if (!whole.device_generated_fp8.empty()) {
    return absl::FailedPreconditionError(
        "FP8 preset codes generated on the device cannot be sliced on the host: load a "
        "checkpoint or a host preset for tensor parallel");
  }
  const ModelConfig& c = whole.config;
  ModelWeights rank = whole;  // matrices are views: copying them copies no weights
  for (const WeightSlot& slot : ListWeightSlots(&rank)) {
    const SliceRule rule = RuleFor(slot, c, layout);
    if (slot.vector != nullptr) {
      if (rule.cut == Cut::kRows) {
        std::vector<float>& v = *slot.vector;
        v = std::vector<float>(v.begin() + rule.range.begin, v.begin() + rule.range.end());
      }
      continue;
    }
    Matrix& m = *slot.matrix;
    switch (rule.cut) {
      case Cut::kAll:
        break;
      case Cut::kNone:
        m = Matrix{};
        break;
      case Cut::kRows:
        m = m.RowSlice(rule.range.begin, rule.range.count);
        break;
      case Cut::kColumns: {
        absl::StatusOr<Matrix> cut = ColumnSlice(m, rule.range, slot.name, &rank.storage);
        if (!cut.ok()) return cut.status();
        m = *cut;
        break;
      }
    }
  }
  FinishWeights(&rank);  // ties the head (and the MTP head) to the sliced embedding
  rank.config = layout.LocalConfig(c);
  return rank;
}

}  // namespace glmserve
