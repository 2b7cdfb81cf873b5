// The sampler as it was before the fast paths (commit 9d47240, core/engine/sampler.cc), unchanged
// but for its name and namespace: the reference that the fast sampler must reproduce token for
// token (core_engine_sampler_equivalence_test), and the "before" column of bench/sampler_bench.
// Not part of the server.
#include "tests/core/engine/sampler_legacy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <vector>

// Processing order for temperature > 0 (all arithmetic in float64):
//   1. NaN logits are treated as -inf (a NaN would break every ordering below).
//   2. Repetition penalty on each distinct in-range history id.
//   3. Divide by the temperature.
//   4. Top-k on the scaled logits: the k largest, ties broken by lower id.
//   5. Probabilities over the kept tokens, exp(x - max), with their sum Z.
//   6. Top-p and min-p, both judged against the distribution from step 5 (so they commute and
//      neither renormalises before the other). Both keep a prefix of the canonical order
//      (descending probability, ties by lower id), so the kept set is the shorter prefix; the
//      most likely token is always kept.
//   7. Draw u in [0, 1) from (seed, token_index) alone and walk the kept prefix in canonical
//      order until the running sum exceeds u times the kept mass.
// Every sum is taken in an order fixed by the inputs (id order, or CanonicalWalk's bin by bin
// order), never in the order a selection algorithm happens to leave elements, so the result
// does not depend on the standard library's nth_element or heap either. No expression here
// has the a * b + c shape that GCC fuses into an FMA by default where the ISA has one, so
// results do not depend on -ffp-contract or the target; keep it that way.

namespace glmserve::legacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// top_p arrives as a float and the probabilities come from float logits, so each carries
// about 1e-7 relative error. A nucleus that falls short of top_p by less than this still
// counts as reaching it; otherwise top_p = 0.8 over probabilities 0.5 and 0.3 would keep a
// third token or not depending on the last bit of exp.
constexpr double kTopPSlack = 1e-6;

// Up to this k, top-k keeps a heap of the best k in one pass over the vocabulary; above it,
// nth_element is cheaper than the heap's log k work per replacement.
constexpr size_t kTopKHeapLimit = 1024;

// The standard splitmix64 output function (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a bijection with full avalanche, so consecutive
// indices give independent-looking outputs without any generator state.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits, a pure function of (seed, token_index): a request's
// stream never depends on batching, preemption or how many tokens were drawn before.
double Uniform(uint64_t seed, uint64_t token_index) {
  return static_cast<double>(SplitMix64(seed ^ SplitMix64(token_index)) >> 11) * 0x1.0p-53;
}

double NanToNegInf(double x) { return std::isnan(x) ? -kInf : x; }

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

// The CTRL penalty: shrink positive logits, push non-positive ones further down, so a
// penalty > 1 always lowers the token's probability.
double Penalise(double x, double penalty) {
  return NanToNegInf(x > 0.0 ? x / penalty : x * penalty);
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
  double weight;  // unnormalised probability, in [0, 1]
  int32_t id;
};

