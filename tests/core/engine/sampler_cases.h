// The sampler's hard cases, shared by the host equivalence test
// (tests/core/engine/sampler_equivalence_test.cc) and the device sampler's test
// (tests/core/cuda/sampling_cuda_test.cc): rows built to hit the shortcuts' edges (exact ties,
// NaN and infinities, flat rows), settings that cover every path (greedy, top-k near the
// vocabulary size, min-p, top-p, tiny and infinite temperatures, penalties both ways), and a
// history with repeats and out-of-range ids.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/request/sampling_params.h"

namespace glmserve::sampler_cases {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

struct Row {
  std::string name;
  std::vector<float> logits;
};

// Language-model-like: a Gaussian bulk with a few dozen strong tokens.
inline std::vector<float> ModelLike(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(-2.0f, 2.5f);
  std::vector<float> row(vocab);
  for (float& x : row) x = bulk(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  for (int i = 0; i < 30; ++i) row[id(rng)] = 8.0f + static_cast<float>(i % 7);
  return row;
}

inline std::vector<Row> Rows(int vocab) {
  std::vector<Row> rows;
  rows.push_back({"model-like", ModelLike(vocab, 3)});
  // Quantised to a quarter: thousands of exact ties at every level, so top-k boundaries,
  // argmax and the canonical order all break ties by id.
  std::vector<float> ties = ModelLike(vocab, 4);
  for (float& x : ties) x = std::round(x * 4.0f) / 4.0f;
  rows.push_back({"ties", ties});
  // NaN, +-inf and huge values sprinkled in.
  std::vector<float> odd = ModelLike(vocab, 5);
  for (int i = 0; i < vocab; i += 97) odd[i] = kNan;
  for (int i = 13; i < vocab; i += 389) odd[i] = -kInf;
  odd[vocab / 3] = 3e38f;
  odd[vocab / 2] = 3e38f;
  odd[std::max(0, vocab - 2)] = -3e38f;
  rows.push_back({"nan-inf-huge", odd});
  std::vector<float> plus_inf = ModelLike(vocab, 6);
  plus_inf[vocab / 5] = kInf;
  plus_inf[vocab / 4] = kInf;
  rows.push_back({"plus-inf", plus_inf});
  rows.push_back({"all -inf", std::vector<float>(vocab, -kInf)});
  std::vector<float> nans(vocab, kNan);
  nans[vocab - 1] = -1.0f;
  rows.push_back({"all nan but last", nans});
  // A flat row: every weight 1, min-p keeps everything, walks go deep.
  rows.push_back({"flat", std::vector<float>(vocab, 0.5f)});
  return rows;
}

inline std::vector<SamplingParams> Settings(int vocab) {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int32_t k, float top_p, float min_p, float penalty) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = penalty;
    p.seed = 1234 + out.size();
    out.push_back(p);
  };
  for (float penalty : {1.0f, 1.3f, 0.5f}) {
    add(0.0f, 0, 1.0f, 0.0f, penalty);  // greedy
    add(1.0f, 0, 1.0f, 0.0f, penalty);
    add(0.7f, 50, 1.0f, 0.0f, penalty);
    add(0.7f, 0, 0.9f, 0.0f, penalty);
    add(0.8f, 0, 1.0f, 0.05f, penalty);
    add(0.7f, 40, 0.95f, 0.02f, penalty);
  }
  for (int32_t k : {1, 2, 7, 1000, 1025, vocab - 1, vocab, vocab + 1}) {
    add(1.0f, k, 1.0f, 0.0f, 1.1f);
  }
  for (float min_p : {1e-6f, 0.001f, 0.5f, 0.999f}) add(1.5f, 0, 1.0f, min_p, 1.0f);
  add(1e-6f, 0, 1.0f, 0.01f, 1.0f);
  add(1e-6f, 20, 1.0f, 0.0f, 1.2f);
  add(std::numeric_limits<float>::denorm_min(), 5, 0.5f, 0.0f, 1.0f);
  add(50.0f, 0, 0.3f, 0.0f, 1.0f);
  add(kInf, 10, 1.0f, 0.0f, 1.0f);  // unvalidated: scaling ties every finite logit
  add(kNan, 10, 1.0f, 0.0f, 1.0f);  // unvalidated: greedy
  return out;
}

// History: repeats, out-of-range ids, and ids among the row's strongest tokens.
inline std::vector<int32_t> History(const std::vector<float>& row) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  std::vector<int32_t> h = {-5, vocab, vocab + 100, 0, 0, 1, vocab - 1, vocab / 2, vocab / 3};
  for (int32_t i = 0; i < vocab && h.size() < 40; ++i) {
    if (row[i] >= 8.0f) h.push_back(i);
  }
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  for (int i = 0; i < 150; ++i) h.push_back(id(rng));
  return h;
}

}  // namespace glmserve::sampler_cases
