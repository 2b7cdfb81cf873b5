#include "core/model/weight_shard.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/model/parallel_plan.h"
#include "core/model/weight_layout.h"

namespace glmserve {
namespace {

// Scale columns [first, first + out.scale_cols()) of every scale row of m, copied into a buffer
// added to `storage` (T: float for FP8 scales, the bf16 bits of int8 group scales).
template <typename T>
const T* KeptScaleColumns(const T* scales, const Matrix& m, const Matrix& out, int64_t first,
                          std::vector<std::shared_ptr<const void>>* storage) {
  const int64_t in_cols = m.scale_cols(), kept = out.scale_cols(), rows = m.scale_rows();
  auto copy = std::shared_ptr<T[]>(new T[rows * kept]);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(scales + r * in_cols + first, kept, copy.get() + r * kept);
  }
  storage->push_back(copy);
  return copy.get();
}

// Int8Layout::kRows16: the groups [first, first + out.scale_cols()) of every block, codes and
// scales, copied into buffers added to `storage` (the rows and their phase unchanged).
void KeptRows16Groups(const Matrix& m, int64_t first, Matrix* out,
                      std::vector<std::shared_ptr<const void>>* storage) {
  const int64_t blocks = m.int8_blocks(), in = m.scale_cols(), kept = out->scale_cols();
  auto codes = std::shared_ptr<int8_t[]>(new int8_t[blocks * kept * kInt8BlockGroupBytes]);
  auto scales = std::shared_ptr<uint16_t[]>(new uint16_t[blocks * kept * kInt8BlockRows]);
  const int8_t* src = static_cast<const int8_t*>(m.data);
  for (int64_t b = 0; b < blocks; ++b) {
    std::memcpy(codes.get() + b * kept * kInt8BlockGroupBytes,
                src + (b * in + first) * kInt8BlockGroupBytes, kept * kInt8BlockGroupBytes);
    std::copy_n(m.group_scales + (b * in + first) * kInt8BlockRows, kept * kInt8BlockRows,
                scales.get() + b * kept * kInt8BlockRows);
  }
  out->data = codes.get();
  out->group_scales = scales.get();
  storage->push_back(codes);
  storage->push_back(scales);
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
  if (m.format == WeightFormat::kInt8Groups && m.int8_layout == Int8Layout::kRows16) {
    // A slice that ends at the row's end keeps the last group's zero padding.
    KeptRows16Groups(m, cols.begin / group, &out, storage);
    return out;
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
    if (m.format == WeightFormat::kInt8Groups) {
      out.group_scales = KeptScaleColumns(m.group_scales, m, out, cols.begin / group, storage);
    } else {
      out.scales = KeptScaleColumns(m.scales, m, out, cols.begin / group, storage);
    }
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
  // Which part of each tensor the rank keeps: parallel_plan.h's SliceOfSlot, the rule the
  // memory planner counts with.
  for (const WeightSlot& slot : ListWeightSlots(&rank)) {
    const SlotSlice cut = SliceOfSlot(c, layout, slot);
    if (slot.vector != nullptr) {
      std::vector<float>& v = *slot.vector;
      if (cut.rows.count != static_cast<int64_t>(v.size())) {
        v = std::vector<float>(v.begin() + cut.rows.begin, v.begin() + cut.rows.end());
      }
      continue;
    }
    Matrix& m = *slot.matrix;
    if (m.empty()) continue;
    if (cut.empty()) {  // a routed expert another rank holds
      m = Matrix{};
      continue;
    }
    if (cut.rows.count != m.rows) m = m.RowSlice(cut.rows.begin, cut.rows.count);
    if (cut.cols.count != m.cols) {
      absl::StatusOr<Matrix> sliced = ColumnSlice(m, cut.cols, slot.name, &rank.storage);
      if (!sliced.ok()) return sliced.status();
      m = *sliced;
    }
  }
  FinishWeights(&rank);  // ties the head (and the MTP head) to the sliced embedding
  rank.config = layout.LocalConfig(c);
  return rank;
}

}  // namespace glmserve
