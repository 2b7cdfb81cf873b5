// The sampler's arithmetic, written once for the host sampler (core/engine/sampler.cc) and the
// device sampler (core/cuda/row_sample.cu), so that both choose the same token, bit for bit, for
// the same row, parameters and seed (docs/cuda.md, "Sampling on the device").
//
// A token's probability weight is an integer: W = floor(exp(z - m) * 2^S), with z the token's
// scaled logit, m the row's largest and S = WeightShift(vocab), so the most likely token weighs
// exactly 2^S and a whole row sums below 2^63. Integer sums are exact and do not depend on the
// order of the additions, which is what lets a GPU block add a row's weights in any order
// (shared-memory atomics, tree reductions) and still agree with the host's loop. exp is
// DetExp below: IEEE-754 operations only, every multiply-add an explicit fma (correctly
// rounded on both sides), so its bits do not depend on the compiler, the library or the
// device. Weights below 2^-S of the favourite's round to zero: such a token (probability
// below ~3e-14 on GLM's vocabulary) is never drawn.
//
// No standard-library containers or absl here: nvcc compiles this for the device.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GLM_HD __host__ __device__
#else
#define GLM_HD
#endif

namespace glmserve::samplemath {

// top_p arrives as a float and the probabilities come from float logits, so each carries
// about 1e-7 relative error. A nucleus that falls short of top_p by less than this still
// counts as reaching it; otherwise top_p = 0.8 over probabilities 0.5 and 0.3 would keep a
// third token or not depending on the last bit of exp.
inline constexpr double kTopPSlack = 1e-6;

GLM_HD inline uint64_t DoubleBits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  return __builtin_bit_cast(uint64_t, x);
#endif
}

GLM_HD inline double BitsDouble(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  return __builtin_bit_cast(double, bits);
#endif
}

GLM_HD inline double Infinity() { return BitsDouble(0x7ff0000000000000ULL); }

GLM_HD inline bool IsNan(double x) { return x != x; }

GLM_HD inline double NanToNegInf(double x) { return IsNan(x) ? -Infinity() : x; }

