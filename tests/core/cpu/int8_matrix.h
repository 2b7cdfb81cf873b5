// Test helper: an fp32 matrix quantized to the int8 weight format (core/cpu/quantize.h), owning
// its codes and scales, with a Matrix view of them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu/quantize.h"
#include "core/model/weights.h"

namespace glmserve::testing {

struct Int8Matrix {
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;  // bf16 bits
  Matrix view;                   // points into q and scales (a move keeps their buffers)
};

inline Int8Matrix QuantizeInt8(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Int8Matrix out;
  const Matrix dense{DType::kF32, rows, cols, w.data()};
  out.q.resize(rows * cols);
  out.scales.resize(rows * dense.scale_cols());
  QuantizeMatrixInt8(dense, out.q.data(), out.scales.data());
  out.view = Matrix{DType::kF32, rows, cols, out.q.data(), WeightFormat::kInt8Groups};
  out.view.group_scales = out.scales.data();
  return out;
}

}  // namespace glmserve::testing
