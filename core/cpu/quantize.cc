#include "core/cpu/quantize.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/huge_pages.h"
#include "core/base/parallel.h"
#include "core/base/status_macros.h"

namespace glmserve {

namespace {

constexpr struct {
  WeightQuant quant;
  const char* name;
} kWeightQuantNames[] = {{WeightQuant::kStored, "stored"},
                         {WeightQuant::kInt8, "int8"},
                         {WeightQuant::kFp8Channel, "fp8_channel"},
                         {WeightQuant::kFp8Block, "fp8_block"}};

constexpr float kE4m3Max = 448.0f;
constexpr int64_t kFp8Block = 128;  // the released block-scaled checkpoints' block side

}  // namespace

const char* WeightQuantName(WeightQuant q) {
  for (const auto& entry : kWeightQuantNames) {
    if (entry.quant == q) return entry.name;
  }
  return "?";
}

absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name) {
  for (const auto& entry : kWeightQuantNames) {
    if (name == entry.name) return entry.quant;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weight dtype '", name.substr(0, 64),
                   "' is not one of stored, int8, fp8_channel, fp8_block"));
}

absl::Status CheckWeightQuantMath(WeightQuant quant, CpuMath math) {
  if (quant == WeightQuant::kInt8 && math == CpuMath::kExact) {
    return absl::InvalidArgumentError(
        "--weight_dtype=int8 is a choice within the approximate arithmetic: pass "
        "--cpu_math=bf16 (or bf16_amx) with it");
  }
  return absl::OkStatus();
}

namespace {

// amax of v[0, n), or NaN when a value is not finite.
float GroupAmax(const float* v, int64_t n) {
  float amax = 0;
  for (int64_t c = 0; c < n; ++c) {
    if (!std::isfinite(v[c])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(v[c]));
  }
  return amax;
}

// q[i] = round(v[i] / scale), ties to even (nearbyint in the default rounding mode); all zero
// for a zero or NaN scale. |v / scale| <= 127 up to rounding: the clamp guards that last ulp.
void QuantizeWithScale(const float* v, int64_t n, float scale, int8_t* q) {
  for (int64_t c = 0; c < n; ++c) {
    const float r = scale > 0 ? std::nearbyint(v[c] / scale) : 0.0f;
    q[c] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
}

// A non-negative float rounded up to the next bf16 (itself if it is one); NaN stays NaN.
uint16_t RoundUpToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0xFFFFu) != 0) bits += 0x10000u;
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

float QuantizeGroupInt8(const float* v, int64_t n, int8_t* q) {
  const float scale = GroupAmax(v, n) / 127.0f;
  QuantizeWithScale(v, n, scale, q);
  return scale;
}

uint16_t QuantizeWeightGroupInt8(const float* v, int64_t n, int8_t* q) {
  const uint16_t scale = RoundUpToBf16(GroupAmax(v, n) / 127.0f);
  QuantizeWithScale(v, n, Bf16ToFloat(scale), q);
  return scale;
}

void QuantizeMatrixInt8(const Matrix& m, int8_t* q, uint16_t* scales) {
  const int64_t groups = m.scale_cols();
  std::vector<float> row(m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) row[c] = LoadAsFloat(m.data, m.dtype, r * m.cols + c);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kInt8Group, end = std::min(m.cols, begin + kInt8Group);
      scales[r * groups + g] =
          QuantizeWeightGroupInt8(row.data() + begin, end - begin, q + r * m.cols + begin);
    }
  }
}

void InterleaveInt8Rows16(const int8_t* q, const uint16_t* scales, int64_t rows, int64_t cols,
                          int8_t* out_q, uint16_t* out_scales) {
  const int64_t groups = (cols + kInt8Group - 1) / kInt8Group;
  const int64_t blocks = (rows + kInt8BlockRows - 1) / kInt8BlockRows;
  std::memset(out_q, 0, static_cast<size_t>(blocks * groups * kInt8BlockGroupBytes));
  std::memset(out_scales, 0, static_cast<size_t>(blocks * groups * kInt8BlockRows) * 2);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / kInt8BlockRows, lane = r % kInt8BlockRows;
    for (int64_t g = 0; g < groups; ++g) {
      int8_t* unit = out_q + (b * groups + g) * kInt8BlockGroupBytes + lane * 4;
      const int64_t begin = g * kInt8Group, len = std::min(kInt8Group, cols - begin);
      for (int64_t i = 0; i < len; ++i) unit[i / 4 * 64 + i % 4] = q[r * cols + begin + i];
      out_scales[(b * groups + g) * kInt8BlockRows + lane] = scales[r * groups + g];
    }
  }
}

