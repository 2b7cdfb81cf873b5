// Device-side FP8 weight reads for kernels other than fp8_linear.cu's (GLM-5's absorbed MLA,
// mla.cu and mla_tc.cu, reads kv_b_proj's codes directly): the value of element (r, c) is the
// CPU's, e4m3 widened exactly and multiplied by its block's fp32 scale in one fp32 rounding
// (core/model/fp8.h). fp8_linear.cu reads weights through the same function.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda::dev {

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
