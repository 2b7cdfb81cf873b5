// Device-side FP8 weight reads for kernels other than fp8_linear.cu's (GLM-5's absorbed MLA,
// mla.cu and mla_tc.cu, reads kv_b_proj's codes directly): the value of element (r, c) is the CPU's, e4m3 widened
// exactly and multiplied by its block's fp32 scale in one fp32 rounding (core/fp8.h).
// fp8_linear.cu keeps its own copy of these two functions (issue 14's branch rewrites that
// file); they are bit-identical and may be folded into this header when both have merged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/kernels.h"

namespace glmserve::cuda::dev {

// e4m3 to fp32: the code's bits moved to fp32's exponent/mantissa read as value x 2^-120
// (subnormals included, as fp32 denormals), fixed by an exact multiply; S.1111.111 is NaN.
__device__ __forceinline__ float E4m3ToFloat(uint8_t v) {
  const uint32_t mag = v & 0x7fu;
  if (mag == 0x7fu) return __uint_as_float(0x7fc00000u);
  const float x = __uint_as_float(mag << 20) * 0x1p120f;
  return (v & 0x80u) ? -x : x;
}

// w[r, c] (scale blocks of any shape, partial edge blocks included).
__device__ __forceinline__ float Fp8At(const Fp8DeviceMatrix& w, int64_t r, int64_t c) {
  const int64_t scale_cols = (w.cols + w.block_cols - 1) / w.block_cols;
  return E4m3ToFloat(w.codes[r * w.cols + c]) *
         w.scales[(r / w.block_rows) * scale_cols + c / w.block_cols];
}

// Element (r, c) of a weight matrix held either as bf16 (w16 set, rows of w8.cols values) or
// as FP8 (w8's codes set): GLM-5's kv_b_proj, read by the absorbed attention kernels. A
// run-time choice, uniform across the grid.
__device__ __forceinline__ float Bf16OrFp8At(const uint16_t* w16, const Fp8DeviceMatrix& w8,
                                             int64_t r, int64_t c) {
  if (w8.codes != nullptr) return Fp8At(w8, r, c);
  return __uint_as_float(static_cast<uint32_t>(w16[r * w8.cols + c]) << 16);
}

}  // namespace glmserve::cuda::dev
