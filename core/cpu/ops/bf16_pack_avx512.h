// The AVX-512 pieces that the bf16 operand packers share (attention_amx.cc's values,
// linear_amx_avx512.cc's activations and results, attention_bf16_avx512bf16.cc's keys): FloatToBf16
// on 16 lanes, 32 floats as 16 bf16 pairs, and the 16 x 16 dword transpose. For files compiled
// for baseline x86-64: the functions carry their own AVX-512 target attribute, and so must
// every caller that inlines them (GLM_AVX512_TARGET); callers run them only where
// CpuHasAvx512() says so.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#define GLM_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

#include <algorithm>
#include <cstdint>

namespace glmserve::internal {

// FloatToBf16 (core/base/dtype.h) on 16 lanes, each result in the low half of its dword (the
// high half +0): round to nearest even, NaNs kept quiet (0x40 set), the scalar function's bits.
GLM_AVX512_TARGET inline __m512i RoundToBf16Lanes(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

// The first n of 16 lanes (none for n <= 0, all for n >= 16).
GLM_AVX512_TARGET inline __mmask16 FirstLanes16(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// The first n of x's 32 floats (n may be more than 32; past n +0) rounded to bf16 as 16 pairs:
// dword j holds element 2j in its low half, 2j + 1 in its high half.
GLM_AVX512_TARGET inline __m512i Bf16Pairs32(const float* x, int64_t n) {
  const __m256i lo =
      _mm512_cvtepi32_epi16(RoundToBf16Lanes(_mm512_maskz_loadu_ps(FirstLanes16(n), x)));
  const __m256i hi =
      _mm512_cvtepi32_epi16(RoundToBf16Lanes(_mm512_maskz_loadu_ps(FirstLanes16(n - 16), x + 16)));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Rows r[0..15] of 16 dwords each, transposed in place: r[j] becomes column j (the four
// stages of the usual 16 x 16 network: 32-bit and 64-bit interleaves within 128-bit lanes,
// then two rounds of lane shuffles).
GLM_AVX512_TARGET inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + c], lane L: rows 4g .. 4g + 3 at column 4L + c.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i y0 = _mm512_shuffle_i32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i x1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    r[c] = _mm512_shuffle_i32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));       // column c
    r[4 + c] = _mm512_shuffle_i32x4(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));   // column 4 + c
    r[8 + c] = _mm512_shuffle_i32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));   // column 8 + c
    r[12 + c] = _mm512_shuffle_i32x4(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));  // column 12 + c
  }
}

}  // namespace glmserve::internal

#endif  // __x86_64__
