// The int8-weight Linear kernel on AVX2 (arithmetic: linear.h, "group-serial"; reference:
// Int8BlockGeneric in linear_int8.cc, which this kernel matches bit for bit). It serves
// row-major weights on x86-64 without AVX512-VNNI (QuantizeWeights keeps kRows16 there, which
// linear_int8_rows16_avx2.cc reads faster). Its driver, shared with the VNNI kernel for decode,
// is linear_int8_rows.h: lanes along K, weight rows read one after another.
//
// A group's exact dot comes from vpmaddubsw on |x| (unsigned) and w with x's sign (signed),
// then vpmaddwd with ones: both sides lie in [-127, 127], so a pair's sum is at most
// 2 * 127 * 127 = 32258 and the 16-bit step cannot saturate; 8 int32 partial sums remain per
// group, and 8 groups' partial sums reduce together into one register of 8 dots.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/cpu/ops/linear_int8_rows.h"
#include "core/cpu/quantize.h"

namespace glmserve::internal {
namespace {

// The exact int32 dots of 4 byte products per lane: x . w over 32 bytes.
inline __m256i Dot4(__m256i x_abs, __m256i x, __m256i w) {
  const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// Lane c of the result: the sum of v[c]'s 8 lanes.
inline __m256i Reduce8(const __m256i* v) {
  // hadd works within 128-bit halves: b0 holds v0..v3's sums of lanes 0-3 (low half) and of
  // lanes 4-7 (high half), b1 the same for v4..v7.
  const __m256i b0 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b1 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                          _mm256_permute2x128_si256(b0, b1, 0x31));
}

// Int8BlockRows' group dots on AVX2: 8 groups per register, the tail group in scalar code.
struct Avx2RowDots {
  void Prepare(int64_t, const int8_t*, int64_t) {}
  void Row(int64_t, const int8_t* xq, const int8_t* w, int64_t k, int32_t* out) const {
    const int64_t full = k / kInt8Group;
    const auto load = [](const int8_t* p) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    };
    for (int64_t g = 0; g < full; g += 8) {
      __m256i v[8];
      for (int j = 0; j < 8; ++j) {
        if (g + j >= full) {
          v[j] = _mm256_setzero_si256();
          continue;
        }
        const __m256i xv = load(xq + (g + j) * kInt8Group);
        v[j] = Dot4(_mm256_abs_epi8(xv), xv, load(w + (g + j) * kInt8Group));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + g), Reduce8(v));
    }
    if (full * kInt8Group < k) out[full] = ScalarDot(xq, w, full * kInt8Group, k);
  }
};

}  // namespace

void Int8BlockAvx2(const Int8Job& job, int64_t nb) {
  Avx2RowDots dots;
  Int8BlockRows(job, nb, dots);
}

// QuantizeGroupInt8's operations, eight elements at a time: the same amax (max is exact, so its
// order does not matter), the same scalar scale, and per element the same IEEE division, the
// same round to nearest even (vroundps in the default mode, as nearbyint) and the same clamp.
// A non-finite element makes the scale NaN and the codes zero; so does a zero group. A last
// group of fewer than 32 takes the scalar code.
void QuantizeRowInt8Avx2(const float* x, int64_t k, int8_t* q, float* group_scale) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 max_finite = _mm256_set1_ps(FLT_MAX);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  int64_t g = 0;
  for (; (g + 1) * kInt8Group <= k; ++g) {
    const float* v = x + g * kInt8Group;
    __m256 e[4];
    __m256 amax = _mm256_setzero_ps();
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int j = 0; j < 4; ++j) {
      e[j] = _mm256_loadu_ps(v + 8 * j);
      const __m256 a = _mm256_and_ps(e[j], abs_mask);
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, max_finite, _CMP_LE_OQ));  // NaN: false
      amax = _mm256_max_ps(amax, a);
    }
    int8_t* out = q + g * kInt8Group;
    if (_mm256_movemask_ps(finite) != 0xFF) {
      group_scale[g] = std::numeric_limits<float>::quiet_NaN();
      std::memset(out, 0, kInt8Group);
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float scale = _mm_cvtss_f32(m4) / 127.0f;
    group_scale[g] = scale;
    if (!(scale > 0)) {
      std::memset(out, 0, kInt8Group);
      continue;
    }
    const __m256 s = _mm256_set1_ps(scale);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r =
          _mm256_round_ps(_mm256_div_ps(e[j], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      i32[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));  // exact integers
    }
    // The packs work within 128-bit halves: their bytes come out in runs of four as
    // 0.lo 1.lo 2.lo 3.lo 0.hi 1.hi 2.hi 3.hi (i32[j]'s lanes 0-3, then 4-7); the permutation
    // puts the runs back in order.
    const __m256i w01 = _mm256_packs_epi32(i32[0], i32[1]),
                  w23 = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), b);
  }
  if (g * kInt8Group < k) {
    group_scale[g] = QuantizeGroupInt8(x + g * kInt8Group, k - g * kInt8Group, q + g * kInt8Group);
  }
}

}  // namespace glmserve::internal
