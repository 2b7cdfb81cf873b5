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

namespace glmserve::internal {
namespace {

struct HardwareOps {
  using Tiles = AmxTileUnit;

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
