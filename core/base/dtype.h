// Element types of stored tensors and the scalar conversions between them.
//
// The conversions are plain inline functions (no intrinsics) so that the CPU backend and,
// later, CUDA kernels share one definition of the arithmetic.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace glmserve {

// kF8E4M3: FP8 e4m3fn (OCP "E4M3", torch.float8_e4m3fn), the weights of FP8 checkpoints; it
// never stands alone: a matrix of it carries its scales (WeightFormat::kFp8Scaled,
// core/model/weights.h). kF8E8M0: an unsigned power-of-two scale ("UE8M0"), only ever a scale
// tensor of a block-scaled FP8 checkpoint, widened to fp32 at load (docs/fp8.md).
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E8M0 };

// Bytes per element.
inline constexpr int64_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kF8E4M3 || t == DType::kF8E8M0) ? 1 : 2;
}

// The safetensors spelling ("F32", "BF16", "F16", "F8_E4M3", "F8_E8M0").
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

// E4M3 (e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111
// (0x7f, 0xff) is NaN; exponent 0 is subnormal, m * 2^-9 (the smallest 2^-9, not zero: these
// codes are real values in the released checkpoints). Exact for every code.
inline float E4m3ToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  float f;
  if (exp == 0xf && mant == 0x7) {
    const uint32_t nan = sign | 0x7fc00000u;
    std::memcpy(&f, &nan, sizeof f);
    return f;
  }
  if (exp == 0) {
    f = static_cast<float>(mant) * (1.0f / 512.0f);  // exact: 3 bits times a power of two
    return sign != 0 ? -f : f;
  }
  const uint32_t bits = sign | ((exp + 120u) << 23) | (mant << 20);
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Float to E4M3, round to nearest even, saturating at +-448 (as the checkpoints' quantizers
// clamp before the cast); NaN gives 0x7f. Used by the FP8 writer and the random FP8 presets.
uint8_t FloatToE4m3(float f);

// UE8M0: 2^(v - 127); 0xff is NaN.
inline float E8m0ToFloat(uint8_t v) {
  uint32_t bits = v == 0xff ? 0x7fc00000u : v == 0 ? 0x00400000u : static_cast<uint32_t>(v) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Reads element i of a buffer of the given dtype as float.
inline float LoadAsFloat(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF8E4M3:  // the unscaled code: callers of FP8 matrices apply the scale
      return E4m3ToFloat(static_cast<const uint8_t*>(data)[i]);
    case DType::kF8E8M0:
      return E8m0ToFloat(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.f;
}

}  // namespace glmserve
