#include "core/cpu/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/op_times.h"
#include "core/base/parallel.h"
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
  // Under expert parallel (docs/parallel.md) a rank holds some experts; the others' matrices
  // are empty, and their pairs are computed (and added) by the ranks that hold them.
  const auto held = [&](int64_t e) { return !w.experts[e].gate.empty(); };
  // Group the held pairs by expert, tokens ascending: expert e gets `count[e]` rows starting at
  // row `first[e]` of the gathered buffers (experts ascending, the shared expert's rows last).
  // pair_row[t * top_k + k] is where token t's k-th choice landed (-1: not held here).
  const int64_t pairs = tokens * p.top_k;
  std::vector<int64_t> count(p.n_experts, 0), first(p.n_experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) count[chosen[i]] += held(chosen[i]) ? 1 : 0;
  for (int64_t e = 0; e < p.n_experts; ++e) first[e + 1] = first[e] + count[e];
  const int64_t routed_rows = first[p.n_experts];
  std::vector<int64_t> pair_row(pairs, -1), gathered_token(routed_rows);
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int32_t e = chosen[t * p.top_k + k];
      if (!held(e)) continue;
      const int64_t row = fill[e]++;
      pair_row[t * p.top_k + k] = row;
      gathered_token[row] = t;
    }
  }
  if (choices != nullptr) std::copy(chosen.begin(), chosen.end(), choices);

  // One arena for every expert's rows (reused from call to call on this thread: a 2,048-token
  // chunk's buffers are ~0.7 GB, whose page faults cost more than the copies).
  // The shared expert's width is n_shared_experts times a routed one's: its gate/up rows follow
  // the routed rows' at element offset routed_rows * width.
  int64_t width = 0;
  for (int64_t e = 0; e < p.n_experts && width == 0; ++e) width = w.experts[e].gate.rows;
  const int64_t shared_rows = w.has_shared() ? tokens : 0;
  const int64_t gate_size = routed_rows * width + shared_rows * w.shared.gate.rows;
  // They only grow (GrowTo): shrunk after a smaller call (a decode step, or the last layer's
  // few kept rows), they were zero-filled again, ~0.7 GB, on the next prompt's first MoE layer.
  // Plain pointers: the pool's threads must not name this thread's thread_locals.
  static thread_local AlignedVector<float> gathered_arena, gate_arena, up_arena, out_arena;
  float* gathered = GrowTo(&gathered_arena, routed_rows * hidden);
  float* gate = GrowTo(&gate_arena, gate_size);
  float* up = GrowTo(&up_arena, gate_size);
  float* out = GrowTo(&out_arena, (routed_rows + shared_rows) * hidden);
  ParallelFor(routed_rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::copy_n(x + gathered_token[r] * hidden, hidden, gathered + r * hidden);
    }
  });

  // Every active expert (and the shared one) in two parallel loops: all gate/up projections,
  // then all down projections.
  std::vector<LinearJob> gate_up, down;
  // gate_at: the job's first element of the gate/up arenas; its outputs are rows row0.. of out.
  auto add = [&](const FfnWeights& f, const float* xs, int64_t gate_at, int64_t row0, int64_t m) {
    gate_up.push_back({xs, m, &f.gate, nullptr, gate + gate_at});
    gate_up.push_back({xs, m, &f.up, nullptr, up + gate_at});
    down.push_back({gate + gate_at, m, &f.down, nullptr, out + row0 * hidden});
  };
  for (int64_t e = 0; e < p.n_experts; ++e) {
    if (count[e] > 0 && held(e)) {
      add(w.experts[e], gathered + first[e] * hidden, first[e] * width, first[e], count[e]);
    }
  }
  if (w.has_shared()) add(w.shared, x, routed_rows * width, routed_rows, tokens);
  timer.emplace(OpFamily::kExpertGemm);
  LinearMany(gate_up, math);
  timer.emplace(OpFamily::kMoeShuffle);
  SiluMul(gate, up, gate_size);
  timer.emplace(OpFamily::kExpertGemm);
  LinearMany(down, math);
  timer.emplace(OpFamily::kMoeShuffle);

  // y = sum over the token's experts in ascending expert order of w * out, from +0, then +
  // shared: per token, an order that does not depend on the other tokens. Tokens in parallel.
  ParallelFor(tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<int32_t, int64_t>> order(p.top_k);  // (expert, choice)
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t k = 0; k < p.top_k; ++k) order[k] = {chosen[t * p.top_k + k], k};
      std::sort(order.begin(), order.end());
      float* yr = y + t * hidden;
      std::fill_n(yr, hidden, 0.f);
      for (const auto& [e, k] : order) {
        const int64_t row = pair_row[t * p.top_k + k];
        if (row < 0) continue;  // another rank's expert
        const float* er = out + row * hidden;
        const float wi = chosen_weight[t * p.top_k + k];
        for (int64_t d = 0; d < hidden; ++d) yr[d] += er[d] * wi;
      }
      if (w.has_shared()) {
        const float* sr = out + (routed_rows + t) * hidden;
        for (int64_t d = 0; d < hidden; ++d) yr[d] += sr[d];
      }
    }
  });
}

}  // namespace glmserve
