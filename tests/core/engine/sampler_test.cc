#include "core/engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace glmserve {
namespace {

using ::testing::HasSubstr;

constexpr float kInfF = std::numeric_limits<float>::infinity();

SamplingParams Sampling(float temperature, uint64_t seed = 7) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

int32_t Sample(const std::vector<float>& logits, const SamplingParams& params,
               uint64_t token_index = 0, const std::vector<int32_t>& history = {}) {
  return SampleToken(logits, params, history, token_index, 0).token;
}

// Counts of each token over `draws` consecutive token indices.
std::vector<int> Histogram(const std::vector<float>& logits, const SamplingParams& params,
                           int draws, const std::vector<int32_t>& history = {}) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = Sample(logits, params, static_cast<uint64_t>(i), history);
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    if (t >= 0 && t < static_cast<int32_t>(logits.size())) ++counts[t];
  }
  return counts;
}

// float64 reference softmax of logits / temperature.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, x / temperature);
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature - m);
  for (double& v : p) v /= sum;
  return p;
}

// float64 reference log-softmax of the logits.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double m = -INFINITY;
  for (float x : logits) m = std::max<double>(m, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - m);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - m - std::log(sum));
  return out;
}

// Logits whose softmax is `probs` (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// Frequencies match `expected` per token within `tolerance`, and a chi-square statistic over
// the tokens with nonzero expected probability stays below `chi2_bound`.
void ExpectFrequencies(const std::vector<int>& counts, const std::vector<double>& expected,
                       double tolerance, double chi2_bound) {
  ASSERT_EQ(counts.size(), expected.size());
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_NEAR(counts[i] / n, expected[i], tolerance) << "token " << i;
    if (expected[i] > 0) {
      const double e = expected[i] * n;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
    } else {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
    }
  }
  EXPECT_LT(chi2, chi2_bound);
}

// The tokens drawn at least once over `draws` token indices.
std::set<int32_t> Support(const std::vector<float>& logits, const SamplingParams& params,
                          int draws = 4000) {
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) seen.insert(Sample(logits, params, static_cast<uint64_t>(i)));
  return seen;
}

TEST(ValidateSamplingParamsTest, AcceptsValidParams) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 50;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repetition_penalty = 1.3f;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.temperature = 1e-6f;
  p.top_p = 1e-6f;
  p.min_p = 0.999f;
  p.repetition_penalty = 0.5f;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(ValidateSamplingParamsTest, RejectionsNameTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* field;
    void (*set)(SamplingParams&, float);
    float value;
  };
  const std::vector<Case> cases = {
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }, -0.1f},
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }, kInfF},
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }, nan},
      {"top_k", [](SamplingParams& p, float v) { p.top_k = static_cast<int32_t>(v); }, -1.0f},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, 0.0f},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, -0.5f},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, 1.01f},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }, nan},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }, -0.01f},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }, 1.0f},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }, nan},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }, 0.0f},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }, -1.0f},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }, kInfF},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }, nan},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p, c.value);
    const absl::Status s = ValidateSamplingParams(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field << "=" << c.value;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field)) << c.value;
  }
}

TEST(SamplerTest, GreedyIsArgmax) {
  const std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f};
  SamplingParams p;  // temperature 0
  EXPECT_EQ(Sample(logits, p), 1);
  // Truncation settings and the random stream play no part in greedy decoding.
  p.top_k = 1;
  p.top_p = 0.1f;
  p.min_p = 0.5f;
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    p.seed = seed;
    for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(Sample(logits, p, i), 1);
  }
}

TEST(SamplerTest, GreedyTiesGoToLowestId) {
  EXPECT_EQ(Sample({1.0f, 3.0f, 3.0f, 2.0f}, SamplingParams{}), 1);
  EXPECT_EQ(Sample({5.0f, 5.0f, 5.0f}, SamplingParams{}), 0);
  EXPECT_EQ(Sample({-kInfF, -kInfF}, SamplingParams{}), 0);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveLogits) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  EXPECT_EQ(Sample(logits, p, 0, {0}), 0);  // penalty 1: history is ignored
  p.repetition_penalty = 2.0f;              // 2.0 / 2 = 1.0 < 1.5
  EXPECT_EQ(Sample(logits, p, 0, {0}), 1);
  p.repetition_penalty = 1.2f;  // 2.0 / 1.2 = 1.67 > 1.5
  EXPECT_EQ(Sample(logits, p, 0, {0}), 0);
}

