// Matrix's int8 layouts (core/model/weights.h): Int8Layout::kRows16 built here byte by byte from
// its definition, read back through Int8Code / Int8Scale, its size, and RowSlices that start
// inside a block (a row phase), alone and nested. The kernels that read it are tested in
// tests/core/cpu/ops/linear_int8_test.cc, the quantizer that writes it in quantize_test.cc.
#include "core/model/weights.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace glmserve {
namespace {

int8_t Code(int64_t r, int64_t c) { return static_cast<int8_t>((r * 31 + c * 7) % 255 - 127); }
uint16_t Scale(int64_t r, int64_t g) { return static_cast<uint16_t>(0x3C00 + r * 16 + g); }

// A rows x cols int8 matrix in kRows16, written from the layout's definition: block b, group g,
// byte 64 p + 4 r + j = code (16 b + r, 32 g + 4 p + j); zeros past the rows and columns.
struct Rows16 {
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;
  Matrix view;
};
Rows16 MakeRows16(int64_t rows, int64_t cols) {
  const int64_t groups = (cols + 31) / 32, blocks = (rows + 15) / 16;
  Rows16 m;
  m.q.assign(blocks * groups * 512, 0);
  m.scales.assign(blocks * groups * 16, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < 16 && 16 * b + r < rows; ++r) {
        m.scales[(b * groups + g) * 16 + r] = Scale(16 * b + r, g);
        for (int64_t p = 0; p < 8; ++p) {
          for (int64_t j = 0; j < 4; ++j) {
            const int64_t c = 32 * g + 4 * p + j;
            if (c < cols) m.q[(b * groups + g) * 512 + 64 * p + 4 * r + j] = Code(16 * b + r, c);
          }
        }
      }
    }
  }
  m.view = Matrix{DType::kBF16, rows, cols, m.q.data(), WeightFormat::kInt8Groups};
  m.view.group_scales = m.scales.data();
  m.view.int8_layout = Int8Layout::kRows16;
  return m;
}

void ExpectRows(const Matrix& m, int64_t first_row) {
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      ASSERT_EQ(m.Int8Code(r, c), Code(first_row + r, c)) << "row " << r << " col " << c;
    }
    for (int64_t g = 0; g < m.scale_cols(); ++g) {
      ASSERT_EQ(m.Int8Scale(r, g), Scale(first_row + r, g)) << "row " << r << " group " << g;
    }
  }
}

TEST(MatrixInt8, Rows16ReadsBackItsDefinition) {
  const Rows16 m = MakeRows16(37, 70);  // a partial last block and a partial last group
  EXPECT_EQ(m.view.int8_blocks(), 3);
  EXPECT_EQ(m.view.scale_cols(), 3);
  EXPECT_EQ(m.view.bytes(), 3 * 3 * (512 + 16 * 2));
  ExpectRows(m.view, 0);
}

TEST(MatrixInt8, Rows16RowSlicesCarryTheirPhase) {
  const Rows16 m = MakeRows16(70, 45);
  for (auto [begin, count] :
       {std::pair<int64_t, int64_t>{0, 70}, {5, 11}, {16, 16}, {21, 40}, {63, 7}, {69, 1}}) {
    const Matrix s = m.view.RowSlice(begin, count);
    EXPECT_EQ(s.rows, count);
    EXPECT_EQ(s.int8_row_phase, begin % 16) << begin;
    EXPECT_EQ(s.int8_blocks(), (begin % 16 + count + 15) / 16) << begin;
    ExpectRows(s, begin);
    // Row r sits in lane int8_lane(r) of block int8_block(r), whose lane 0 holds
    // int8_block_row0 of it.
    for (int64_t r = 0; r < count; ++r) {
      EXPECT_EQ(s.int8_block(r), (begin % 16 + r) / 16) << begin << " " << r;
      EXPECT_EQ(s.int8_block_row0(s.int8_block(r)) + s.int8_lane(r), r) << begin << " " << r;
    }
    // A slice of a slice: the phases add up across the block boundary.
    if (count > 4) {
      const Matrix inner = s.RowSlice(3, count - 4);
      EXPECT_EQ(inner.int8_row_phase, (begin + 3) % 16) << begin;
      ExpectRows(inner, begin + 3);
    }
  }
}

TEST(MatrixInt8, RowMajorAccessorsReadRows) {
  const int64_t rows = 5, cols = 40, groups = 2;
  std::vector<int8_t> q(rows * cols);
  std::vector<uint16_t> scales(rows * groups);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = Code(r, c);
    for (int64_t g = 0; g < groups; ++g) scales[r * groups + g] = Scale(r, g);
  }
  Matrix m{DType::kBF16, rows, cols, q.data(), WeightFormat::kInt8Groups};
  m.group_scales = scales.data();
  ExpectRows(m, 0);
  ExpectRows(m.RowSlice(2, 3), 2);
  EXPECT_EQ(m.bytes(), rows * cols + rows * groups * 2);
}

}  // namespace
}  // namespace glmserve
