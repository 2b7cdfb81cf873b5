// Element types of stored tensors and the scalar conversions between them.
//
// The conversions are plain inline functions (no intrinsics) so that the CPU backend and,
// later, CUDA kernels share one definition of the arithmetic.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace glmserve {

enum class DType : uint8_t { kF32, kBF16, kF16 };

// Bytes per element.
inline constexpr int64_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// The safetensors spelling ("F32", "BF16", "F16").
std::string_view DTypeName(DType t);

inline float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE binary16 to float, exact for every input including subnormals, inf and NaN.
inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise the mantissa
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Float to binary16, round to nearest even (used by tests and the random-weight writer).
uint16_t FloatToF16(float f);

// Reads element i of a buffer of the given dtype as float.
inline float LoadAsFloat(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.f;
}

}  // namespace glmserve
