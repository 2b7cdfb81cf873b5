// The int8-weight arithmetic (linear.h): activations quantized per 32-wide group like the
// weights, exact int32 dot products of 4 elements per lane slot, one FMA per slot with the two
// scales' product. This file holds the activation quantizer (used by every kernel) and the
// portable kernel, the reference that the AVX512-VNNI kernel (linear_int8_avx512vnni.cc)
// matches bit for bit (tests/core/cpu/ops/linear_int8_test.cc).
//
// Why not widen int8 to bf16 and use vdpbf16ps (the previous kernel): on Intel CPUs the bf16
// dot product runs at about half the fp32 FMA rate, and the widening (two conversions per 16
// weights) made decode compute-bound at the bf16 mode's time despite half the bytes. One
// vpdpbusd multiplies and sums 64 weight bytes; the step costs ~5 instructions per 64 weights,
// well under what the memory delivers.
#include <algorithm>
#include <cmath>

#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_amx.h"
#include "core/cpu/ops/linear_int8_amx.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {

void QuantizeActivationInt8(const float* x, int64_t m, int64_t k, Int8Activation* a,
                            Int8Operands operands) {
  a->m = m;
  a->k = k;
  a->kp = (k + 63) / 64 * 64;
  const int64_t kp = a->kp, slots = kp / 4, groups = kp / kInt8Group;
  a->q.assign(m * kp, 0);
  a->group_scale.assign(m * groups, 0.0f);
  const bool lanes = operands == Int8Operands::kVnniLanes;
  a->lane_scale.assign(lanes ? m * slots : 0, 0.0f);
  a->lane_minus.assign(lanes ? m * slots : 0, 0);
  const bool avx2 = CpuHasAvx2Fma();
  auto row = [&](int64_t i) {
    int8_t* q = a->q.data() + i * kp;
    float* group_scale = a->group_scale.data() + i * groups;
    if (avx2) {
      QuantizeRowInt8Avx2(x + i * k, k, q, group_scale);
    } else {
      for (int64_t g = 0; g * kInt8Group < k; ++g) {
        const int64_t begin = g * kInt8Group;
        group_scale[g] =
            QuantizeGroupInt8(x + i * k + begin, std::min(kInt8Group, k - begin), q + begin);
      }
    }
    if (!lanes) return;
    // The 8 slots of 4 of a group share its scale; past-the-end groups keep 0.
    float* scale = a->lane_scale.data() + i * slots;
    int32_t* minus = a->lane_minus.data() + i * slots;
    for (int64_t s = 0; s < slots; ++s) {
      scale[s] = group_scale[s / (kInt8Group / 4)];
      minus[s] = -128 * (q[4 * s] + q[4 * s + 1] + q[4 * s + 2] + q[4 * s + 3]);
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
  if (operands != Int8Operands::kAmxTiles) {
    a->tiles.clear();
    a->tile_scale.clear();
    return;
  }
  // Every word and scale is written by the packing (padding rows as zeros).
  const int64_t blocks = (m + kAmxTileRows - 1) / kAmxTileRows;
  a->tiles.resize(Int8AmxTilesSize(m, kp));
  a->tile_scale.resize(blocks * groups * kAmxTileRows);
  ParallelFor(blocks, small ? blocks : 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) PackInt8AmxBlock(a, b);
  });
}

namespace {

// One output element, as linear.h specifies: slot l of step s covers k = 64 s + 4 l .. + 3
// (group (16 s + l) / 8 of 32); the weight's (bf16) scale is 0 past its last group.
float DotInt8(const Int8Activation& x, int64_t i, const int8_t* w, const uint16_t* w_scales,
              int64_t k_total, int64_t groups) {
  const int8_t* xq = x.q.data() + i * x.kp;
  const float* xs = x.group_scale.data() + i * (x.kp / kInt8Group);
  float lane[16] = {};
  for (int64_t k0 = 0; k0 < x.kp; k0 += 64) {
    for (int l = 0; l < 16; ++l) {
      const int64_t slot = k0 / 4 + l, k = 4 * slot;
      int32_t d = 0;
      for (int64_t t = k; t < std::min(k + 4, k_total); ++t) d += int32_t{xq[t]} * w[t];
      const int64_t g = slot / (kInt8Group / 4);
      const float c = xs[g] * (g < groups ? Bf16ToFloat(w_scales[g]) : 0.0f);
      lane[l] = std::fma(static_cast<float>(d), c, lane[l]);
    }
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

}  // namespace

void Int8BlockGeneric(const Int8Job& job, int64_t nb) {
  const Matrix& w = *job.w;
  const int64_t n_rows = w.rows, k_total = w.cols, groups = w.scale_cols();
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  const int8_t* q = static_cast<const int8_t*>(w.data);
  for (int64_t i = 0; i < job.x->m; ++i) {
    for (int64_t n = n0; n < n0 + nn; ++n) {
      float v = DotInt8(*job.x, i, q + n * k_total, w.group_scales + n * groups, k_total, groups);
      if (job.bias != nullptr) v += job.bias[n];
      job.y[i * n_rows + n] = v;
    }
  }
}

}  // namespace glmserve::internal
