// The sampler computed the plain way: every token's weight, one sort of the whole row into the
// canonical order, running sums along it. It began as the sampler before the fast paths
// (commit 9d47240, core/engine/sampler.cc); since the weights became exact integers
// (core/model/sample_math.h) it computes them as the fast sampler does and keeps the plain
// walk. The reference that the fast sampler and the device sampler must reproduce token for
// token (core_engine_sampler_equivalence_test, cuda_emu_sampling_cuda_test), and the "before"
// column of bench/sampler_bench. Not part of the server.
#include "tests/core/engine/sampler_legacy.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <vector>

#include "core/model/sample_math.h"

// Processing order for temperature > 0 (the logits in float64, the weights in integers):
//   1. NaN logits are treated as -inf (a NaN would break every ordering below).
//   2. Repetition penalty on each distinct in-range history id.
//   3. Divide by the temperature.
//   4. Top-k on the scaled logits: the k largest, ties broken by lower id.
//   5. Integer weights over the kept tokens, floor(exp(x - max) 2^S), with their sum Z.
//   6. Top-p and min-p, both judged against the distribution from step 5 (so they commute and
//      neither renormalises before the other). Both keep a prefix of the canonical order
//      (descending probability, ties by lower id), so the kept set is the shorter prefix; the
//      most likely token is always kept.
//   7. Draw u in [0, 1) from (seed, token_index) alone and walk the kept prefix in canonical
//      order until the running sum exceeds floor(u times the kept mass).

namespace glmserve::legacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Up to this k, top-k keeps a heap of the best k in one pass over the vocabulary; above it,
// nth_element is cheaper than the heap's log k work per replacement.
constexpr size_t kTopKHeapLimit = 1024;

using samplemath::NanToNegInf;
using samplemath::Penalise;
using samplemath::Uniform;

// Unnormalised probability of a logit x given the maximum m of its set: exp(x - m), with the
// limits taken when m is infinite (x - m would be NaN). With m = +inf the +inf logits share
// all the mass; with m = -inf every logit is -inf and they are equally likely.
double Weight(double x, double m) {
  if (m == kInf) return x == kInf ? 1.0 : 0.0;
  if (m == -kInf) return 1.0;
  return std::exp(x - m);
}

// log(Weight(x, m)), computed directly so that tiny weights keep their exact log.
double LogWeight(double x, double m) {
  if (m == kInf) return x == kInf ? 0.0 : -kInf;
  if (m == -kInf) return 0.0;
  return x - m;
}

// double -> float; values beyond the float range become +-inf (a plain conversion would be
// undefined behaviour there).
float ToFloat(double x) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (x > kMax) return std::numeric_limits<float>::infinity();
  if (x < -kMax) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(x);
}

