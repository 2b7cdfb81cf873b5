// Test helper: an fp32 matrix quantized to the int8 weight format (core/cpu/quantize.h), owning
// its codes and scales, with a Matrix view of them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu/quantize.h"
#include "core/model/weights.h"

namespace glmserve::testing {

struct Int8Matrix {
  std::vector<int8_t> q;         // row-major [rows, cols], whatever the view's layout
  std::vector<uint16_t> scales;  // bf16 bits, row-major [rows, groups]
  // Int8Layout::kRows16: the same codes and scales interleaved (the view points here).
  std::vector<int8_t> rows16_q;
  std::vector<uint16_t> rows16_scales;
  Matrix view;  // points into q and scales or the rows16 copies (a move keeps their buffers)
};

inline Int8Matrix QuantizeInt8(const std::vector<float>& w, int64_t rows, int64_t cols,
                               Int8Layout layout = Int8Layout::kRowMajor) {
  Int8Matrix out;
  const Matrix dense{DType::kF32, rows, cols, w.data()};
  const int64_t groups = dense.scale_cols();
  out.q.resize(rows * cols);
  out.scales.resize(rows * groups);
  QuantizeMatrixInt8(dense, out.q.data(), out.scales.data());
  out.view = Matrix{DType::kF32, rows, cols, out.q.data(), WeightFormat::kInt8Groups};
  out.view.group_scales = out.scales.data();
  if (layout == Int8Layout::kRows16) {
    const int64_t blocks = (rows + kInt8BlockRows - 1) / kInt8BlockRows;
    out.rows16_q.resize(blocks * groups * kInt8BlockGroupBytes);
    out.rows16_scales.resize(blocks * groups * kInt8BlockRows);
    InterleaveInt8Rows16(out.q.data(), out.scales.data(), rows, cols, out.rows16_q.data(),
                         out.rows16_scales.data());
    out.view.data = out.rows16_q.data();
    out.view.group_scales = out.rows16_scales.data();
    out.view.int8_layout = Int8Layout::kRows16;
  }
  return out;
}

}  // namespace glmserve::testing