TEST(SamplerTest, RepetitionPenaltyMultipliesNegativeLogits) {
  // Dividing -1.0 by 2 would make it -0.5 and keep token 0 on top; multiplying gives -2.0.
  const std::vector<float> logits = {-1.0f, -1.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(Sample(logits, p, 0, {}), 0);
  EXPECT_EQ(Sample(logits, p, 0, {0}), 1);
}

TEST(SamplerTest, RepetitionPenaltyAppliesOncePerDistinctToken) {
  // Once: 2.0 / 1.5 = 1.33 > 1.2. Twice would give 0.89 < 1.2.
  const std::vector<float> logits = {2.0f, 1.2f};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  EXPECT_EQ(Sample(logits, p, 0, {0, 0, 0, 0}), 0);
}

TEST(SamplerTest, RepetitionPenaltyIgnoresOutOfRangeIds) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(Sample(logits, p, 0, {-1, 3, 1 << 30, -(1 << 30)}), 0);
  EXPECT_EQ(Sample(logits, p, 0, {-1, 0, 3}), 1);
}

TEST(SamplerTest, RepetitionPenaltyAppliesBeforeTemperature) {
  // The draws follow softmax(penalised / T) for a positive and a negative penalised logit
  // (penalising after dividing by T = 0.5 would give other probabilities).
  SamplingParams p = Sampling(0.5f, 31);
  p.repetition_penalty = 2.0f;
  const std::vector<float> positive = {3.0f, 2.0f, 2.0f};
  // 99.9th percentile of chi2 with 2 degrees of freedom is 13.8.
  ExpectFrequencies(Histogram(positive, p, 20000, {0}), Softmax({1.5f, 2.0f, 2.0f}, 0.5), 0.01,
                    13.8);
  const std::vector<float> negative = {-0.5f, -0.8f, -0.8f};
  ExpectFrequencies(Histogram(negative, p, 20000, {0}), Softmax({-1.0f, -0.8f, -0.8f}, 0.5), 0.01,
                    13.8);
}

TEST(SamplerTest, LogprobIgnoresPenaltyAndTemperature) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const SampledToken t = SampleToken(logits, p, std::vector<int32_t>{0}, 0, 3);
  ASSERT_EQ(t.token, 1);
  const std::vector<double> ref = LogSoftmax(logits);
  EXPECT_NEAR(t.logprob, ref[1], 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 0);  // raw ranking, not the penalised one
  EXPECT_NEAR(t.top[0].logprob, ref[0], 1e-6);
}

TEST(SamplerTest, TemperatureSamplingMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -2.0f};
  // chi-square bound: 99.9th percentile of chi2 with 4 degrees of freedom is 18.5.
  for (float temperature : {0.7f, 1.0f, 2.0f}) {
    SCOPED_TRACE(temperature);
    ExpectFrequencies(Histogram(logits, Sampling(temperature, 123), 20000),
                      Softmax(logits, temperature), 0.01, 18.5);
  }
}

TEST(SamplerTest, TemperatureSamplingOverManyTokens) {
  // Many tokens with similar probability: the canonical walk goes deep into the order.
  const std::vector<float> logits = testing::RandomVector(40, 5, 0.3f);
  ExpectFrequencies(Histogram(logits, Sampling(1.0f, 9), 40000), Softmax(logits), 0.006,
                    // 99.9th percentile of chi2 with 39 degrees of freedom is 72.1.
                    72.1);
}

TEST(SamplerTest, TopKNeverLeavesTheTopK) {
  const std::vector<float> logits = testing::RandomVector(1000, 3);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top5(order.begin(), order.begin() + 5);
  SamplingParams p = Sampling(3.0f);  // hot, so outside tokens would often be drawn
  p.top_k = 5;
  EXPECT_EQ(Support(logits, p), top5);
  p.top_k = 1;
  EXPECT_EQ(Support(logits, p, 200), (std::set<int32_t>{order[0]}));
}

