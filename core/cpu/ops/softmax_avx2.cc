// softmax_row.h's SoftmaxRow in AVX2 registers (the dispatch is in softmax.cc; AVX-512 CPUs
// run this too, since the order has 8 lanes): lane j of the code there is element j of a
// register, and every operation is the same IEEE operation on the same operands, so the bits
// are the same (softmax_test checks it). The compiler did not vectorise the portable code's
// exp loop (its selects stayed branches), hence the intrinsics.
#include <immintrin.h>

#include "core/cpu/ops/attention_lanes8.h"
#include "core/cpu/ops/softmax.h"
#include "core/cpu/ops/softmax_exp_simd.h"

namespace glmserve::internal {
namespace {

// ExpNonPositive, 8 at a time (softmax_exp_simd.h).
struct Avx2Ops {
  using V = __m256;
  static V Set(float f) { return _mm256_set1_ps(f); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V TwoToTheN(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static V ZeroBelow(V e, V x, float limit) {
    return _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, Set(limit), _CMP_LT_OQ));
  }
};
inline __m256 ExpNonPositive8(__m256 x) { return ExpNonPositiveSimd<Avx2Ops>(x); }

// The exp of one register of scores less the max, NaN where the difference is NaN.
inline __m256 ExpOfScores(__m256 s, __m256 max_score) {
  const __m256 x = _mm256_sub_ps(s, max_score);
  return _mm256_blendv_ps(x, ExpNonPositive8(x), _mm256_cmp_ps(x, x, _CMP_EQ_OQ));
}

// The mask of the first `count` of 8 lanes, for maskload / maskstore.
inline __m256i FirstLanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), index);
}

}  // namespace

float SoftmaxExpAvx2(float* scores, int64_t n) {
  // The max: lane j keeps s > lane ? s : lane (max_ps(s, lane)), then the halving tree.
  __m256 lane_max = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) lane_max = _mm256_max_ps(_mm256_loadu_ps(scores + i), lane_max);
  const int64_t tail = n - i;
  const __m256i tail_mask = FirstLanes(tail);
  if (tail > 0) {
    const __m256 s = _mm256_maskload_ps(scores + i, tail_mask);
    lane_max =
        _mm256_blendv_ps(lane_max, _mm256_max_ps(s, lane_max), _mm256_castsi256_ps(tail_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(lane_max, 1), _mm256_castps256_ps128(lane_max));
  m4 = _mm_max_ps(_mm_movehl_ps(m4, m4), m4);
  m4 = _mm_max_ss(_mm_shuffle_ps(m4, m4, 1), m4);
  const __m256 max_score = _mm256_set1_ps(_mm_cvtss_f32(m4));

  // The exps, stored, and their lane sums from +0; the tail adds only to its own lanes.
  __m256 lane = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = ExpOfScores(_mm256_loadu_ps(scores + i), max_score);
    _mm256_storeu_ps(scores + i, e);
    lane = _mm256_add_ps(lane, e);
  }
  if (tail > 0) {
    const __m256 e = ExpOfScores(_mm256_maskload_ps(scores + i, tail_mask), max_score);
    _mm256_maskstore_ps(scores + i, tail_mask, e);
    lane = _mm256_blendv_ps(lane, _mm256_add_ps(lane, e), _mm256_castsi256_ps(tail_mask));
  }
  return lanes8::SumOfLanes(lane);
}

void SoftmaxAvx2(float* scores, int64_t n) {
  const float inv_sum = 1.0f / SoftmaxExpAvx2(scores, n);
  const __m256 inv = _mm256_set1_ps(inv_sum);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(scores + i, _mm256_mul_ps(_mm256_loadu_ps(scores + i), inv));
  }
  for (; i < n; ++i) scores[i] *= inv_sum;
}

}  // namespace glmserve::internal
