// The per-row arithmetic the GPU kernels share with the host (core/model/row_math.h), checked
// on the CPU against the CPU backend's ops: runs on every machine, GPU or not.
#include "core/model/row_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cpu/ops/ffn.h"
#include "core/cpu/ops/moe.h"
#include "core/cpu/ops/norm.h"
#include "core/cpu/ops/rope.h"
#include "tests/test_util.h"

namespace glmserve {
namespace {

struct RouterCase {
  int n_experts, top_k, n_group, topk_group;
  bool norm;
  float scale;
};

class CudaRowMathRouter : public ::testing::TestWithParam<RouterCase> {};

TEST_P(CudaRowMathRouter, RouteRowEqualsRouteTokens) {
  const RouterCase rc = GetParam();
  RouterParams p;
  p.n_experts = rc.n_experts;
  p.top_k = rc.top_k;
  p.n_group = rc.n_group;
  p.topk_group = rc.topk_group;
  p.norm_topk_prob = rc.norm;
  p.routed_scaling_factor = rc.scale;
  rowmath::RouterRowParams q;
  q.n_experts = rc.n_experts;
  q.top_k = rc.top_k;
  q.n_group = rc.n_group;
  q.topk_group = rc.topk_group;
  q.norm_topk_prob = rc.norm;
  q.routed_scaling_factor = rc.scale;

  const int64_t tokens = 64;
  std::vector<float> logits = testing::RandomVector(tokens * rc.n_experts, 7, 2.0f);
  // Ties: some rows all equal, some with repeated values, to check the lower-index rule.
  for (int e = 0; e < rc.n_experts; ++e) logits[e] = 0.25f;
  for (int e = 0; e < rc.n_experts; ++e) logits[rc.n_experts + e] = static_cast<float>(e % 3);
  for (const float bias_scale : {0.0f, 0.1f, -8.0f}) {
    std::vector<float> bias = testing::RandomVector(rc.n_experts, 11, 0.1f);
    for (float& b : bias) b = bias_scale == 0.0f ? 0.0f : (bias_scale < 0 ? b + bias_scale : b);
    std::vector<int32_t> want_ids(tokens * rc.top_k);
    std::vector<float> want_w(tokens * rc.top_k);
    RouteTokens(logits.data(), tokens, bias.data(), p, want_ids.data(), want_w.data());
    std::vector<float> s(rc.n_experts), c(rc.n_experts);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> ids(rc.top_k);
      std::vector<float> w(rc.top_k);
      rowmath::RouteRow(logits.data() + t * rc.n_experts, bias.data(), q, s.data(), c.data(),
                        ids.data(), w.data());
      for (int k = 0; k < rc.top_k; ++k) {
        ASSERT_EQ(ids[k], want_ids[t * rc.top_k + k]) << "token " << t << " k " << k;
        ASSERT_EQ(w[k], want_w[t * rc.top_k + k]) << "token " << t << " k " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaRowMathRouter,
    ::testing::Values(RouterCase{8, 2, 1, 1, true, 2.5f}, RouterCase{8, 3, 4, 2, false, 1.7f},
                      RouterCase{8, 2, 2, 1, true, 1.0f}, RouterCase{128, 8, 1, 1, true, 1.0f},
                      RouterCase{160, 8, 1, 1, true, 2.5f}, RouterCase{256, 8, 8, 4, true, 2.5f},
                      RouterCase{512, 32, 64, 8, false, 1.0f}));

TEST(CudaRowMath, SiluMulEqualsCpu) {
  std::vector<float> g = testing::RandomVector(1000, 3, 4.0f);
  const std::vector<float> u = testing::RandomVector(1000, 4, 1.0f);
  std::vector<float> want = g;
  SiluMul(want.data(), u.data(), 1000);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(rowmath::SiluMul(g[i], u[i]), want[i]) << i;
}

TEST(CudaRowMath, RopeEqualsCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 64}, {24, 12}, {32, 32}};
  for (const auto& [head_dim, rotary] : shapes) {
    const RotaryEmbedding rope(head_dim, rotary, 1e6);
    const int64_t heads = 3;
    const std::vector<int32_t> positions = {0, 1, 17, 4095, 131071};
    const int64_t tokens = static_cast<int64_t>(positions.size());
    std::vector<float> x = testing::RandomVector(tokens * heads * head_dim, 5);
    std::vector<float> want = x;
    rope.Apply(want.data(), tokens, heads, positions.data());
    const int64_t half = rotary / 2;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = x.data() + (t * heads + h) * head_dim;
        const float* w = want.data() + (t * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float c, s, a, b;
          rowmath::RopeCosSin(positions[t], rope.inv_freq()[i], &c, &s);
          rowmath::RotatePair(v[i], v[i + half], c, s, &a, &b);
          ASSERT_EQ(a, w[i]);
          ASSERT_EQ(b, w[i + half]);
        }
        for (int64_t i = rotary; i < head_dim; ++i) ASSERT_EQ(v[i], w[i]);
      }
    }
  }
}

TEST(CudaRowMath, RmsInvScaleMatchesRmsNorm) {
  for (const int64_t width : {1, 7, 64, 4096}) {
    const std::vector<float> x = testing::RandomVector(width, 9, 3.0f);
    const std::vector<float> gain = testing::RandomVector(width, 10, 1.0f);
    std::vector<float> want(width), got(width);
    RmsNorm(x.data(), gain.data(), 1, width, 1e-5f, want.data());
    double sum = 0;
    for (float v : x) sum += static_cast<double>(v) * v;
    const float inv = rowmath::RmsInvScale(static_cast<float>(sum), width, 1e-5f);
    for (int64_t i = 0; i < width; ++i) got[i] = gain[i] * (x[i] * inv);
    EXPECT_LT(testing::RelativeError(got, want), 1e-6) << width;
  }
}

}  // namespace
}  // namespace glmserve
