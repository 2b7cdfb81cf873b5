// The int8-weight Linear kernel for Int8Layout::kRows16 weights on AVX2 with AVX-VNNI (the VEX
// form of vpdpbusd on 256 bits: Intel's client and E-core CPUs, which lack AVX-512), for every
// number of activation rows (arithmetic: linear.h, "group-serial"; reference: Int8BlockGeneric,
// which this kernel matches bit for bit). The loops are linear_int8_rows16_ymm.h's; here each
// 4-product step is one vpdpbusd where the AVX2 kernel takes five instructions.
//
// vpdpbusd multiplies unsigned bytes by signed ones: the weight codes are biased to unsigned
// (w xor 0x80 = w + 128) and the activation codes stay signed, so the lanes sum w x + 128 x;
// each dot starts from -128 x (the group's activation code sum, Int8Activation::group_sum) and
// ends exact.
#include <immintrin.h>

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_rows16_ymm.h"

namespace glmserve::internal {
namespace {

struct AvxVnniDots {
  static constexpr bool kReadsSums = true;
  template <int R>
  static void Group(const int8_t* unit, const YmmRows& x, int64_t g, __m256i (&d)[R][2]) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int i = 0; i < R; ++i) d[i][0] = d[i][1] = _mm256_set1_epi32(-128 * x.sum[i][g]);
    for (int p = 0; p < 8; ++p) {
      const __m256i w0 = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64)), flip);
      const __m256i w1 = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + p * 64 + 32)), flip);
      for (int i = 0; i < R; ++i) {
        const __m256i xb = Broadcast4(x.q[i] + g * kInt8Group + 4 * p);
        d[i][0] = _mm256_dpbusd_avx_epi32(d[i][0], w0, xb);
        d[i][1] = _mm256_dpbusd_avx_epi32(d[i][1], w1, xb);
      }
    }
  }
};

}  // namespace

void Int8BlockAvxVnniRows16(const Int8Job& job, int64_t nb) { Int8Rows16Ymm<AvxVnniDots>(job, nb); }

}  // namespace glmserve::internal