TEST(SamplerTest, TopKRenormalisesOverTheKept) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -2.0f};
  SamplingParams p = Sampling(1.0f, 4);
  p.top_k = 3;
  std::vector<double> expected = Softmax({1.0f, 0.5f, 0.0f});
  expected.resize(logits.size(), 0.0);
  // 99.9th percentile of chi2 with 2 degrees of freedom is 13.8.
  ExpectFrequencies(Histogram(logits, p, 20000), expected, 0.01, 13.8);
}

TEST(SamplerTest, TopKTiesAtTheBoundaryKeepLowerIds) {
  SamplingParams p = Sampling(1.0f);
  p.top_k = 2;
  EXPECT_EQ(Support({1.0f, 1.0f, 1.0f, 0.0f}, p), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support({0.0f, 1.0f, 1.0f, 1.0f}, p), (std::set<int32_t>{1, 2}));
}

TEST(SamplerTest, TopKAtOrAboveVocabIsOff) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  for (int32_t k : {0, 3, 4, 1 << 30}) {
    SamplingParams p = Sampling(1.0f);
    p.top_k = k;
    EXPECT_EQ(Support(logits, p, 500), (std::set<int32_t>{0, 1, 2})) << k;
  }
}

TEST(SamplerTest, TopPKeepsExactlyTheNucleus) {
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Sampling(1.0f);
  p.top_p = 0.8f;  // 0.5 + 0.3 reaches it
  ExpectFrequencies(Histogram(logits, p, 20000), {0.625, 0.375, 0.0, 0.0}, 0.01, 10.8);
  p.top_p = 0.81f;
  ExpectFrequencies(Histogram(logits, p, 20000), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0}, 0.01,
                    13.8);
  p.top_p = 0.5f;
  EXPECT_EQ(Support(logits, p, 500), (std::set<int32_t>{0}));
  p.top_p = 1e-6f;  // always at least one token
  EXPECT_EQ(Support(logits, p, 500), (std::set<int32_t>{0}));
  p.top_p = 1.0f;
  EXPECT_EQ(Support(logits, p), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplerTest, TopPAppliesAfterTopK) {
  // Over all four tokens, top_p = 0.84 needs three (0.5 + 0.3 < 0.84). After top_k = 3 the
  // probabilities are 0.526, 0.316, 0.158 and two reach 0.842.
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Sampling(1.0f);
  p.top_p = 0.84f;
  EXPECT_EQ(Support(logits, p), (std::set<int32_t>{0, 1, 2}));
  p.top_k = 3;
  EXPECT_EQ(Support(logits, p), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Sampling(1.0f);
  p.min_p = 0.2f;  // drops prob < 0.1
  ExpectFrequencies(Histogram(logits, p, 20000), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0}, 0.01,
                    13.8);
  p.min_p = 0.5f;  // drops prob < 0.25
  EXPECT_EQ(Support(logits, p), (std::set<int32_t>{0, 1}));
  p.min_p = 0.61f;  // drops prob < 0.305
  EXPECT_EQ(Support(logits, p, 500), (std::set<int32_t>{0}));
  p.min_p = 0.999f;  // the most likely token always survives
  EXPECT_EQ(Support(logits, p, 500), (std::set<int32_t>{0}));
}

TEST(SamplerTest, TopPAndMinPAreJudgedOnTheSameDistribution) {
  // min_p = 0.2 drops only the 0.05 token. top_p = 0.83 over the original distribution needs
  // three tokens (0.5 + 0.3 < 0.83). Had min-p renormalised first (0.526, 0.316, 0.158),
  // two tokens would reach 0.842 >= 0.83 and token 2 would never be drawn.
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Sampling(1.0f);
  p.min_p = 0.2f;
  p.top_p = 0.83f;
  ExpectFrequencies(Histogram(logits, p, 20000), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0}, 0.01,
                    13.8);
  // The intersection: min-p is the tighter of the two here.
  p.min_p = 0.5f;
  p.top_p = 0.9f;
  EXPECT_EQ(Support(logits, p), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, SameSeedAndIndexGiveTheSameToken) {
  const std::vector<float> logits = testing::RandomVector(64, 11, 0.5f);
  const SamplingParams p = Sampling(1.0f, 2024);
  for (uint64_t i = 0; i < 50; ++i) {
    const int32_t first = Sample(logits, p, i);
    for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(Sample(logits, p, i), first);
  }
}

