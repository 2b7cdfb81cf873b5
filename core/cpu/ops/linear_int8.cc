// The int8-weight arithmetic (linear.h, "group-serial"): activations quantized per 32-wide group
// like the weights, one exact int32 dot per group, one FMA per group with the two scales'
// product, groups in order. This file holds the activation quantizer and packer (used by every
// kernel), the choice of operands, and the portable kernel: the reference that the AMX, VNNI
// and AVX2 kernels match bit for bit (tests/core/cpu/ops/linear_int8_test.cc).
//
// Why not widen int8 to bf16 and use vdpbf16ps (the first kernel): on Intel CPUs the bf16
// dot product runs at about half the fp32 FMA rate, and the widening (two conversions per 16
// weights) made decode compute-bound at the bf16 mode's time despite half the bytes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {

Int8Operands Int8OperandsFor(int64_t m, Int8Layout layout) {
  if (CpuHasAmxInt8() || Int8AmxTileModelForced()) {
    if (layout == Int8Layout::kRowMajor) return Int8Operands::kAmxTiles;
    if (m >= kInt8AmxRows16MinRows) return Int8Operands::kAmxRows;
    // Fewer rows: VNNI's decode kernel below (every AMX-INT8 CPU so far has AVX512-VNNI).
  }
  const int64_t tile_rows =
      layout == Int8Layout::kRows16 ? kInt8Rows16TileMinRows : kInt8VnniMinRows;
  if (CpuHasAvx512Vnni() && m >= tile_rows) return Int8Operands::kVnniTiles;
  return Int8Operands::kGroups;
}

void QuantizeActivationInt8(const float* x, int64_t m, int64_t k, Int8Activation* a,
                            Int8Operands operands) {
  a->m = m;
  a->k = k;
  a->kp = (k + 63) / 64 * 64;
  a->operands = operands;
  const int64_t kp = a->kp, groups = kp / kInt8Group;
  // kAmxRows: the A tiles read whole 16-row blocks of q in place, so the rows past m are zeros.
  const int64_t q_rows = operands == Int8Operands::kAmxRows ? (m + 15) / 16 * 16 : m;
  a->q.assign(q_rows * kp, 0);
  a->group_scale.assign(m * groups, 0.0f);
  const bool avx2 = CpuHasAvx2Fma();
  auto row = [&](int64_t i) {
    int8_t* q = a->q.data() + i * kp;
    float* group_scale = a->group_scale.data() + i * groups;
    if (avx2) {
      QuantizeRowInt8Avx2(x + i * k, k, q, group_scale);
      return;
    }
    for (int64_t g = 0; g * kInt8Group < k; ++g) {
      const int64_t begin = g * kInt8Group;
      group_scale[g] =
          QuantizeGroupInt8(x + i * k + begin, std::min(kInt8Group, k - begin), q + begin);
    }
  };
  // Decode-sized activations on the caller: waking the pool costs more than the work.
  const bool small = m * k <= (int64_t{1} << 16);
  if (small) {
    for (int64_t i = 0; i < m; ++i) row(i);
  } else {
    ParallelFor(m, 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) row(i);
    });
  }
  if (operands == Int8Operands::kAmxRows) {
    a->tiles.clear();
    a->tile_scale.clear();
    a->group_sum.clear();
    return;
  }
  if (operands == Int8Operands::kGroups) {
    a->tiles.clear();
    a->tile_scale.clear();
    // Only the VNNI kernels read them (exact in int32: |sum| <= 32 x 127).
    if (!CpuHasAvx512Vnni() && !CpuHasAvxVnni()) {
      a->group_sum.clear();
      return;
    }
    a->group_sum.resize(m * groups);
    for (int64_t i = 0; i < m * groups; ++i) {
      int32_t sum = 0;
      for (int64_t t = 0; t < kInt8Group; ++t) sum += a->q[i * kInt8Group + t];
      a->group_sum[i] = sum;
    }
    return;
  }
  a->group_sum.clear();
  // Every word and scale is written by the packing (padding rows as zeros).
  const int64_t blocks = (m + kAmxTileRows - 1) / kAmxTileRows;
  a->tiles.resize(Int8AmxTilesSize(m, kp));
  a->tile_scale.resize(blocks * groups * kAmxTileRows);
  ParallelFor(blocks, small ? blocks : 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) PackInt8AmxBlock(a, b);
  });
}

void Int8BlockGeneric(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const Int8Activation& x = *job.x;
  const int64_t n_rows = w.rows, k_total = w.cols, groups = w.scale_cols();
  const int64_t x_groups = x.kp / kInt8Group;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const int8_t* q = static_cast<const int8_t*>(w.data);
  // kRows16: each row gathered into row-major order first.
  thread_local std::vector<int8_t> row_codes;
  thread_local std::vector<uint16_t> row_scales;
  for (int64_t n = n0; n < n0 + nn; ++n) {
    const int8_t* wq = q + n * k_total;
    const uint16_t* ws = w.group_scales + n * groups;
    if (w.int8_layout == Int8Layout::kRows16) {
      row_codes.resize(k_total);
      row_scales.resize(groups);
      for (int64_t t = 0; t < k_total; ++t) row_codes[t] = w.Int8Code(n, t);
      for (int64_t g = 0; g < groups; ++g) row_scales[g] = w.Int8Scale(n, g);
      wq = row_codes.data();
      ws = row_scales.data();
    }
    for (int64_t i = job.row_begin; i < job.RowEnd(); ++i) {
      const int8_t* xq = x.q.data() + i * x.kp;
      const float* xs = x.group_scale.data() + i * x_groups;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * kInt8Group, len = std::min(kInt8Group, k_total - begin);
        int32_t d = 0;  // exact: |d| <= 32 * 127 * 127
        for (int64_t t = begin; t < begin + len; ++t) d += int32_t{xq[t]} * wq[t];
        acc = std::fma(static_cast<float>(d), xs[g] * Bf16ToFloat(ws[g]), acc);
      }
      if (job.bias != nullptr) acc += job.bias[n];
      job.y[i * n_rows + n] = acc;
    }
  }
}

}  // namespace glmserve::internal

namespace glmserve {

Int8Layout Int8LayoutForThisCpu() {
  // Every kernel for kRows16 (AVX512-VNNI, AVX-VNNI, AVX2) needs at least AVX2 + FMA.
  return internal::CpuHasAvx2Fma() ? Int8Layout::kRows16 : Int8Layout::kRowMajor;
}

}  // namespace glmserve
