#include "core/base/dtype.h"

#include <algorithm>
#include <cmath>

namespace glmserve {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E8M0:
      return "F8_E8M0";
  }
  return "?";
}

uint16_t FloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (abs < 0x38800000u) {                        // subnormal or zero in f16
    // Value = abs_f * 2^24 in units of the smallest subnormal; round half to even.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 16777216.0f;  // exact: power of two
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

uint8_t FloatToE4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::min(std::fabs(f), 448.0f);
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): multiples of 2^-9, ties to even (the default rounding
    // mode); 8 * 2^-9 is 2^-6, code 0x08, the smallest normal: the codes line up.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  }
  // Normal: keep 3 of fp32's 23 mantissa bits, round to nearest even on the bit pattern (a
  // carry into the exponent is the right next value); rebias 127 -> 7. a <= 448 = 1.75 * 2^8
  // cannot round past 448.
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  bits += 0x7ffffu + ((bits >> 20) & 1u);
  const uint32_t exp = (bits >> 23) - 120u, mant = (bits >> 20) & 7u;
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

}  // namespace glmserve
