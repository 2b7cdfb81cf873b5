// Per-row arithmetic written once for both backends: the router's selection, the SwiGLU
// activation, RoPE angles and rotation, and the RMSNorm scale. The CPU ops (core/cpu/ops/*.cc)
// call these functions, and nvcc compiles the same ones as __host__ __device__ for the CUDA
// kernels, so the two backends cannot drift apart (tests/core/model/row_math_test.cc checks
// them against straightforward references).
//
// No standard-library containers or absl here: this header is included by .cu files.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GLM_HD __host__ __device__
#else
#define GLM_HD
#endif

namespace glmserve::rowmath {

// Bounds of the fixed-size per-thread arrays the router uses on the GPU.
inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxGroups = 64;
inline constexpr int kMaxTopK = 32;

struct RouterRowParams {
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// The index of the largest values[i] over i in [0, n) not yet taken (taken[i / 32] bit
// i % 32); ties go to the lower index, as core/cpu/ops/moe.cc's TopK. With only -inf (or NaN)
// left it still returns the lowest free index, never -1, while one is free.
GLM_HD inline int ArgMaxFree(const float* values, int n, const uint32_t* taken) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if ((taken[i >> 5] >> (i & 31)) & 1u) continue;
    if (best < 0 || values[i] > values[best]) best = i;
  }
  return best;
}

// One token's routing, exactly RouteTokens (core/cpu/ops/moe.h) for one row: s = sigmoid(l);
// c = s + bias; groups outside the topk_group best (by the sum of their two largest c) are
// masked to -inf; the top_k experts by c, best first (ties: lower index); weights from s,
// normalised by (sum + 1e-20) if norm_topk_prob, times routed_scaling_factor.
// s, c: scratch of n_experts floats each.
GLM_HD inline void RouteRow(const float* logits, const float* bias, const RouterRowParams& p,
                            float* s, float* c, int32_t* experts, float* weights) {
  const int n = p.n_experts;
  for (int e = 0; e < n; ++e) {
    s[e] = 1.0f / (1.0f + expf(-logits[e]));
    c[e] = s[e] + bias[e];
  }
  uint32_t taken[kMaxExperts / 32];
  for (int i = 0; i < kMaxExperts / 32; ++i) taken[i] = 0;
  if (p.n_group > 1) {
    const int group_size = n / p.n_group;
    float group_score[kMaxGroups];
    for (int g = 0; g < p.n_group; ++g) {
      uint32_t local[kMaxExperts / 32];
      for (int i = 0; i < kMaxExperts / 32; ++i) local[i] = 0;
      const float* cg = c + g * group_size;
      const int b0 = ArgMaxFree(cg, group_size, local);
      local[b0 >> 5] |= 1u << (b0 & 31);
      const int b1 = ArgMaxFree(cg, group_size, local);
      group_score[g] = cg[b0] + cg[b1];
    }
    uint32_t kept[kMaxGroups / 32 + 1] = {0, 0, 0};
    for (int i = 0; i < p.topk_group; ++i) {
      const int g = ArgMaxFree(group_score, p.n_group, kept);
      kept[g >> 5] |= 1u << (g & 31);
    }
    for (int e = 0; e < n; ++e) {
      const int g = e / group_size;
      if (!((kept[g >> 5] >> (g & 31)) & 1u)) c[e] = -INFINITY;
    }
  }
  float sum = 0.f;
  for (int k = 0; k < p.top_k; ++k) {
    const int e = ArgMaxFree(c, n, taken);
    taken[e >> 5] |= 1u << (e & 31);
    experts[k] = e;
    weights[k] = s[e];
    sum += weights[k];
  }
  const float denom = p.norm_topk_prob ? sum + 1e-20f : 1.0f;
  for (int k = 0; k < p.top_k; ++k) {
    weights[k] = (p.norm_topk_prob ? weights[k] / denom : weights[k]) * p.routed_scaling_factor;
  }
}

// silu(g) * u, the expression of core/cpu/ops/ffn.cc's SiluMul. Above g = 20, expf(-g) < 2^-28
// and 1 + expf(-g) rounds to exactly 1, so g * u is the same bits without the exp: the shortcut
// matters because expf(-g) for g past ~87 is subnormal, which costs a CPU ~100x (measured: 2.3 s
// of a 2,048-token prefill on random weights, docs/performance.md).
GLM_HD inline float SiluMul(float g, float u) {
  return g > 20.0f ? g * u : g / (1.0f + expf(-g)) * u;
}

// RoPE's cos and sin for one channel pair: the angle is the fp32 product position * inv_freq
// (as the reference), evaluated in double and rounded once, as core/cpu/ops/rope.cc.
GLM_HD inline void RopeCosSin(int32_t position, float inv_freq, float* cos_out, float* sin_out) {
  const float angle = static_cast<float>(position) * inv_freq;
  *cos_out = static_cast<float>(cos(static_cast<double>(angle)));
  *sin_out = static_cast<float>(sin(static_cast<double>(angle)));
}

// The NeoX rotate_half update of the pair (x[i], x[i + r/2]).
GLM_HD inline void RotatePair(float a, float b, float cos_v, float sin_v, float* a_out,
                              float* b_out) {
  *a_out = a * cos_v - b * sin_v;
  *b_out = b * cos_v + a * sin_v;
}

// RMSNorm's scale 1 / sqrt(mean(x^2) + eps) from the fp32 sum of squares of a row.
GLM_HD inline float RmsInvScale(float sum_squares, int64_t width, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(width) + eps);
}

}  // namespace glmserve::rowmath
