// The kBf16Amx kernel's vector work around the tile unit (linear_amx.h): the activations'
// packing and the C tiles' stores, with the portable code's bits (linear_amx.cc). Compiled for
// AVX-512 and called only where CpuHasAvx512().
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/cpu/ops/bf16_pack_avx512.h"
#include "core/cpu/ops/linear_amx.h"

namespace glmserve::internal {

// The portable packing's bits, a chunk at a time: each of the 16 rows' 32 values rounded and
// narrowed to 16 dwords (its pairs), then one 16 x 16 dword transpose makes them the tile's 16
// pair rows. Rows past m and columns past k load as +0.
void PackAmxActivationsAvx512(const float* x, int64_t m, int64_t k, int64_t block, uint16_t* out) {
  const int64_t chunks = (k + kAmxTileK - 1) / kAmxTileK;
  uint16_t* tiles = out + block * chunks * kAmxTileElems;
  const int64_t rows = std::min(kAmxTileRows, m - block * kAmxTileRows);
  const float* src = x + block * kAmxTileRows * k;
  for (int64_t kc = 0; kc < chunks; ++kc) {
    const int64_t k0 = kc * kAmxTileK, len = std::min(kAmxTileK, k - k0);
    __m512i r[16];
    for (int64_t i = 0; i < kAmxTileRows; ++i) {
      if (i >= rows) {
        r[i] = _mm512_setzero_si512();
        continue;
      }
      r[i] = Bf16Pairs32(src + i * k + k0, len);
    }
    Transpose16x16(r);
    uint16_t* tile = tiles + kc * kAmxTileElems;
    for (int p = 0; p < 16; ++p) _mm512_store_si512(tile + p * 2 * kAmxTileRows, r[p]);
  }
}

// The same through one 16 x 16 transpose: each activation row's 16 outputs in one store.
void StoreAmxTileAvx512(const float* ct, int64_t rows, int64_t cols, const float* bias, float* y,
                        int64_t ld) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(ct + i * 16);
  Transpose16x16(r);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int64_t col = 0; col < cols; ++col) {
    __m512 v = _mm512_castsi512_ps(r[col]);
    if (bias != nullptr) v = _mm512_add_ps(v, b);
    _mm512_mask_storeu_ps(y + col * ld, mask, v);
  }
}

}  // namespace glmserve::internal