TEST(SamplerTest, DifferentSeedsGiveDifferentStreams) {
  const std::vector<float> logits(16, 0.0f);
  std::set<std::vector<int32_t>> streams;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<int32_t> stream;
    for (uint64_t i = 0; i < 32; ++i) stream.push_back(Sample(logits, Sampling(1.0f, seed), i));
    EXPECT_GT(std::set<int32_t>(stream.begin(), stream.end()).size(), 4u) << seed;
    streams.insert(stream);
  }
  EXPECT_EQ(streams.size(), 20u);
}

TEST(SamplerTest, StreamDependsOnlyOnSeedAndIndex) {
  const std::vector<float> logits = testing::RandomVector(32, 13, 0.5f);
  const SamplingParams p = Sampling(0.9f, 77);
  std::vector<int32_t> forward, backward(40);
  for (uint64_t i = 0; i < 40; ++i) forward.push_back(Sample(logits, p, i));
  for (uint64_t i = 40; i-- > 0;) backward[i] = Sample(logits, p, i);
  EXPECT_EQ(forward, backward);
  // A fresh call at index 5 equals the 6th of a run from 0; the history does not feed the
  // random stream (penalty 1 leaves the logits unchanged).
  EXPECT_EQ(Sample(logits, p, 5, {1, 2, 3}), forward[5]);
}

// Reference splitmix64 (Steele et al. 2014) for checking the documented stream.
uint64_t RefSplitMix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

TEST(SamplerTest, UniformStreamIsTheDocumentedSplitMix) {
  // The first output of a splitmix64 generator seeded with 0, as published.
  ASSERT_EQ(RefSplitMix64(0), 0xe220a8397b1dcdafULL);
  // With 16 equal logits every weight is exactly 1 and the canonical order is by id, so the
  // drawn token is floor(16 u) with u = (splitmix64(seed ^ splitmix64(index)) >> 11) 2^-53.
  const std::vector<float> logits(16, 0.25f);
  for (uint64_t seed : {0ull, 42ull, 0xdeadbeefcafef00dull}) {
    for (uint64_t i = 0; i < 200; ++i) {
      const double u =
          static_cast<double>(RefSplitMix64(seed ^ RefSplitMix64(i)) >> 11) * 0x1.0p-53;
      EXPECT_EQ(Sample(logits, Sampling(1.0f, seed), i), static_cast<int32_t>(u * 16))
          << seed << " " << i;
    }
  }
}

