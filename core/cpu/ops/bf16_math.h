// The scalar bf16 arithmetic that the portable emulations of vdpbf16ps and TDPBF16PS share
// (linear_bf16.cc, linear_amx.cc, amx_tiles.cc, attention_bf16.cc, attention_flash.h): bf16
// rounding of fp32, the instructions' treatment of subnormals, and one lane step of vdpbf16ps.
// Internal linkage, so that files compiled for different ISAs never share a definition at link time
// (an inline function compiled for AVX-512 must not be picked for a caller on a machine without
// it).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/base/dtype.h"

namespace glmserve::internal {
namespace {

// Both instructions read bf16 subnormal inputs as zero (DAZ) ...
inline float DazBf16(uint16_t v) {
  return (v & 0x7f80u) == 0 ? ((v & 0x8000u) != 0 ? -0.0f : 0.0f) : Bf16ToFloat(v);
}
// ... and flush subnormal results to zero (FTZ), whatever MXCSR says. For an fp32 input Ftz is
// also DAZ.
inline float Ftz(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }

// FloatToBf16(lo) | FloatToBf16(hi) << 16 (core/base/dtype.h: round to nearest even, NaN kept
// quiet), in 32-bit operations without branches, so that loops of it vectorise: a dword holding
// elements 2i (low half) and 2i + 1 (high half), the operand layout of vdpbf16ps and TDPBF16PS.
inline uint32_t Bf16Pair(float lo, float hi) {
  uint32_t a, b;
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
  const uint32_t ra =
      (a & 0x7fffffffu) > 0x7f800000u ? (a >> 16) | 0x40u : (a + 0x7fffu + ((a >> 16) & 1u)) >> 16;
  const uint32_t rb = (b & 0x7fffffffu) > 0x7f800000u
                          ? (b | 0x400000u) & 0xffff0000u
                          : (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  return ra | rb;
}

// One fp32 lane of vdpbf16ps: acc + a.hi * b.hi, then + a.lo * b.lo, each an FMA with one
// rounding to nearest even (a product of two bf16 is exact in fp32), DAZ and FTZ as above.
// a and b are Bf16Pair dwords.
inline float DpBf16Lane(float acc, uint32_t a, uint32_t b) {
  acc = Ftz(std::fma(DazBf16(static_cast<uint16_t>(a >> 16)),
                     DazBf16(static_cast<uint16_t>(b >> 16)), acc));
  return Ftz(std::fma(DazBf16(static_cast<uint16_t>(a)), DazBf16(static_cast<uint16_t>(b)), acc));
}

// One C element of TDPBF16PS (linear_amx.h states the arithmetic): over `pairs` pairs of bf16,
// the even chain over products a(2p) b(2p) and the odd one over a(2p+1) b(2p+1), each step one
// FMA (one rounding) from +0, then c + (e + o), DAZ and FTZ as above. a(j), b(j): element j's
// bf16 bits. The tile unit's model (amx_tiles.h) and the kernel's portable emulation
// (linear_amx.cc) both take their arithmetic from here.
template <typename A, typename B>
inline float AmxBf16Element(float c, int pairs, A a, B b) {
  float e = 0.0f, o = 0.0f;
  for (int p = 0; p < pairs; ++p) {
    e = Ftz(std::fma(DazBf16(a(2 * p)), DazBf16(b(2 * p)), e));
    o = Ftz(std::fma(DazBf16(a(2 * p + 1)), DazBf16(b(2 * p + 1)), o));
  }
  return Ftz(Ftz(c) + Ftz(e + o));
}

}  // namespace
}  // namespace glmserve::internal
