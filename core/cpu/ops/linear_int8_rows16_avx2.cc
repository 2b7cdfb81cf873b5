// The int8-weight Linear kernel for Int8Layout::kRows16 weights on AVX2 (x86-64 without
// AVX512-VNNI or AVX-VNNI), for every number of activation rows (arithmetic: linear.h,
// "group-serial"; reference: Int8BlockGeneric, which this kernel matches bit for bit). The
// loops are linear_int8_rows16_ymm.h's; here the exact group dots.
//
// The row-major AVX2 kernel (linear_int8_avx2.cc) has its lanes along K: each group's dot ends
// as 8 partial sums that a reduction across lanes must add. Here each 4-product step is a
// vpmaddubsw and a vpmaddwd of a block vector's half against 4 activation codes broadcast:
// vpmaddubsw multiplies unsigned bytes by signed ones, so it takes |x| (the codes made unsigned)
// and the weight codes with x's sign (vpsignb, which also zeroes them where x is 0), and each
// product is x w exactly; a pair's sum is at most 2 x 127 x 127 = 32258, so the 16-bit step
// cannot saturate, and vpmaddwd by ones widens the pairs to 32 bits.
#include <immintrin.h>

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_rows16_ymm.h"

namespace glmserve::internal {
namespace {

struct Avx2Dots {
  static constexpr bool kReadsSums = false;
  template <int R>
  static void Group(const int8_t* unit, const YmmRows& x, int64_t g, __m256i (&d)[R][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < R; ++i) d[i][0] = d[i][1] = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64 + 32));
      for (int i = 0; i < R; ++i) {
        const __m256i xb = Broadcast4(x.q[i] + g * kInt8Group + 4 * p);
        const __m256i x_abs = _mm256_abs_epi8(xb);
        const __m256i p0 = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w0, xb));
        const __m256i p1 = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w1, xb));
        d[i][0] = _mm256_add_epi32(d[i][0], _mm256_madd_epi16(p0, ones));
        d[i][1] = _mm256_add_epi32(d[i][1], _mm256_madd_epi16(p1, ones));
      }
    }
  }
};

}  // namespace

void Int8BlockAvx2Rows16(const Int8Job& job, int64_t nb) { Int8Rows16Ymm<Avx2Dots>(job, nb); }

}  // namespace glmserve::internal
