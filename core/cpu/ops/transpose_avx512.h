// The 16 x 16 dword transpose that the AMX operand packers share (attention_amx.cc's values,
// linear_amx.cc's activations and results). For files compiled for baseline x86-64: the
// function carries its own AVX-512 target attribute, and so must every caller that inlines it
// (GLM_AVX512_TARGET); callers run it only where CpuHasAvx512() says so.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#define GLM_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace glmserve::internal {

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