GLM_HD inline double Fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The standard splitmix64 output function (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a bijection with full avalanche, so consecutive
// indices give independent-looking outputs without any generator state.
GLM_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits, a pure function of (seed, token_index): a request's
// stream never depends on batching, preemption or how many tokens were drawn before.
GLM_HD inline double Uniform(uint64_t seed, uint64_t token_index) {
  return static_cast<double>(SplitMix64(seed ^ SplitMix64(token_index)) >> 11) * 0x1.0p-53;
}

// The CTRL penalty: shrink positive logits, push non-positive ones further down, so a
// penalty > 1 always lowers the token's probability.
GLM_HD inline double Penalise(double x, double penalty) {
  return NanToNegInf(x > 0.0 ? x / penalty : x * penalty);
}

// S for a row of `vocab` ids: the largest shift with vocab * 2^S < 2^63.
GLM_HD inline int WeightShift(int64_t vocab) {
  int bits = 0;
  for (uint64_t v = static_cast<uint64_t>(vocab); v != 0; v >>= 1) ++bits;
  return 63 - bits;
}

// exp(x) for x <= 0, within a few ulp: x = k ln2 + r (Cody-Waite, ln2 split so that k * hi is
// exact), e^r by its Taylor series to r^13 (|r| <= 0.35: truncation below 1e-17), times 2^k.
// 0 below -700 (the weights that use it are zero long before).
GLM_HD inline double DetExpCore(double x);
GLM_HD inline double DetExp(double x) { return x > -700.0 ? DetExpCore(x) : 0.0; }

// DetExp without the range check, for x in [-700, 0] (a loop over a row can then run as
// vectors: callers clamp instead of branching).
GLM_HD inline double DetExpCore(double x) {
  const double k = rint(x * 0x1.71547652b82fep+0);  // x / ln 2, to the nearest integer
  double r = Fma(-k, 0x1.62e42fee00000p-1, x);      // ln 2, high part (trailing zeros)
  r = Fma(-k, 0x1.a39ef35793c76p-33, r);            // ln 2, low part
  double p = 0x1.6124613a86d09p-33;                 // 1/13!
  p = Fma(p, r, 0x1.1eed8eff8d898p-29);             // 1/12!
  p = Fma(p, r, 0x1.ae64567f544e4p-26);
  p = Fma(p, r, 0x1.27e4fb7789f5cp-22);
  p = Fma(p, r, 0x1.71de3a556c734p-19);
  p = Fma(p, r, 0x1.a01a01a01a01ap-16);
  p = Fma(p, r, 0x1.a01a01a01a01ap-13);
  p = Fma(p, r, 0x1.6c16c16c16c17p-10);
  p = Fma(p, r, 0x1.1111111111111p-7);
  p = Fma(p, r, 0x1.5555555555555p-5);
  p = Fma(p, r, 0x1.5555555555555p-3);
  p = Fma(p, r, 0x1.0000000000000p-1);
  p = Fma(p, r, 1.0);
  p = Fma(p, r, 1.0);
  // 2^k as a double (k >= -1010 here, a normal number): the product is exact.
  return p * BitsDouble(static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52);
}

// The integer weight of scaled logit z in a set whose largest is m (z <= m, neither NaN),
// with the limits taken where m is infinite: with m = +inf the +inf logits share all the
// mass; with m = -inf every logit is -inf and they are equally likely.
GLM_HD inline uint64_t IntWeight(double z, double m, int shift) {
  const uint64_t one = uint64_t{1} << shift;
  if (m == Infinity()) return z == Infinity() ? one : 0;
  if (m == -Infinity()) return one;
  const double w = DetExp(z - m) * BitsDouble(static_cast<uint64_t>(shift + 1023) << 52);
  return static_cast<uint64_t>(w);  // in [0, 2^S]: truncation is the floor
}

// min-p keeps the tokens whose probability is at least min_p times the favourite's: with the
// favourite at 2^S, those with W >= ceil(min_p 2^S) (min_p in (0, 1); the product is exact).
GLM_HD inline uint64_t MinPWeight(float min_p, int shift) {
  return static_cast<uint64_t>(
      ceil(static_cast<double>(min_p) * BitsDouble(static_cast<uint64_t>(shift + 1023) << 52)));
}

// The nucleus of top_p over a distribution of total weight z > 0: the shortest prefix of the
// canonical order whose weight reaches this, in [1, z].
GLM_HD inline uint64_t NucleusTarget(float top_p, uint64_t z) {
  const double t = ceil((static_cast<double>(top_p) - kTopPSlack) * static_cast<double>(z));
  if (!(t >= 1.0)) return 1;
  if (t >= static_cast<double>(z)) return z;
  return static_cast<uint64_t>(t);
}

// The draw u in [0, 1) over kept weight `kept` > 0: the token whose canonical prefix is the
// first to exceed the returned value (in [0, kept - 1]).
GLM_HD inline uint64_t DrawTarget(double u, uint64_t kept) {
  const double t = u * static_cast<double>(kept);
  if (!(t < static_cast<double>(kept))) return kept - 1;
  const uint64_t v = static_cast<uint64_t>(t);
  return v < kept ? v : kept - 1;
}

// The most top logprobs a row may ask of a device sampler (GenerateRequest's kMaxTopLogprobs).
inline constexpr int kMaxRowTopLogprobs = 20;

// One row's request to a device sampler (core/cuda/kernels.h LaunchRowSample): the
// SamplingParams fields the draw reads, and where the row's penalised ids (PenalisedIds:
// distinct, ascending, in range; none when the penalty is 1) sit in the step's id array.
struct RowSampling {
  float temperature = 0.0f;  // <= 0 or NaN: greedy
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t top_k = 0;
  int32_t penalised_begin = 0;
  int32_t penalised_count = 0;
  // The row's first `columns` ids are the vocabulary sampled from (0: all of it), as the
  // host sampler's row span (GenerateRequest::sample_vocab_limit).
  int32_t columns = 0;
  // A token chosen by the caller (>= 0, within the columns: GenerateRequest::forced) instead
  // of a draw; its logprobs are computed as a drawn token's.
  int32_t forced = -1;
  // The chosen token's logprob (log-softmax of the raw logits over the columns), and this many
  // most likely tokens with theirs (0..kMaxRowTopLogprobs; > 0 implies the chosen one's).
  bool logprob = false;
  int32_t top_logprobs = 0;
  uint64_t seed = 0;
  uint64_t token_index = 0;
};

}  // namespace glmserve::samplemath