// Index of the largest value, ties to the lowest index. `values` holds no NaN.
int32_t ArgMax(const std::vector<double>& values) {
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

struct Candidate {
  uint64_t weight;  // samplemath::IntWeight
  int32_t id;
};

// The ids of the k largest of value(0..n-1) (k < n), ties by lower id, in id order. The set
// is unique, and returning it in id order makes everything downstream independent of how the
// selection algorithm arranged it.
template <typename Value>
std::vector<int32_t> TopIds(size_t n, size_t k, Value value) {
  auto before = [&value](int32_t a, int32_t b) {
    const double va = value(a), vb = value(b);
    return va > vb || (va == vb && a < b);
  };
  const int32_t end = static_cast<int32_t>(n);
  std::vector<int32_t> kept;
  if (k <= kTopKHeapLimit) {
    // One pass with a heap whose top is the worst kept id: most ids lose a single comparison
    // against it.
    kept.reserve(k);
    for (int32_t id = 0; id < end; ++id) {
      if (kept.size() < k) {
        kept.push_back(id);
        std::push_heap(kept.begin(), kept.end(), before);
      } else if (before(id, kept.front())) {
        std::pop_heap(kept.begin(), kept.end(), before);
        kept.back() = id;
        std::push_heap(kept.begin(), kept.end(), before);
      }
    }
    std::sort(kept.begin(), kept.end());
  } else {
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    const auto nth = ids.begin() + static_cast<ptrdiff_t>(k - 1);
    std::nth_element(ids.begin(), nth, ids.end(), before);
    const int32_t last_kept = *nth;
    kept.reserve(k);
    for (int32_t id = 0; id < end; ++id) {
      if (!before(last_kept, id)) kept.push_back(id);
    }
  }
  return kept;
}

// Steps 3-7 of the file comment on the penalised logits `z` (overwritten).
int32_t SampleFromLogits(std::vector<double>& z, const SamplingParams& params, double u) {
  const size_t vocab = z.size();
  const double temperature = params.temperature;
  // Dividing in float64 cannot overflow: |float| / smallest positive float < 1e84.
  double max_logit = -kInf;  // the top-k below always keeps it
  for (double& x : z) {
    x = NanToNegInf(x / temperature);
    max_logit = std::max(max_logit, x);
  }

  const int shift = samplemath::WeightShift(static_cast<int64_t>(vocab));
  std::vector<Candidate> candidates;
  uint64_t total = 0;  // >= 2^S: the most likely token's weight
  auto add = [&](int32_t id) {
    const uint64_t w = samplemath::IntWeight(z[id], max_logit, shift);
    candidates.push_back({w, id});
    total += w;
  };
  const size_t k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : vocab;
  if (k < vocab) {
    candidates.reserve(k);
    for (int32_t id : TopIds(vocab, k, [&z](int32_t i) { return z[i]; })) add(id);
  } else {
    candidates.reserve(vocab);
    for (size_t i = 0; i < vocab; ++i) add(static_cast<int32_t>(i));
  }

  // Weights are relative to the most likely token's weight of 2^S, so min-p's
  // "prob < min_p * max prob" is "weight < MinPWeight"; the most likely token always survives.
  if (params.min_p > 0.0f && params.min_p < 1.0f) {
    const uint64_t min_weight = samplemath::MinPWeight(params.min_p, shift);
    std::erase_if(candidates, [&](const Candidate& c) { return c.weight < min_weight; });
  }

  // The canonical order: more likely first, ties by lower id.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  });
  size_t kept = candidates.size();
  uint64_t kept_mass = 0;
  for (const Candidate& c : candidates) kept_mass += c.weight;
  if (params.top_p < 1.0f) {
    // Against `total`, the mass before min-p: both filters judge the same distribution.
    const uint64_t nucleus = samplemath::NucleusTarget(params.top_p, total);
    uint64_t running = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      running += candidates[i].weight;
      if (running >= nucleus) {
        kept = i + 1;
        break;
      }
    }
    kept_mass = running;
  }
  const uint64_t target = samplemath::DrawTarget(u, kept_mass);
  uint64_t running = 0;
  for (size_t i = 0; i < kept; ++i) {
    running += candidates[i].weight;
    if (running > target) return candidates[i].id;
  }
  return candidates[kept - 1].id;
}

}  // namespace

SampledToken LegacySampleToken(absl::Span<const float> logits, const SamplingParams& params,
                               absl::Span<const int32_t> history, uint64_t token_index,
                               int32_t top_logprobs) {
  SampledToken result;
  const size_t vocab = logits.size();
  if (vocab == 0) return result;  // nothing to choose from; callers never pass this

  auto raw = [&logits](size_t i) { return NanToNegInf(logits[i]); };

  std::vector<double> z(vocab);
  double raw_max = -kInf;
  for (size_t i = 0; i < vocab; ++i) {
    z[i] = raw(i);
    raw_max = std::max(raw_max, z[i]);
  }
  const double penalty = params.repetition_penalty;
  if (penalty != 1.0) {
    // Recomputed from the raw logit on every occurrence, so repeats apply the penalty once.
    for (int32_t id : history) {
      if (id >= 0 && static_cast<size_t>(id) < vocab) z[id] = Penalise(raw(id), penalty);
    }
  }

  // Written so that a NaN temperature (unvalidated params) falls back to greedy.
  result.token = params.temperature > 0.0f
                     ? SampleFromLogits(z, params, Uniform(params.seed, token_index))
                     : ArgMax(z);

  // Log-softmax of the raw logits: (x - max) - log(sum exp(x - max)), summed in id order.
  double sum = 0.0;
  for (size_t i = 0; i < vocab; ++i) sum += Weight(raw(i), raw_max);
  const double log_sum = std::log(sum);
  auto logprob = [&](size_t i) { return ToFloat(LogWeight(raw(i), raw_max) - log_sum); };
  result.logprob = logprob(static_cast<size_t>(result.token));

  if (top_logprobs > 0) {
    const size_t n = std::min(static_cast<size_t>(top_logprobs), vocab);
    std::vector<int32_t> top(n);
    if (n < vocab) {
      top = TopIds(vocab, n, raw);
    } else {
      std::iota(top.begin(), top.end(), 0);
    }
    std::sort(top.begin(), top.end(),
              [&](int32_t a, int32_t b) { return raw(a) > raw(b) || (raw(a) == raw(b) && a < b); });
    result.top.reserve(top.size());
    for (int32_t id : top) result.top.push_back({id, logprob(id)});
  }
  return result;
}

}  // namespace glmserve::legacy
