#include "core/cpu/ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/test_util.h"

namespace glmserve {
namespace {

float Logit(float p) { return std::log(p / (1 - p)); }  // inverse sigmoid

RouterParams Params(int64_t n, int64_t k, int64_t groups = 1, int64_t keep = 1, bool norm = true,
                    float scale = 1.f) {
  RouterParams p;
  p.n_experts = n;
  p.top_k = k;
  p.n_group = groups;
  p.topk_group = keep;
  p.norm_topk_prob = norm;
  p.routed_scaling_factor = scale;
  return p;
}

TEST(RouterTest, BiasSelectsButDoesNotWeigh) {
  // Sigmoid scores 0.9, 0.8, 0.3, 0.2; a bias of +1 on expert 3 makes it win selection, but
  // its weight comes from its unbiased score 0.2.
  const float logits[] = {Logit(0.9f), Logit(0.8f), Logit(0.3f), Logit(0.2f)};
  const float bias[] = {0.f, 0.f, 0.f, 1.f};
  int32_t experts[2];
  float weights[2];
  RouteTokens(logits, 1, bias, Params(4, 2, 1, 1, /*norm=*/true, /*scale=*/2.5f), experts, weights);
  EXPECT_EQ(experts[0], 3);
  EXPECT_EQ(experts[1], 0);
  EXPECT_NEAR(weights[0], 2.5 * 0.2 / 1.1, 1e-6);
  EXPECT_NEAR(weights[1], 2.5 * 0.9 / 1.1, 1e-6);
}

TEST(RouterTest, GroupLimitedSelection) {
  // 8 experts in 4 groups of 2, keep 2 groups. Group sums: g0 = .5+.5, g1 = .95+.1,
  // g2 = .6+.6, g3 = .9+.2: kept g2 (1.2) and g3 (1.1). Expert 2 (0.95) is the single best
  // but its group loses, so it is not chosen.
  const float p[] = {.5f, .5f, .95f, .1f, .6f, .6f, .9f, .2f};
  float logits[8], bias[8] = {};
  for (int i = 0; i < 8; ++i) logits[i] = Logit(p[i]);
  int32_t experts[3];
  float weights[3];
  RouteTokens(logits, 1, bias, Params(8, 3, 4, 2, /*norm=*/false), experts, weights);
  std::vector<int32_t> chosen(experts, experts + 3);
  std::sort(chosen.begin(), chosen.end());
  EXPECT_EQ(chosen, (std::vector<int32_t>{4, 5, 6}));
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(weights[k], p[experts[k]], 1e-6);  // unnormalised
}

TEST(RouterTest, MaskedGroupsAreNeverChosenEvenOverNegativeScores) {
  // 4 experts in 2 groups; a bias of -2 makes every corrected score negative. Group 1
  // (experts 2, 3) wins; top-2 must come from it even though a masked score of 0 (the older
  // masked_fill(0.0) behaviour) would beat them.
  const float logits[] = {Logit(.1f), Logit(.1f), Logit(.9f), Logit(.8f)};
  const float bias[] = {-2.f, -2.f, -2.f, -2.f};
  int32_t experts[2];
  float weights[2];
  RouteTokens(logits, 1, bias, Params(4, 2, 2, 1), experts, weights);
  EXPECT_EQ(experts[0], 2);
  EXPECT_EQ(experts[1], 3);
}

TEST(RouterTest, TiesPickLowerIndexAndEveryExpertCanBeChosen) {
  float logits[6] = {}, bias[6] = {};  // all scores equal
  int32_t experts[6];
  float weights[6];
  RouteTokens(logits, 1, bias, Params(6, 2), experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 1);
  EXPECT_NEAR(weights[0], 0.5, 1e-6);
  RouteTokens(logits, 1, bias, Params(6, 6), experts, weights);  // top-k = all experts
  std::vector<int32_t> all(experts, experts + 6);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  float sum = 0;
  for (float w : weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

// A whole MoE FFN against a float64 evaluation of the same formula; the shared expert twice as
// wide as a routed one (n_shared_experts = 2).
TEST(MoeFfnTest, MatchesFloat64Reference) {
  const int64_t hidden = 24, inter = 10, shared_inter = 20, n = 6, tokens = 5;
  RouterParams p = Params(n, 3, 3, 2, true, 1.7f);
  std::vector<std::vector<float>> storage;
  auto make = [&](int64_t rows, int64_t cols, uint32_t seed) {
    storage.push_back(testing::RandomVector(rows * cols, seed, 0.3f));
    return Matrix{DType::kF32, rows, cols, storage.back().data()};
  };
  storage.reserve(64);
  MoeWeights w;
  w.router = make(n, hidden, 1);
  w.router_bias = testing::RandomVector(n, 2, 0.1f);
  for (int64_t e = 0; e < n; ++e) {
    w.experts.push_back(
        {make(inter, hidden, 10 + e), make(inter, hidden, 20 + e), make(hidden, inter, 30 + e)});
  }
  w.shared = {make(shared_inter, hidden, 40), make(shared_inter, hidden, 41),
              make(hidden, shared_inter, 42)};
  std::vector<float> x = testing::RandomVector(tokens * hidden, 3);
  std::vector<float> y(tokens * hidden, NAN);
  MoeFfn(x.data(), tokens, w, p, y.data());

  auto ffn = [&](const FfnWeights& f, const float* xr, std::vector<double>& out) {
    auto at = [](const Matrix& m, int64_t r, int64_t c) {
      return double(static_cast<const float*>(m.data)[r * m.cols + c]);
    };
    const int64_t width = f.gate.rows;
    std::vector<double> act(width);
    for (int64_t i = 0; i < width; ++i) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < hidden; ++c)
        g += at(f.gate, i, c) * xr[c], u += at(f.up, i, c) * xr[c];
      act[i] = g / (1 + std::exp(-g)) * u;
    }
    out.assign(hidden, 0);
    for (int64_t d = 0; d < hidden; ++d)
      for (int64_t i = 0; i < width; ++i) out[d] += at(f.down, d, i) * act[i];
  };
  std::vector<float> ref(tokens * hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xr = x.data() + t * hidden;
    std::vector<float> logits(n);
    for (int64_t e = 0; e < n; ++e) {
      double l = 0;
      for (int64_t c = 0; c < hidden; ++c)
        l += double(static_cast<const float*>(w.router.data)[e * hidden + c]) * xr[c];
      logits[e] = float(l);
    }
    int32_t chosen[3];
    float cw[3];
    RouteTokens(logits.data(), 1, w.router_bias.data(), p, chosen, cw);
    std::vector<double> acc(hidden, 0), out;
    for (int k = 0; k < 3; ++k) {
      ffn(w.experts[chosen[k]], xr, out);
      for (int64_t d = 0; d < hidden; ++d) acc[d] += cw[k] * out[d];
    }
    ffn(w.shared, xr, out);
    for (int64_t d = 0; d < hidden; ++d) ref[t * hidden + d] = float(acc[d] + out[d]);
  }
  EXPECT_LT(testing::RelativeError(y, ref), 1e-5);
}

}  // namespace
}  // namespace glmserve