// Canonical order: more likely first, ties by lower id. A strict total order (weights hold no
// NaN and ids are distinct), so a sorted range is unique whatever algorithm sorted it.
bool CanonicallyBefore(const Candidate& a, const Candidate& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

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

// A position in the canonical order: the token's weight bin and its rank within the bin.
struct Position {
  int bin = -1;
  size_t rank = 0;
};

// The candidates grouped by weight into narrow bins (1/8 octave: the exponent and top three
// mantissa bits of the double, which order non-negative doubles like their values), so that
// walking the canonical order needs only bin totals plus a sort of the one bin the walk ends
// in, rather than a sort of the vocabulary.
//
// Running sums add whole bins' totals (each summed in id order) and then, inside the bin where
// the walk ends, single weights in canonical order. Which token a target picks therefore
// depends on the inputs only, and differs from an exact canonical walk only by rounding.
class CanonicalWalk {
 public:
  // `candidates` (weights in [0, 1]) must outlive this.
  explicit CanonicalWalk(const std::vector<Candidate>& candidates)
      : candidates_(candidates), count_(kBins, 0), sum_(kBins, 0.0) {
    for (const Candidate& c : candidates) {
      const int bin = Bin(c.weight);
      ++count_[bin];
      sum_[bin] += c.weight;
    }
    for (int bin = 0; bin < kBins; ++bin) {
      if (count_[bin] > 0) {
        last_ = {bin, count_[bin] - 1};
        break;
      }
    }
  }

  // The last candidate in canonical order.
  Position last() const { return last_; }

  // The sum of all weights, bin totals added from the heaviest bin down as Walk adds them.
  double total() const {
    double sum = 0.0;
    for (int bin = kBins - 1; bin >= 0; --bin) sum += sum_[bin];
    return sum;
  }

  int32_t id(Position p) { return Members(p.bin)[p.rank].id; }

  struct Stop {
    Position position;
    double cumulative;  // running sum up to and including the token at `position`
  };

  // Walks the candidates up to and including `end` in canonical order and stops at the first
  // token whose running sum exceeds `target` (reaches it, if `inclusive`); at `end` if none.
  Stop Walk(double target, bool inclusive, Position end) {
    auto reached = [&](double cumulative) {
      return inclusive ? cumulative >= target : cumulative > target;
    };
    double cumulative = 0.0;
    for (int bin = kBins - 1; bin >= end.bin; --bin) {
      if (count_[bin] == 0) continue;
      // A bin the walk may leave whole: below its total, the target is not in it.
      const bool whole = bin > end.bin || end.rank + 1 == count_[bin];
      if (whole && !reached(cumulative + sum_[bin])) {
        cumulative += sum_[bin];
        continue;
      }
      const std::vector<Candidate>& members = Members(bin);
      const size_t n = whole ? members.size() : end.rank + 1;
      for (size_t rank = 0; rank < n; ++rank) {
        cumulative += members[rank].weight;
        if (reached(cumulative)) return {{bin, rank}, cumulative};
      }
      // The bin's total said the target falls inside it, but adding in canonical rather than
      // id order rounded short: its last token is the crossing.
      return {{bin, n - 1}, cumulative};
    }
    return {end, cumulative};
  }

 private:
  // 2^15 covers every non-negative double's top 15 bits; weights <= 1 use at most 8185.
  static constexpr int kBins = 8185;

  static int Bin(double weight) { return static_cast<int>(std::bit_cast<uint64_t>(weight) >> 49); }

  // The bin's candidates in canonical order, collected on demand (a walk touches at most a
  // couple of bins).
  const std::vector<Candidate>& Members(int bin) {
    if (bin != members_bin_) {
      members_.clear();
      for (const Candidate& c : candidates_) {
        if (Bin(c.weight) == bin) members_.push_back(c);
      }
      std::sort(members_.begin(), members_.end(), CanonicallyBefore);
      members_bin_ = bin;
    }
    return members_;
  }

  const std::vector<Candidate>& candidates_;
  std::vector<size_t> count_;
  std::vector<double> sum_;
  Position last_;
  int members_bin_ = -1;
  std::vector<Candidate> members_;
};

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

  std::vector<Candidate> candidates;
  double total = 0.0;  // >= 1: the most likely token has weight 1
  auto add = [&](int32_t id) {
    const double w = Weight(z[id], max_logit);
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

  // Weights are relative to the most likely token's weight of 1, so min-p's
  // "prob < min_p * max prob" is "weight < min_p"; the most likely token always survives.
  if (params.min_p > 0.0f) {
    const double min_weight = params.min_p;
    std::erase_if(candidates, [&](const Candidate& c) { return c.weight < min_weight; });
  }

  CanonicalWalk walk(candidates);
  Position end = walk.last();
  double kept_mass = walk.total();
  if (params.top_p < 1.0f) {
    // Against `total`, the mass before min-p: both filters judge the same distribution.
    const double nucleus = (static_cast<double>(params.top_p) - kTopPSlack) * total;
    const CanonicalWalk::Stop stop = walk.Walk(nucleus, /*inclusive=*/true, end);
    end = stop.position;
    kept_mass = stop.cumulative;
  }
  return walk.id(walk.Walk(u * kept_mass, /*inclusive=*/false, end).position);
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