void QuantizeMatrixFp8(const Matrix& m, int64_t br, int64_t bc, uint8_t* codes, float* scales) {
  const int64_t scale_cols = (m.cols + bc - 1) / bc;
  for (int64_t r0 = 0; r0 < m.rows; r0 += br) {
    const int64_t r1 = std::min(m.rows, r0 + br);
    for (int64_t c0 = 0; c0 < m.cols; c0 += bc) {
      const int64_t c1 = std::min(m.cols, c0 + bc);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(LoadAsFloat(m.data, m.dtype, r * m.cols + c)));
        }
      }
      // NaN fails amax > 0 and keeps scale 1: the NaN weight's own code stays NaN.
      const float scale = amax > 0 ? amax / kE4m3Max : 1.0f;
      scales[r0 / br * scale_cols + c0 / bc] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          codes[r * m.cols + c] = FloatToE4m3(LoadAsFloat(m.data, m.dtype, r * m.cols + c) / scale);
        }
      }
    }
  }
}

namespace {

// One buffer for weights quantized at load, parts of `sizes` bytes each at 64-byte aligned
// `offsets`: on cache lines (the AMX int8 kernel loads 16 rows of 32 bytes in place per tile,
// and a load that straddles lines runs at a fraction of its rate: docs/cpu_math.md) and on huge
// pages, as the checkpoint's weights are (core/base/huge_pages.h): a decode step streams all of
// it, and on 4 KiB pages each kernel task's rows (one page each at K = 4096) paid a TLB miss and
// a restart of the hardware prefetcher per page. `what` names the quantization in the error.
absl::StatusOr<std::shared_ptr<char[]>> QuantizedBuffer(const std::vector<int64_t>& sizes,
                                                        std::vector<int64_t>* offsets,
                                                        const char* what) {
  int64_t total = 0;
  offsets->resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    (*offsets)[i] = total;
    total += (sizes[i] + 63) / 64 * 64;
  }
  const size_t n = static_cast<size_t>(std::max<int64_t>(total, 1));
  char* raw = static_cast<char*>(AllocateHugePageable(n));
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " quantization needs ", total, " bytes of memory"));
  }
  return std::shared_ptr<char[]>(raw, [n](char* p) { FreeHugePageable(p, n); });
}

