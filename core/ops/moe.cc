#include "core/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/ops/ffn.h"
#include "core/ops/linear.h"

namespace glmserve {

RouterParams RouterParams::FromConfig(const ModelConfig& c) {
  RouterParams p;
  p.n_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  return p;
}

namespace {

// Indices of the k largest values (ties: lower index first), best first.
void TopK(const float* values, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  std::copy_n(order.begin(), k, out);
}

}  // namespace

void RouteTokens(const float* logits, int64_t tokens, const float* correction_bias,
                 const RouterParams& p, int32_t* experts, float* weights) {
  const int64_t n = p.n_experts, group_size = n / p.n_group;
  std::vector<float> s(n), c(n), group_score(p.n_group);
  std::vector<int32_t> kept_groups(p.topk_group);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * n;
    for (int64_t e = 0; e < n; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      c[e] = s[e] + correction_bias[e];
    }
    if (p.n_group > 1) {
      for (int64_t g = 0; g < p.n_group; ++g) {
        int32_t best2[2];
        TopK(c.data() + g * group_size, group_size, 2, best2);
        group_score[g] = c[g * group_size + best2[0]] + c[g * group_size + best2[1]];
      }
      TopK(group_score.data(), p.n_group, p.topk_group, kept_groups.data());
      std::vector<bool> keep(p.n_group, false);
      for (int32_t g : kept_groups) keep[g] = true;
      for (int64_t e = 0; e < n; ++e) {
        if (!keep[e / group_size]) c[e] = -INFINITY;
      }
    }
    int32_t* chosen = experts + t * p.top_k;
    float* w = weights + t * p.top_k;
    TopK(c.data(), n, p.top_k, chosen);
    float sum = 0.f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      w[k] = s[chosen[k]];
      sum += w[k];
    }
    const float denom = p.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      w[k] = (p.norm_topk_prob ? w[k] / denom : w[k]) * p.routed_scaling_factor;
    }
  }
}

void MoeFfn(const float* x, int64_t tokens, const MoeWeights& w, const RouterParams& p, float* y,
            CpuMath math) {
  const int64_t hidden = w.router.cols;
  // Router in fp32 (weights widened exactly), as the reference does.
  std::vector<float> router_logits(tokens * p.n_experts);
  Linear(x, tokens, w.router, nullptr, router_logits.data());
  std::vector<int32_t> chosen(tokens * p.top_k);
  std::vector<float> chosen_weight(tokens * p.top_k);
  RouteTokens(router_logits.data(), tokens, w.router_bias.data(), p, chosen.data(),
              chosen_weight.data());

  // Group tokens by expert: expert e gets rows routed_rows[e] with weights routed_w[e].
  std::vector<std::vector<int32_t>> routed_rows(p.n_experts);
  std::vector<std::vector<float>> routed_w(p.n_experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int32_t e = chosen[t * p.top_k + k];
      routed_rows[e].push_back(static_cast<int32_t>(t));
      routed_w[e].push_back(chosen_weight[t * p.top_k + k]);
    }
  }

  // Every active expert (and the shared one) in two parallel loops: all gate/up projections,
  // then all down projections. Expert e's rows are gathered into xs[e].
  struct Active {
    const FfnWeights* w;
    const float* x;
    int64_t m;
    std::vector<float> gathered, gate, up, out;
  };
  std::vector<Active> active;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const std::vector<int32_t>& rows = routed_rows[e];
    if (rows.empty()) continue;
    Active a{&w.experts[e], nullptr, static_cast<int64_t>(rows.size()), {}, {}, {}, {}};
    a.gathered.resize(a.m * hidden);
    for (int64_t i = 0; i < a.m; ++i)
      std::copy_n(x + rows[i] * hidden, hidden, a.gathered.data() + i * hidden);
    active.push_back(std::move(a));
  }
  for (Active& a : active) a.x = a.gathered.data();
  if (w.has_shared()) active.push_back(Active{&w.shared, x, tokens, {}, {}, {}, {}});
  std::vector<LinearJob> jobs;
  for (Active& a : active) {
    const int64_t width = a.w->gate.rows;
    a.gate.resize(a.m * width);
    a.up.resize(a.m * width);
    a.out.resize(a.m * hidden);
    jobs.push_back({a.x, a.m, &a.w->gate, nullptr, a.gate.data()});
    jobs.push_back({a.x, a.m, &a.w->up, nullptr, a.up.data()});
  }
  LinearMany(jobs, math);
  jobs.clear();
  for (Active& a : active) {
    SiluMul(a.gate.data(), a.up.data(), static_cast<int64_t>(a.gate.size()));
    jobs.push_back({a.gate.data(), a.m, &a.w->down, nullptr, a.out.data()});
  }
  LinearMany(jobs, math);

  // y = sum over experts in ascending order of w * out, then + shared: per token, an order
  // that does not depend on the other tokens.
  std::fill_n(y, tokens * hidden, 0.f);
  size_t next = 0;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const std::vector<int32_t>& rows = routed_rows[e];
    if (rows.empty()) continue;
    const Active& a = active[next++];
    for (size_t i = 0; i < rows.size(); ++i) {
      float* yr = y + rows[i] * hidden;
      const float* er = a.out.data() + i * hidden;
      const float wi = routed_w[e][i];
      for (int64_t d = 0; d < hidden; ++d) yr[d] += er[d] * wi;
    }
  }
  if (w.has_shared()) {
    const std::vector<float>& shared = active.back().out;
    for (int64_t i = 0; i < tokens * hidden; ++i) y[i] += shared[i];
  }
}

}  // namespace glmserve
