// The group-serial int8 kernel on the AMX tile unit (arithmetic: linear.h; layout:
// linear_int8_amx.h; the reference it matches bit for bit: Int8BlockGeneric in linear_int8.cc).
// Per 32-wide group, TDPBSSD gives the exact int32 dots of up to 32 weight rows x 32 activation
// rows (2 x 2 C tiles); AVX-512 then converts each (exact), multiplies the two scales (one
// rounding) and adds with one FMA into fp32 accumulators that stay in L1 for the whole of K (the
// driver, linear_int8_amx_driver.h, is shared with the software tile model the tests run anywhere).
// Compiled for AVX-512; the tile instructions use function target attributes, and the tile
// configuration is loaded per thread by Int8AmxThreadBegin.
#include <immintrin.h>

#include "core/cpu/ops/linear_int8_amx.h"
#include "core/cpu/ops/linear_int8_amx_driver.h"

#define GLM_AMX_INT8_TARGET __attribute__((target("amx-tile,amx-int8")))

namespace glmserve::internal {
namespace {

// C tile (t, u) is tile 2t + u (t: weight tile, u: activation tile); NT x MT of them in use.
template <int NT, int MT>
GLM_AMX_INT8_TARGET inline void ZeroC() {
  _tile_zero(0);
  if constexpr (MT == 2) _tile_zero(1);
  if constexpr (NT == 2) _tile_zero(2);
  if constexpr (NT == 2 && MT == 2) _tile_zero(3);
}
template <int NT, int MT>
GLM_AMX_INT8_TARGET inline void StoreC(int32_t* c) {
  _tile_stored(0, c, 64);
  if constexpr (MT == 2) _tile_stored(1, c + kInt8AmxTileCells, 64);
  if constexpr (NT == 2) _tile_stored(2, c + 2 * kInt8AmxTileCells, 64);
  if constexpr (NT == 2 && MT == 2) _tile_stored(3, c + 3 * kInt8AmxTileCells, 64);
}

struct HardwareOps {
  template <int NT, int MT>
  GLM_AMX_INT8_TARGET static void Group(const Int8ASource* a, int64_t g, const int32_t* b,
                                        int64_t b_next, int32_t* c) {
    ZeroC<NT, MT>();
    if (g < a[0].ld / 32) {
      _tile_loadd(4, a[0].p + 32 * g, a[0].ld);
      if constexpr (NT == 2) _tile_loadd(5, a[1].p + 32 * g, a[1].ld);
    } else {
      _tile_loadd(4, a[0].tail, 32);
      if constexpr (NT == 2) _tile_loadd(5, a[1].tail, 32);
    }
    _tile_loadd(6, b, 64);
    if constexpr (MT == 2) _tile_loadd(7, b + b_next, 64);
    _tile_dpbssd(0, 4, 6);
    if constexpr (MT == 2) _tile_dpbssd(1, 4, 7);
    if constexpr (NT == 2) _tile_dpbssd(2, 5, 6);
    if constexpr (NT == 2 && MT == 2) _tile_dpbssd(3, 5, 7);
    StoreC<NT, MT>(c);
  }

  // kRows16: A = activation rows in place (stride lda), B = a weight block's group in place.
  template <int NT, int MT>
  GLM_AMX_INT8_TARGET static void Rows16Group(const int8_t* a, int64_t lda, const int8_t* b,
                                              int64_t b_next, int32_t* c) {
    ZeroC<NT, MT>();
    _tile_loadd(4, a, lda);
    if constexpr (MT == 2) _tile_loadd(5, a + 16 * lda, lda);
    _tile_loadd(6, b, 64);
    if constexpr (NT == 2) _tile_loadd(7, b + b_next, 64);
    _tile_dpbssd(0, 4, 6);  // C (t, u) = (0, 0)
    if constexpr (MT == 2) _tile_dpbssd(1, 5, 6);
    if constexpr (NT == 2) _tile_dpbssd(2, 4, 7);
    if constexpr (NT == 2 && MT == 2) _tile_dpbssd(3, 5, 7);
    StoreC<NT, MT>(c);
  }

  // The scales' product (one rounding), the exact conversion, one FMA: 16 activation rows.
  static void ScaleRow(float* acc, const int32_t* d, float ws, const float* xs) {
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(ws), _mm512_loadu_ps(xs));
    const __m512 dv = _mm512_cvtepi32_ps(_mm512_load_si512(d));
    _mm512_store_ps(acc, _mm512_fmadd_ps(dv, scale, _mm512_load_ps(acc)));
  }
};

}  // namespace

void Int8AmxBlockHardware(const Int8Job& job, int64_t nb) { Int8AmxBlock<HardwareOps>(job, nb); }
void Int8AmxRows16BlockHardware(const Int8Job& job, int64_t nb) {
  Int8AmxRows16Block<HardwareOps>(job, nb);
}

}  // namespace glmserve::internal