// The documented semantics written the slow, obvious way: penalise, scale, full sort, top-k,
// min-p and top-p on the same distribution, then a walk in canonical order. kTopPSlack
// mirrors the sampler's allowance for top_p's float rounding.
class ReferenceSampler {
 public:
  ReferenceSampler(const std::vector<float>& logits, const SamplingParams& p,
                   const std::vector<int32_t>& history)
      : seed_(p.seed) {
    constexpr double kTopPSlack = 1e-6;
    const size_t n = logits.size();
    std::vector<double> z(logits.begin(), logits.end());
    for (int32_t id : history) {
      const double x = logits[id];
      z[id] = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    }
    for (double& x : z) x /= p.temperature;
    ids_.resize(n);
    std::iota(ids_.begin(), ids_.end(), 0);
    std::sort(ids_.begin(), ids_.end(),
              [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) ids_.resize(p.top_k);
    const double max = z[ids_[0]];
    w_.assign(n, 0.0);
    for (int32_t id : ids_) w_[id] = std::exp(z[id] - max);
    std::sort(ids_.begin(), ids_.end());
    double total = 0.0;
    for (int32_t id : ids_) total += w_[id];
    std::sort(ids_.begin(), ids_.end(),
              [&](int32_t a, int32_t b) { return w_[a] > w_[b] || (w_[a] == w_[b] && a < b); });
    while (kept_ < ids_.size() && (kept_ == 0 || w_[ids_[kept_]] >= p.min_p)) {
      mass_ += w_[ids_[kept_++]];
      if (p.top_p < 1.0f && mass_ >= (p.top_p - kTopPSlack) * total) break;
    }
  }

  int32_t Sample(uint64_t index) const {
    const double u =
        static_cast<double>(RefSplitMix64(seed_ ^ RefSplitMix64(index)) >> 11) * 0x1.0p-53;
    double cumulative = 0.0;
    for (size_t r = 0; r < kept_; ++r) {
      cumulative += w_[ids_[r]];
      if (cumulative > u * mass_) return ids_[r];
    }
    return ids_[kept_ - 1];
  }

 private:
  uint64_t seed_;
  std::vector<int32_t> ids_;  // canonical order
  std::vector<double> w_;     // by id
  size_t kept_ = 0;
  double mass_ = 0.0;
};

TEST(SamplerTest, MatchesReferenceOnLargeVocabulary) {
  // Many tokens per weight bin and walks that end deep in the order, for each filter and
  // both top-k selection strategies (heap for small k, nth_element for large k).
  const std::vector<float> logits = testing::RandomVector(20000, 29, 2.0f);
  const std::vector<int32_t> history = {5, 17, 17, 4000, 19999};
  std::vector<SamplingParams> configs;
  for (float temperature : {0.3f, 1.0f, 2.5f}) configs.push_back(Sampling(temperature, 3));
  SamplingParams c = Sampling(1.5f, 4);
  c.top_k = 100;
  configs.push_back(c);
  c.top_k = 5000;
  configs.push_back(c);
  c = Sampling(1.5f, 5);
  c.top_p = 0.7f;
  configs.push_back(c);
  c.min_p = 0.01f;
  configs.push_back(c);
  c.top_k = 3000;
  c.repetition_penalty = 1.3f;
  configs.push_back(c);
  for (size_t i = 0; i < configs.size(); ++i) {
    const ReferenceSampler reference(logits, configs[i], history);
    int mismatches = 0;
    for (uint64_t index = 0; index < 300; ++index) {
      const int32_t got = Sample(logits, configs[i], index, history);
      const int32_t want = reference.Sample(index);
      if (got != want && ++mismatches <= 3) {
        ADD_FAILURE() << "config " << i << " index " << index << ": " << got << " vs " << want;
      }
    }
    EXPECT_EQ(mismatches, 0) << "config " << i;
  }
}

TEST(SamplerTest, LogprobIsRawLogSoftmax) {
  const std::vector<float> logits = testing::RandomVector(1000, 17, 2.0f);
  const std::vector<double> ref = LogSoftmax(logits);
  SamplingParams p = Sampling(0.5f);
  p.top_k = 10;
  p.repetition_penalty = 1.3f;
  for (uint64_t i = 0; i < 20; ++i) {
    const SampledToken t = SampleToken(logits, p, std::vector<int32_t>{1, 2, 3}, i, 0);
    EXPECT_EQ(t.logprob, static_cast<float>(ref[t.token])) << t.token;
    EXPECT_TRUE(t.top.empty());
  }
}

TEST(SamplerTest, TopLogprobsAreSortedAndCorrect) {
  const std::vector<float> logits = testing::RandomVector(50, 19);
  const std::vector<double> ref = LogSoftmax(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const SampledToken t = SampleToken(logits, Sampling(1.0f), {}, 0, 5);
  ASSERT_EQ(t.top.size(), 5u);
  for (size_t r = 0; r < 5; ++r) {
    EXPECT_EQ(t.top[r].token, order[r]) << r;
    EXPECT_EQ(t.top[r].logprob, static_cast<float>(ref[order[r]])) << r;
    if (r > 0) {
      EXPECT_GE(t.top[r - 1].logprob, t.top[r].logprob);
    }
  }
}

TEST(SamplerTest, TopLogprobsCountIsClamped) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f};
  EXPECT_TRUE(SampleToken(logits, SamplingParams{}, {}, 0, 0).top.empty());
  EXPECT_TRUE(SampleToken(logits, SamplingParams{}, {}, 0, -3).top.empty());
  const SampledToken t = SampleToken(logits, SamplingParams{}, {}, 0, 100);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_EQ(t.top[1].token, 2);
  EXPECT_EQ(t.top[2].token, 0);
}

