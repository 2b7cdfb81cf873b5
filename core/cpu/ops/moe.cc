#include "core/cpu/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include "core/base/op_times.h"
#include "core/cpu/ops/ffn.h"
#include "core/cpu/ops/linear.h"
#include "core/model/row_math.h"

namespace glmserve {

void RouteTokens(const float* logits, int64_t tokens, const float* correction_bias,
                 const RouterParams& p, int32_t* experts, float* weights) {
  const int64_t n = p.n_experts;
  std::vector<float> s(n), c(n);  // scratch: sigmoid scores, bias-corrected choice scores
  for (int64_t t = 0; t < tokens; ++t) {
    rowmath::RouteRow(logits + t * n, correction_bias, p, s.data(), c.data(), experts + t * p.top_k,
                      weights + t * p.top_k);
  }
}

void MoeFfn(const float* x, int64_t tokens, const MoeWeights& w, const RouterParams& p, float* y,
            CpuMath math, int32_t* choices) {
  const int64_t hidden = w.router.cols;
  std::optional<ScopedOpTime> timer(std::in_place, OpFamily::kRouter);
  // Router in fp32 (weights widened exactly), as the reference does.
  std::vector<float> router_logits(tokens * p.n_experts);
  Linear(x, tokens, w.router, nullptr, router_logits.data());
  std::vector<int32_t> chosen(tokens * p.top_k);
  std::vector<float> chosen_weight(tokens * p.top_k);
  RouteTokens(router_logits.data(), tokens, w.router_bias.data(), p, chosen.data(),
              chosen_weight.data());

  timer.emplace(OpFamily::kMoeShuffle);
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
  if (choices != nullptr) std::copy(chosen.begin(), chosen.end(), choices);

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
  timer.emplace(OpFamily::kExpertGemm);
  LinearMany(jobs, math);
  timer.emplace(OpFamily::kMoeShuffle);
  jobs.clear();
  for (Active& a : active) {
    SiluMul(a.gate.data(), a.up.data(), static_cast<int64_t>(a.gate.size()));
    jobs.push_back({a.gate.data(), a.m, &a.w->down, nullptr, a.out.data()});
  }
  timer.emplace(OpFamily::kExpertGemm);
  LinearMany(jobs, math);
  timer.emplace(OpFamily::kMoeShuffle);

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