// kFp8Channel / kFp8Block (QuantizeWeights): one buffer for all, [codes of every matrix][scales
// of every matrix], matrices in parallel.
absl::Status QuantizeWeightsFp8(ModelWeights* weights, bool per_channel) {
  std::vector<Matrix*> matrices;
  for (Matrix* m : weights->LinearMatrices()) {
    const bool head = m == &weights->lm_head || (weights->mtp && m == &weights->mtp->head);
    if (!head) matrices.push_back(m);
  }
  const size_t n = matrices.size();
  std::vector<int64_t> br(n), bc(n), sizes(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const Matrix& m = *matrices[i];
    br[i] = per_channel ? 1 : kFp8Block;
    bc[i] = per_channel ? m.cols : kFp8Block;
    sizes[i] = m.rows * m.cols;
    sizes[n + i] = ((m.rows + br[i] - 1) / br[i]) * ((m.cols + bc[i] - 1) / bc[i]) *
                   static_cast<int64_t>(sizeof(float));
  }
  std::vector<int64_t> offset;
  ASSIGN_OR_RETURN(const std::shared_ptr<char[]> buffer, QuantizedBuffer(sizes, &offset, "FP8"));
  char* base = buffer.get();
  ParallelFor(static_cast<int64_t>(n), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      QuantizeMatrixFp8(*matrices[i], br[i], bc[i], reinterpret_cast<uint8_t*>(base + offset[i]),
                        reinterpret_cast<float*>(base + offset[n + i]));
    }
  });
  for (size_t i = 0; i < n; ++i) {
    Matrix* m = matrices[i];
    m->dtype = DType::kF8E4M3;
    m->data = base + offset[i];
    m->format = WeightFormat::kFp8Scaled;
    m->scales = reinterpret_cast<const float*>(base + offset[n + i]);
    m->scale_block_rows = static_cast<int32_t>(br[i]);
    m->scale_block_cols = static_cast<int32_t>(std::min<int64_t>(bc[i], INT32_MAX));
    m->scale_row_phase = 0;
  }
  weights->storage.push_back(std::shared_ptr<const void>(buffer, buffer.get()));
  weights->linear_format = WeightFormat::kFp8Scaled;
  weights->weight_dtype = DType::kF8E4M3;
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantizeWeights(ModelWeights* weights, WeightQuant quant, Int8Layout layout) {
  if (quant == WeightQuant::kStored) return absl::OkStatus();
  if (weights->linear_format != WeightFormat::kDense) {
    return absl::FailedPreconditionError("weights are already quantized");
  }
  if (quant == WeightQuant::kFp8Channel || quant == WeightQuant::kFp8Block) {
    return QuantizeWeightsFp8(weights, quant == WeightQuant::kFp8Channel);
  }
  std::vector<Matrix*> matrices = weights->LinearMatrices();
  const bool rows16 = layout == Int8Layout::kRows16;
  // One buffer for all (QuantizedBuffer): [q of every matrix][scales of every matrix].
  const size_t n = matrices.size();
  std::vector<int64_t> sizes(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const Matrix& m = *matrices[i];
    // kRows16: whole 16-row blocks of whole groups.
    const int64_t rows =
        rows16 ? (m.rows + kInt8BlockRows - 1) / kInt8BlockRows * kInt8BlockRows : m.rows;
    const int64_t cols = rows16 ? m.scale_cols() * kInt8Group : m.cols;
    sizes[i] = rows * cols;
    sizes[n + i] = rows * m.scale_cols() * int64_t{sizeof(uint16_t)};
  }
  std::vector<int64_t> offset;
  ASSIGN_OR_RETURN(const std::shared_ptr<char[]> buffer, QuantizedBuffer(sizes, &offset, "int8"));
  // Rows of all matrices in one parallel loop, in chunks of up to 64 rows (whole kRows16
  // blocks).
  struct Chunk {
    size_t matrix;
    int64_t row, rows;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < matrices.size(); ++i) {
    for (int64_t r = 0; r < matrices[i]->rows; r += 64) {
      chunks.push_back({i, r, std::min<int64_t>(64, matrices[i]->rows - r)});
    }
  }
  char* base = buffer.get();
  ParallelFor(static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& ch = chunks[c];
      const Matrix& m = *matrices[ch.matrix];
      int8_t* q = reinterpret_cast<int8_t*>(base + offset[ch.matrix]);
      uint16_t* scales = reinterpret_cast<uint16_t*>(base + offset[n + ch.matrix]);
      if (!rows16) {
        QuantizeMatrixInt8(m.RowSlice(ch.row, ch.rows), q + ch.row * m.cols,
                           scales + ch.row * m.scale_cols());
        continue;
      }
      // Row-major first, then into the chunk's blocks (ch.row is a multiple of 16).
      thread_local std::vector<int8_t> tq;
      thread_local std::vector<uint16_t> ts;
      tq.resize(static_cast<size_t>(ch.rows * m.cols));
      ts.resize(static_cast<size_t>(ch.rows * m.scale_cols()));
      QuantizeMatrixInt8(m.RowSlice(ch.row, ch.rows), tq.data(), ts.data());
      const int64_t block = ch.row / kInt8BlockRows;
      InterleaveInt8Rows16(tq.data(), ts.data(), ch.rows, m.cols,
                           q + block * m.scale_cols() * kInt8BlockGroupBytes,
                           scales + block * m.scale_cols() * kInt8BlockRows);
    }
  });
  for (size_t i = 0; i < matrices.size(); ++i) {
    Matrix* m = matrices[i];
    m->data = base + offset[i];
    m->group_scales = reinterpret_cast<const uint16_t*>(base + offset[n + i]);
    m->format = WeightFormat::kInt8Groups;
    m->int8_layout = layout;
    m->int8_row_phase = 0;
  }
  weights->storage.push_back(std::shared_ptr<const void>(buffer, buffer.get()));
  weights->linear_format = WeightFormat::kInt8Groups;
  weights->int8_layout = layout;
  return absl::OkStatus();
}

}  // namespace glmserve
