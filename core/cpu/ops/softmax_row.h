// The attention softmax's arithmetic in portable code (softmax.cc; softmax_avx2.cc and
// softmax_avx512.cc are its SIMD forms, the same bits, with the exp of softmax_exp_simd.h), and
// the exp that attention_flash.h's online softmax shares. Everything
// here has internal linkage, so its compilations for different ISAs (attention_flash.h is
// compiled for AVX-512 too) never meet at link time: an inline function compiled for AVX-512
// must not be picked for a caller on a machine without it. Only elementwise operations and
// sums written in one order over 8 lanes, which no compiler may reassociate (the build also
// forbids FMA contraction).
#pragma once

#include <cstdint>
#include <cstring>

namespace glmserve::internal {
namespace {

// exp(x) for x <= 0 (Cody-Waite reduction by ln 2 in two parts, then a degree-6 polynomial;
// within 2 ulp of a correctly rounded expf, measured in softmax_test): only +, *, selects and
// bit moves, so it vectorises. Below -87 (where 2^n would leave the normal range) it returns
// +0, and exp(-inf) = +0. Its bits are this code's, not the C library's, so they do not
// change with the machine's libm either. A NaN gives a finite value: callers that must
// propagate NaN select it themselves.
inline float ExpNonPositive(float x) {
  const float xc = x > -87.0f ? x : -87.0f;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // nearest integer
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.0f ? 0.0f : y * two_n;
}

// The lanes of every reduction below: lane j takes elements j, j + 8, ... (a tail's elements
// their own lanes), then the halving tree (j, j + 4), (j, j + 2), (j, j + 1): LaneSum<8>'s
// order (core/cpu/ops/lane_sum.h).
constexpr int kSoftmaxLanes = 8;

// scores[0, n) -> exp(s - max) in place, n >= 1, returning their sum:
// - max: the largest score (NaN scores skipped, like std::max from -inf; which of +0 and -0 it
//   keeps cannot change any exp);
// - e_i = ExpNonPositive(s_i - max), or NaN where s_i - max is NaN (a NaN score, or max = inf);
// - sum: the e_i in LaneSum<8> order.
inline float SoftmaxExpRow(float* scores, int64_t n) {
  constexpr int L = kSoftmaxLanes;
  float lane_max[L];
  for (int j = 0; j < L; ++j) lane_max[j] = -__builtin_inff();
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    for (int j = 0; j < L; ++j) {
      const float s = scores[i + j];
      lane_max[j] = s > lane_max[j] ? s : lane_max[j];
    }
  }
  for (int j = 0; i + j < n; ++j) {
    const float s = scores[i + j];
    lane_max[j] = s > lane_max[j] ? s : lane_max[j];
  }
  for (int width = L / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) {
      lane_max[j] = lane_max[j + width] > lane_max[j] ? lane_max[j + width] : lane_max[j];
    }
  }
  const float max_score = lane_max[0];

  float lane[L] = {};
  const auto exp_of = [max_score](float s) {
    const float x = s - max_score;
    return x == x ? ExpNonPositive(x) : x;
  };
  for (i = 0; i + L <= n; i += L) {
    for (int j = 0; j < L; ++j) {
      const float e = exp_of(scores[i + j]);
      scores[i + j] = e;
      lane[j] += e;
    }
  }
  for (int j = 0; i + j < n; ++j) {
    const float e = exp_of(scores[i + j]);
    scores[i + j] = e;
    lane[j] += e;
  }
  for (int width = L / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

// scores[0, n) -> exp(s - max) / sum in place, n >= 1: SoftmaxExpRow, then each e_i times the
// rounded 1 / sum. A NaN anywhere in the row thus gives a row of NaN, as the C library's exp
// did.
inline void SoftmaxRow(float* scores, int64_t n) {
  const float inv_sum = 1.0f / SoftmaxExpRow(scores, n);
  for (int64_t i = 0; i < n; ++i) scores[i] *= inv_sum;
}

}  // namespace
}  // namespace glmserve::internal