TEST(SamplerTest, TopLogprobsTiesGoToLowerIds) {
  const SampledToken t = SampleToken({1.0f, 3.0f, 1.0f, 3.0f, 1.0f}, SamplingParams{}, {}, 0, 4);
  ASSERT_EQ(t.top.size(), 4u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_EQ(t.top[1].token, 3);
  EXPECT_EQ(t.top[2].token, 0);
  EXPECT_EQ(t.top[3].token, 2);
  EXPECT_EQ(t.top[0].logprob, t.top[1].logprob);
}

TEST(SamplerTest, TinyTemperatureActsLikeGreedy) {
  const std::vector<float> logits = {1.0f, 1.001f, 0.999f, -5.0f};
  const SamplingParams p = Sampling(1e-6f);
  for (uint64_t i = 0; i < 500; ++i) {
    const SampledToken t = SampleToken(logits, p, {}, i, 2);
    EXPECT_EQ(t.token, 1);
    EXPECT_TRUE(std::isfinite(t.logprob));
  }
  // Logits near the float limit divided by a tiny temperature stay finite in float64.
  const std::vector<float> big = {-3e38f, 3e38f, 2.9e38f, 0.0f};
  for (float temperature : {1e-6f, 1e-30f, std::numeric_limits<float>::denorm_min()}) {
    for (uint64_t i = 0; i < 50; ++i) {
      const SampledToken t = SampleToken(big, Sampling(temperature), {}, i, 4);
      EXPECT_EQ(t.token, 1) << temperature;
      EXPECT_EQ(t.logprob, 0.0f);
      for (const TokenLogprob& lp : t.top) EXPECT_FALSE(std::isnan(lp.logprob));
    }
  }
}

TEST(SamplerTest, HugeAndInfiniteLogitsGiveNoNan) {
  const std::vector<float> logits = {1e30f, -kInfF, 0.0f, 1e30f};
  SamplingParams p = Sampling(1.0f);
  p.repetition_penalty = 1.5f;
  std::set<int32_t> seen;
  for (uint64_t i = 0; i < 200; ++i) {
    const SampledToken t = SampleToken(logits, p, std::vector<int32_t>{1, 2}, i, 4);
    seen.insert(t.token);
    EXPECT_NEAR(t.logprob, std::log(0.5), 1e-6);
    ASSERT_EQ(t.top.size(), 4u);
    for (const TokenLogprob& lp : t.top) EXPECT_FALSE(std::isnan(lp.logprob));
    EXPECT_EQ(t.top[3].token, 1);
    EXPECT_EQ(t.top[3].logprob, -kInfF);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 3}));  // the two tied 1e30 logits

  // +inf dominates; NaN counts as -inf; all -inf is uniform rather than NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const SamplingParams& q : {SamplingParams{}, Sampling(1.0f)}) {
    const SampledToken inf = SampleToken({1.0f, kInfF, nan, 3.0f}, q, {}, 3, 4);
    EXPECT_EQ(inf.token, 1);
    EXPECT_EQ(inf.logprob, 0.0f);
    EXPECT_EQ(inf.top.back().token, 2);
    EXPECT_EQ(inf.top.back().logprob, -kInfF);
    EXPECT_NE(SampleToken({nan, 0.0f}, q, {}, 3, 0).token, 0);
    const SampledToken none = SampleToken({-kInfF, -kInfF, -kInfF, -kInfF}, q, {}, 3, 2);
    EXPECT_GE(none.token, 0);
    EXPECT_LT(none.token, 4);
    EXPECT_NEAR(none.logprob, std::log(0.25), 1e-6);
  }
}

TEST(SamplerTest, EmptyLogitsDoNotCrash) {
  const SampledToken t = SampleToken({}, Sampling(1.0f), {}, 0, 5);
  EXPECT_TRUE(t.top.empty());
}

}  // namespace
}  // namespace glmserve
