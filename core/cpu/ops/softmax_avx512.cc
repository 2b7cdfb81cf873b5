// softmax_row.h's SoftmaxRow in AVX-512 registers (the dispatch is in softmax.cc): the AVX2
// form's operations, 16 elements at a time. The max and the exp are elementwise (and the max's
// tree cannot change a result: only which of +0 and -0 it keeps, which no exp sees); the sum
// keeps the 8-lane order by adding a register's low 8 elements, then its high 8, to the same 8
// lanes, so lane j still takes elements j, j + 8, j + 16, ... in turn. So the bits are the
// portable code's (softmax_test checks it). On a Zen 4 core one Air layer's attention at 2,048
// tokens took 1.37 s against 1.41 s with the AVX2 form (bench/attention_bench --threads=1,
// docs/performance.md).
#include <immintrin.h>

#include "core/cpu/ops/attention_lanes8.h"
#include "core/cpu/ops/softmax.h"
#include "core/cpu/ops/softmax_exp_simd.h"

namespace glmserve::internal {
namespace {

// ExpNonPositive, 16 at a time (softmax_exp_simd.h).
struct Avx512Ops {
  using V = __m512;
  static V Set(float f) { return _mm512_set1_ps(f); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V TwoToTheN(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static V ZeroBelow(V e, V x, float limit) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, Set(limit), _CMP_LT_OQ), e,
                                _mm512_setzero_ps());
  }
};
inline __m512 ExpNonPositive16(__m512 x) { return ExpNonPositiveSimd<Avx512Ops>(x); }

// The exp of one register of scores less the max, NaN where the difference is NaN.
inline __m512 ExpOfScores(__m512 s, __m512 max_score) {
  const __m512 x = _mm512_sub_ps(s, max_score);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_EQ_OQ), x, ExpNonPositive16(x));
}

// lane += the elements of e that `valid` keeps, low 8 then high 8 (lanes left alone where an
// element is missing, as the AVX2 form's tail does).
inline __m256 AddToLanes(__m256 lane, __m512 e, __mmask16 valid) {
  lane = _mm256_mask_add_ps(lane, static_cast<__mmask8>(valid), lane, _mm512_castps512_ps256(e));
  return _mm256_mask_add_ps(lane, static_cast<__mmask8>(valid >> 8), lane,
                            _mm512_extractf32x8_ps(e, 1));
}

}  // namespace

float SoftmaxExpAvx512(float* scores, int64_t n) {
  const int64_t whole = n - n % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - whole)) - 1);

  // The max: each element keeps s > m ? s : m (max_ps(s, m) skips a NaN s), then a tree.
  __m512 lane_max = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < whole; i += 16) {
    lane_max = _mm512_max_ps(_mm512_loadu_ps(scores + i), lane_max);
  }
  if (tail != 0) {
    lane_max =
        _mm512_mask_max_ps(lane_max, tail, _mm512_maskz_loadu_ps(tail, scores + whole), lane_max);
  }
  const __m512 max_score = _mm512_set1_ps(_mm512_reduce_max_ps(lane_max));

  // The exps, stored, and their sums in the 8 lanes from +0.
  __m256 lane = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 16) {
    const __m512 e = ExpOfScores(_mm512_loadu_ps(scores + i), max_score);
    _mm512_storeu_ps(scores + i, e);
    lane = AddToLanes(lane, e, 0xffff);
  }
  if (tail != 0) {
    const __m512 e = ExpOfScores(_mm512_maskz_loadu_ps(tail, scores + whole), max_score);
    _mm512_mask_storeu_ps(scores + whole, tail, e);
    lane = AddToLanes(lane, e, tail);
  }
  return lanes8::SumOfLanes(lane);
}

void SoftmaxAvx512(float* scores, int64_t n) {
  const __m512 inv = _mm512_set1_ps(1.0f / SoftmaxExpAvx512(scores, n));
  const int64_t whole = n - n % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - whole)) - 1);
  for (int64_t i = 0; i < whole; i += 16) {
    _mm512_storeu_ps(scores + i, _mm512_mul_ps(_mm512_loadu_ps(scores + i), inv));
  }
  if (tail != 0) {
    _mm512_mask_storeu_ps(scores + whole, tail,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, scores + whole), inv));
  }
}

}  // namespace glmserve::internal
