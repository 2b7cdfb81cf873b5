// E4M3 conversions on the device with exactly the host's results (core/base/dtype.h): the FP8 KV
// cache (core/model/kv_fp8.h) is written and read by kernels in the CPU's format, so a code written
// on the device decodes to the value the CPU would decode, and the same fp32 input encodes
// to the same code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace glmserve::cuda::dev {

inline constexpr float kE4m3Max = 448.0f;

// e4m3 to fp32: the code's bits moved to fp32's exponent/mantissa read as value x 2^-120
// (subnormals included, as fp32 denormals), fixed by an exact multiply; S.1111.111 is NaN.
__device__ __forceinline__ float E4m3ToFloat(uint8_t v) {
  const uint32_t mag = v & 0x7fu;
  if (mag == 0x7fu) return __uint_as_float(0x7fc00000u);
  const float x = __uint_as_float(mag << 20) * 0x1p120f;
  return (v & 0x80u) ? -x : x;
}

// FloatToE4m3 (core/base/dtype.cc), the same bit operations: round to nearest even, saturating at
// +-448, NaN to 0x7f.
__device__ __forceinline__ uint8_t FloatToE4m3(float f) {
  if (f != f) return 0x7f;
  const uint8_t sign = (__float_as_uint(f) >> 31) != 0 ? 0x80 : 0x00;
  const float a = fminf(fabsf(f), kE4m3Max);
  if (a < 0.015625f) return static_cast<uint8_t>(sign | static_cast<uint8_t>(rintf(a * 512.0f)));
  uint32_t bits = __float_as_uint(a);
  bits += 0x7ffffu + ((bits >> 20) & 1u);
  return static_cast<uint8_t>(sign | (((bits >> 23) - 120u) << 3) | ((bits >> 20) & 7u));
}

// The FP8 KV cache's per-head scale from the head's amax over its finite values
// (core/model/kv_fp8.cc EncodeKvRow): amax / 448, never below FLT_MIN; 1 for an all-zero head.
__device__ __forceinline__ float KvScale(float amax) {
  return amax > 0.f ? fmaxf(amax / kE4m3Max, 1.17549435e-38f) : 1.0f;
}

}  // namespace glmserve::cuda::dev
