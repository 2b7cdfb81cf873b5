#include "core/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/engine/sampler_scan.h"
#include "core/model/sample_math.h"

// Processing order for temperature > 0 (the logits' arithmetic in float64, the weights' in
// integers: core/model/sample_math.h):
//   1. NaN logits are treated as -inf (a NaN would break every ordering below).
//   2. Repetition penalty on each distinct in-range history id.
//   3. Divide by the temperature.
//   4. Top-k on the scaled logits: the k largest, ties broken by lower id.
//   5. Integer weights over the kept tokens, W = floor(exp(x - max) 2^S), with their sum Z.
//   6. Top-p and min-p, both judged against the distribution from step 5 (so they commute and
//      neither renormalises before the other). Both keep a prefix of the canonical order
//      (descending probability, ties by lower id), so the kept set is the shorter prefix; the
//      most likely token is always kept.
//   7. Draw u in [0, 1) from (seed, token_index) alone and walk the kept prefix in canonical
//      order until the running sum exceeds floor(u times the kept mass).
// Integer sums are exact, so no result depends on the order of any addition: the device
// sampler (core/cuda/row_sample.cu) adds a row's weights in whatever order its threads meet
// and still chooses this file's token. No expression here has the a * b + c shape that GCC
// fuses into an FMA by default where the ISA has one, so results do not depend on
// -ffp-contract or the target; keep it that way.
//
// Cost: only what the request needs is computed, and every shortcut below gives exactly the
// token (and logprobs) of the plain full-row computation (tests/core/engine/sampler_legacy.cc, kept
// as the reference that core_engine_sampler_equivalence_test compares against):
//   - Greedy is an argmax over the float row (float compares are exact, and the penalised
//     ids are compared in float64 as before); no exp at all.
//   - Top-k selects on the raw floats: x -> x / T is strictly increasing in float64 for
//     finite T (distinct floats differ by 2^-24 relative, far above float64's rounding, and
//     the quotient neither overflows nor goes subnormal), so the k largest floats are the k
//     largest scaled logits. Penalised ids join the k unpenalised winners and the exact top-k
//     is taken over that union; only those k get an exp.
//   - Min-p without top-p skips every 64-id block whose maximum is already below min_p (a
//     float64 bound with margin), so only plausible tokens get an exp.
//   - The chosen token's logprob and the top logprobs, a full log-sum-exp and a top-n scan,
//     are computed only when requested.
// Plain temperature and top-p without top-k still need every token's weight: Z (step 5) is
// a sum over the whole row, and it decides where the nucleus ends.
// Why the weights are exact: a request's seeded stream is a contract (same seed, same tokens,
// across versions, machines and backends). Float weights and sums would move a draw whenever
// u lands within rounding of a cumulative boundary, and make the answer depend on the order
// of the additions. The float work is the scanning (argmax, top-k, block skipping), where
// float compares are exact.

namespace glmserve {
namespace {

using sampler_internal::ArgMaxRange;
using sampler_internal::TopKFloat;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Min-p skips a block when its best log-weight is below log(min_p) by more than this: far
// above the error of exp and log (~1e-16), so no token with weight >= min_p is skipped.
constexpr double kMinPLogMargin = 1e-6;

constexpr int32_t kBlock = 64;

using samplemath::IntWeight;
using samplemath::NanToNegInf;
using samplemath::Penalise;
using samplemath::Uniform;

// exp(x - m) in float64 for the log-softmax (logprobs, not the draw), with the limits taken
// when m is infinite, as IntWeight takes them.
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

struct Candidate {
  uint64_t weight;  // IntWeight: in [0, 2^S]
  int32_t id;
};

// Canonical order: more likely first, ties by lower id. A strict total order (weights hold no
// NaN and ids are distinct), so a sorted range is unique whatever algorithm sorted it.
bool CanonicallyBefore(const Candidate& a, const Candidate& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

// Per-thread buffers, so that a call allocates nothing once warm (a 151552-wide row would
// otherwise cost megabytes of fresh, page-faulting memory per token).
struct Scratch {
  std::vector<uint64_t> history_bits;  // one bit per id; all clear between calls
  std::vector<int32_t> penalised_ids;  // distinct in-range history ids, ascending
  std::vector<double> penalised;       // their penalised logits
  std::vector<std::pair<float, int32_t>> heap;
  std::vector<std::pair<double, int32_t>> pool;  // (scaled logit, id)
  std::vector<double> z;                         // scaled logits by id (whole-row path)
  std::vector<uint64_t> w;                       // their weights
  std::vector<Candidate> candidates;
  std::vector<uint16_t> bins;  // CanonicalWalk: each candidate's bin
  std::vector<size_t> bin_count;
  std::vector<uint64_t> bin_sum;
  std::vector<Candidate> members;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The logits row with the repetition penalty: raw floats (NaN read as -inf) everywhere but
// at the penalised ids, whose float64 values are kept aside.
class PenalisedRow {
 public:
  PenalisedRow(absl::Span<const float> logits, double penalty, absl::Span<const int32_t> history,
               Scratch& s)
      : raw_(logits.data()), size_(static_cast<int32_t>(logits.size())), s_(s) {
    s.penalised_ids.clear();
    s.penalised.clear();
    if (penalty == 1.0) return;
    // Distinct ids in ascending order through a bitmap: linear in the history and the row,
    // where sorting a long prompt's history would not be.
    const size_t words = (logits.size() + 63) / 64;
    if (s.history_bits.size() != words) s.history_bits.assign(words, 0);
    for (int32_t id : history) {
      if (id >= 0 && id < size_) s.history_bits[id >> 6] |= uint64_t{1} << (id & 63);
    }
    for (size_t w = 0; w < words; ++w) {
      for (uint64_t bits = s.history_bits[w]; bits != 0; bits &= bits - 1) {
        const int32_t id = static_cast<int32_t>(w * 64) + std::countr_zero(bits);
        s.penalised_ids.push_back(id);
        // Recomputed from the raw logit, so repeats apply the penalty once.
        s.penalised.push_back(Penalise(raw(id), penalty));
      }
      s.history_bits[w] = 0;
    }
  }

  int32_t size() const { return size_; }
  const float* data() const { return raw_; }
  double raw(int32_t id) const { return NanToNegInf(raw_[id]); }
  const std::vector<int32_t>& penalised_ids() const { return s_.penalised_ids; }
  const std::vector<double>& penalised() const { return s_.penalised; }

  // In ascending id order: range(begin, end) for each maximal run of unpenalised ids and
  // point(j) for the j-th penalised id.
  template <typename Range, typename Point>
  void ForEach(Range range, Point point) const {
    int32_t next = 0;
    for (size_t j = 0; j < s_.penalised_ids.size(); ++j) {
      const int32_t id = s_.penalised_ids[j];
      if (next < id) range(next, id);
      point(j);
      next = id + 1;
    }
    if (next < size_) range(next, size_);
  }

 private:
  const float* raw_;
  int32_t size_;
  Scratch& s_;
};

// Index of the largest penalised value, ties to the lowest index.
int32_t ArgMax(const PenalisedRow& row) {
  double best = 0.0;
  int32_t best_id = -1;
  auto consider = [&](double value, int32_t id) {
    if (best_id < 0 || value > best) {
      best = value;
      best_id = id;
    }
  };
  row.ForEach(
      [&](int32_t begin, int32_t end) {
        const sampler_internal::FloatBest b = ArgMaxRange(row.data(), begin, end);
        consider(b.value, b.id);
      },
      [&](size_t j) { consider(row.penalised()[j], row.penalised_ids()[j]); });
  return best_id;
}

// A position in the canonical order: the token's weight bin and its rank within the bin.
struct Position {
  int bin = -1;
  size_t rank = 0;
};

// The candidates grouped by weight into narrow bins (1/8 octave: the bit length and the three
// bits below the leading one, which order integers like their values), so that walking the
// canonical order needs only bin totals plus a sort of the one bin the walk ends in, rather
// than a sort of the vocabulary. The sums are exact, so the walk stops where an exact walk
// in canonical order stops. Only the occupied bin range [lo, hi] is stored.
class CanonicalWalk {
 public:
  // `candidates` (ascending ids, not empty) must outlive this.
  CanonicalWalk(const std::vector<Candidate>& candidates, Scratch& s)
      : candidates_(candidates), s_(s) {
    s.bins.resize(candidates.size());
    lo_ = kBins;
    hi_ = -1;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const int bin = Bin(candidates[i].weight);
      s.bins[i] = static_cast<uint16_t>(bin);
      lo_ = std::min(lo_, bin);
      hi_ = std::max(hi_, bin);
    }
    s.bin_count.assign(hi_ - lo_ + 1, 0);
    s.bin_sum.assign(hi_ - lo_ + 1, 0);
    for (size_t i = 0; i < candidates.size(); ++i) {
      ++s.bin_count[s.bins[i] - lo_];
      s.bin_sum[s.bins[i] - lo_] += candidates[i].weight;
    }
    last_ = {lo_, s.bin_count[0] - 1};
  }

  // The last candidate in canonical order.
  Position last() const { return last_; }

  // The sum of all weights (below 2^63: WeightShift).
  uint64_t total() const {
    uint64_t sum = 0;
    for (int bin = hi_; bin >= lo_; --bin) sum += sum_(bin);
    return sum;
  }

  int32_t id(Position p) { return Members(p.bin)[p.rank].id; }

  struct Stop {
    Position position;
    uint64_t cumulative;  // running sum up to and including the token at `position`
  };

  // Walks the candidates up to and including `end` in canonical order and stops at the first
  // token whose running sum exceeds `target` (reaches it, if `inclusive`); at `end` if none.
  Stop Walk(uint64_t target, bool inclusive, Position end) {
    auto reached = [&](uint64_t cumulative) {
      return inclusive ? cumulative >= target : cumulative > target;
    };
    uint64_t cumulative = 0;
    for (int bin = hi_; bin >= end.bin; --bin) {
      if (count(bin) == 0) continue;
      // A bin the walk may leave whole: below its total, the target is not in it.
      const bool whole = bin > end.bin || end.rank + 1 == count(bin);
      if (whole && !reached(cumulative + sum_(bin))) {
        cumulative += sum_(bin);
        continue;
      }
      const std::vector<Candidate>& members = Members(bin);
      const size_t n = whole ? members.size() : end.rank + 1;
      for (size_t rank = 0; rank < n; ++rank) {
        cumulative += members[rank].weight;
        if (reached(cumulative)) return {{bin, rank}, cumulative};
      }
      return {{bin, n - 1}, cumulative};  // not reached: the sums are exact
    }
    return {end, cumulative};
  }

 private:
  // Bit lengths 0..63, eight bins each.
  static constexpr int kBins = 512;

  static int Bin(uint64_t weight) {
    const int length = std::bit_width(weight);
    const uint64_t below = length >= 4 ? weight >> (length - 4) : weight << (4 - length);
    return length * 8 + static_cast<int>(below & 7);
  }

  size_t count(int bin) const { return s_.bin_count[bin - lo_]; }
  uint64_t sum_(int bin) const { return s_.bin_sum[bin - lo_]; }

  // The bin's candidates in canonical order, collected on demand (a walk touches at most a
  // couple of bins).
  const std::vector<Candidate>& Members(int bin) {
    if (bin != members_bin_) {
      s_.members.clear();
      for (size_t i = 0; i < candidates_.size(); ++i) {
        if (s_.bins[i] == bin) s_.members.push_back(candidates_[i]);
      }
      std::sort(s_.members.begin(), s_.members.end(), CanonicallyBefore);
      members_bin_ = bin;
    }
    return s_.members;
  }

  const std::vector<Candidate>& candidates_;
  Scratch& s_;
  int lo_ = 0, hi_ = 0;
  Position last_;
  int members_bin_ = -1;
};

// The ids of the k largest of the pool's scaled logits (k < pool size), ties by lower id,
// in id order. The set is unique, so how nth_element arranges it does not matter.
void KeepTopK(size_t k, std::vector<std::pair<double, int32_t>>* pool) {
  auto before = [](const std::pair<double, int32_t>& a, const std::pair<double, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::nth_element(pool->begin(), pool->begin() + static_cast<ptrdiff_t>(k - 1), pool->end(),
                   before);
  pool->resize(k);
  std::sort(pool->begin(), pool->end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
}

// Steps 4 and 5 with top-k on and a finite temperature, given `winners`: the k largest
// unpenalised raw logits, ascending ids, raw_of(id) their values. The exact top-k of the
// scaled logits lies among them and the penalised ids (pen_ids ascending, pen_values their
// penalised logits). Fills the candidates (in id order) and returns Z.
template <typename RawOf>
uint64_t PoolCandidates(const std::vector<int32_t>& winners, RawOf raw_of,
                        const std::vector<int32_t>& pen_ids, const std::vector<double>& pen_values,
                        size_t k, double temperature, int shift, Scratch& s) {
  // The union of the unpenalised winners and the penalised ids, in id order.
  std::vector<std::pair<double, int32_t>>& pool = s.pool;
  pool.clear();
  size_t j = 0;
  auto add_penalised = [&] {
    pool.push_back({NanToNegInf(pen_values[j] / temperature), pen_ids[j]});
    ++j;
  };
  for (int32_t id : winners) {
    while (j < pen_ids.size() && pen_ids[j] < id) add_penalised();
    pool.push_back({NanToNegInf(raw_of(id) / temperature), id});
  }
  while (j < pen_ids.size()) add_penalised();
  if (pool.size() > k) KeepTopK(k, &pool);
  double max_logit = -kInf;
  for (const auto& [z, id] : pool) max_logit = std::max(max_logit, z);
  uint64_t total = 0;
  for (const auto& [z, id] : pool) {
    const uint64_t w = IntWeight(z, max_logit, shift);
    s.candidates.push_back({w, id});
    total += w;
  }
  return total;
}

uint64_t TopKCandidates(const PenalisedRow& row, size_t k, double temperature, Scratch& s) {
  TopKFloat top(k, &s.heap);
  row.ForEach([&](int32_t begin, int32_t end) { top.Scan(row.data(), begin, end); }, [](size_t) {});
  return PoolCandidates(
      top.TakeIds(), [&row](int32_t id) { return row.raw(id); }, row.penalised_ids(),
      row.penalised(), k, temperature, samplemath::WeightShift(row.size()), s);
}

// Min-p alone (no top-k or top-p): the candidates with weight >= MinPWeight, in id order,
// skipping blocks whose best weight is below it. Returns false (nothing done) when the maximum is
// infinite, where the block bound does not apply.
bool MinPCandidates(const PenalisedRow& row, double temperature, double min_p, Scratch& s) {
  auto scaled = [temperature](double v) { return NanToNegInf(v / temperature); };
  double max_logit = -kInf;
  row.ForEach(
      [&](int32_t begin, int32_t end) {
        max_logit = std::max(max_logit, scaled(ArgMaxRange(row.data(), begin, end).value));
      },
      [&](size_t j) { max_logit = std::max(max_logit, scaled(row.penalised()[j])); });
  if (!std::isfinite(max_logit)) return false;
  // z -> z - max_logit and x -> x / T are non-decreasing, so a block's largest float bounds
  // every member's log-weight.
  const double skip_below = std::log(min_p) - kMinPLogMargin;
  const int shift = samplemath::WeightShift(row.size());
  const uint64_t min_weight = samplemath::MinPWeight(static_cast<float>(min_p), shift);
  auto keep = [&](double z, int32_t id) {
    const uint64_t w = IntWeight(z, max_logit, shift);
    if (w >= min_weight) s.candidates.push_back({w, id});
  };
  row.ForEach(
      [&](int32_t begin, int32_t end) {
        for (int32_t b = begin; b < end; b += kBlock) {
          const int32_t e = std::min(end, b + kBlock);
          const double best = scaled(ArgMaxRange(row.data(), b, e).value);
          if (best - max_logit < skip_below) continue;
          for (int32_t id = b; id < e; ++id) keep(scaled(row.raw(id)), id);
        }
      },
      [&](size_t j) { keep(scaled(row.penalised()[j]), row.penalised_ids()[j]); });
  return true;
}

// w[i] = IntWeight(z[i], m, shift) for a row. DetExp is fma after fma: a library call each
// where the instruction is not enabled at compile time, inlined (and vectorised, with AVX-512)
// where it is. So the loop is compiled for three targets and picked by what the CPU has;
// every version computes the same bits (fma is correctly rounded everywhere).
inline void WeighRow(const double* z, size_t n, double m, int shift, uint64_t* w) {
  if (!std::isfinite(m)) {
    for (size_t i = 0; i < n; ++i) w[i] = IntWeight(z[i], m, shift);
    return;
  }
  // IntWeight with m finite, as straight-line code: below -700 DetExp is 0, and the clamped
  // value's weight, exp(-700) 2^S < 1, truncates to the same 0.
  const double scale = samplemath::BitsDouble(static_cast<uint64_t>(shift + 1023) << 52);
  for (size_t i = 0; i < n; ++i) {
    const double d = std::max(z[i] - m, -700.0);
    w[i] = static_cast<uint64_t>(samplemath::DetExpCore(d) * scale);
  }
}
__attribute__((flatten, target("avx512f,avx512dq,avx512vl,avx2,fma"))) void RowIntWeightsAvx512(
    const double* z, size_t n, double m, int shift, uint64_t* w) {
  WeighRow(z, n, m, shift, w);
}
__attribute__((flatten, target("avx2,fma"))) void RowIntWeightsFma(const double* z, size_t n,
                                                                   double m, int shift,
                                                                   uint64_t* w) {
  WeighRow(z, n, m, shift, w);
}
void RowIntWeights(const double* z, size_t n, double m, int shift, uint64_t* w) {
  static const int level = __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") ? 2
                           : __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2")   ? 1
                                                                                               : 0;
  if (level == 2) return RowIntWeightsAvx512(z, n, m, shift, w);
  if (level == 1) return RowIntWeightsFma(z, n, m, shift, w);
  WeighRow(z, n, m, shift, w);
}

// Steps 3-5 over the whole row (top-k too when the temperature is infinite, where scaling
// collapses distinct logits and top-k must compare the scaled values).
uint64_t WholeRowCandidates(const PenalisedRow& row, size_t k, double temperature, Scratch& s) {
  const size_t vocab = static_cast<size_t>(row.size());
  std::vector<double>& z = s.z;
  z.resize(vocab);
  // Dividing in float64 cannot overflow: |float| / smallest positive float < 1e84.
  for (size_t i = 0; i < vocab; ++i)
    z[i] = NanToNegInf(row.raw(static_cast<int32_t>(i)) / temperature);
  for (size_t j = 0; j < row.penalised_ids().size(); ++j) {
    z[row.penalised_ids()[j]] = NanToNegInf(row.penalised()[j] / temperature);
  }
  double max_logit = -kInf;  // the top-k below always keeps it
  for (double x : z) max_logit = std::max(max_logit, x);
  const int shift = samplemath::WeightShift(row.size());
  uint64_t total = 0;  // >= 2^S: the most likely token's weight
  auto add = [&](int32_t id) {
    const uint64_t w = IntWeight(z[id], max_logit, shift);
    s.candidates.push_back({w, id});
    total += w;
  };
  if (k < vocab) {
    std::vector<std::pair<double, int32_t>>& pool = s.pool;
    pool.clear();
    for (size_t i = 0; i < vocab; ++i) pool.push_back({z[i], static_cast<int32_t>(i)});
    KeepTopK(k, &pool);
    for (const auto& [value, id] : pool) add(id);
  } else {
    std::vector<uint64_t>& w = s.w;
    w.resize(vocab);
    RowIntWeights(z.data(), vocab, max_logit, shift, w.data());
    // A token of weight 0 is never where a walk stops: leaving it out changes no draw.
    for (size_t i = 0; i < vocab; ++i) {
      if (w[i] != 0) s.candidates.push_back({w[i], static_cast<int32_t>(i)});
      total += w[i];
    }
  }
  return total;
}

// Steps 6 and 7 over s.candidates (weights of step 5, ascending ids) with Z = `total`.
int32_t Draw(const SamplingParams& params, double u, uint64_t total, int shift, Scratch& s) {
  std::vector<Candidate>& candidates = s.candidates;
  const bool top_p = params.top_p < 1.0f;
  // min_p >= 1 (unvalidated) would drop every token: ignored rather than left undefined.
  const bool min_p = params.min_p > 0.0f && params.min_p < 1.0f;
  // Weights are relative to the most likely token's weight of 2^S, so min-p's
  // "prob < min_p * max prob" is "weight < MinPWeight"; the most likely token always survives.
  if (min_p) {
    const uint64_t min_weight = samplemath::MinPWeight(params.min_p, shift);
    std::erase_if(candidates, [&](const Candidate& c) { return c.weight < min_weight; });
  }

  CanonicalWalk walk(candidates, s);
  Position end = walk.last();
  uint64_t kept_mass = walk.total();
  if (top_p) {
    // Against `total`, the mass before min-p: both filters judge the same distribution.
    const CanonicalWalk::Stop stop = walk.Walk(samplemath::NucleusTarget(params.top_p, total),
                                               /*inclusive=*/true, end);
    end = stop.position;
    kept_mass = stop.cumulative;
  }
  return walk.id(
      walk.Walk(samplemath::DrawTarget(u, kept_mass), /*inclusive=*/false, end).position);
}

// Steps 3-7 of the file comment on the penalised row.
int32_t SampleFromLogits(const PenalisedRow& row, const SamplingParams& params, double u,
                         Scratch& s) {
  const size_t vocab = static_cast<size_t>(row.size());
  const double temperature = params.temperature;
  const size_t k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : vocab;
  const bool top_p = params.top_p < 1.0f;
  const bool min_p = params.min_p > 0.0f && params.min_p < 1.0f;

  s.candidates.clear();
  uint64_t total;  // Z of step 5, before min-p; needed by top-p only
  if (k < vocab && std::isfinite(temperature)) {
    total = TopKCandidates(row, k, temperature, s);
  } else if (k >= vocab && min_p && !top_p && MinPCandidates(row, temperature, params.min_p, s)) {
    total = 0;  // unused without top-p; the candidates are min-p's survivors already
  } else {
    total = WholeRowCandidates(row, k, temperature, s);
  }
  return Draw(params, u, total, samplemath::WeightShift(row.size()), s);
}

// The chosen token's logprob and the `top` most likely tokens' (log-softmax of the raw
// logits in float64: (x - max) - log(sum exp(x - max)), summed in id order).
void AddLogprobs(absl::Span<const float> logits, int32_t top, Scratch& s, SampledToken* result) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float* x = logits.data();
  auto raw = [x](int32_t i) { return NanToNegInf(x[i]); };
  const double raw_max = ArgMaxRange(x, 0, vocab).value;
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += Weight(raw(i), raw_max);
  const double log_sum = std::log(sum);
  auto logprob = [&](int32_t i) { return ToFloat(LogWeight(raw(i), raw_max) - log_sum); };
  result->logprob = logprob(result->token);
  if (top <= 0) return;
  std::vector<int32_t> ids;
  if (top < vocab) {
    TopKFloat best(static_cast<size_t>(top), &s.heap);
    best.Scan(x, 0, vocab);
    ids = best.TakeIds();
  } else {
    ids.resize(vocab);
    std::iota(ids.begin(), ids.end(), 0);
  }
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return raw(a) > raw(b) || (raw(a) == raw(b) && a < b); });
  result->top.reserve(ids.size());
  for (int32_t id : ids) result->top.push_back({id, logprob(id)});
}

}  // namespace

SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         absl::Span<const int32_t> history, uint64_t token_index,
                         LogprobRequest want) {
  SampledToken result;
  // Nothing to choose from (callers never pass this), or more ids than int32 can name.
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return result;
  }
  Scratch& s = ThreadScratch();
  const PenalisedRow row(logits, params.repetition_penalty, history, s);
  // Written so that a NaN temperature (unvalidated params) falls back to greedy.
  result.token = params.temperature > 0.0f
                     ? SampleFromLogits(row, params, Uniform(params.seed, token_index), s)
                     : ArgMax(row);
  if (want.chosen || want.top > 0) AddLogprobs(logits, want.top, s, &result);
  return result;
}

SampledToken ForcedToken(absl::Span<const float> logits, int32_t token, LogprobRequest want) {
  SampledToken result;
  result.token = token;
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()) ||
      token < 0 || static_cast<size_t>(token) >= logits.size()) {
    return result;  // Engine::Submit keeps forced ids in the row
  }
  if (want.chosen || want.top > 0) {
    AddLogprobs(logits, want.top, ThreadScratch(), &result);
  }
  return result;
}

std::vector<int32_t> PenalisedIds(const SamplingParams& params, absl::Span<const int32_t> history,
                                  int64_t vocab) {
  std::vector<int32_t> ids;
  if (static_cast<double>(params.repetition_penalty) == 1.0) return ids;
  for (int32_t id : history) {
    if (id >= 0 && id < vocab) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int64_t SummaryCandidates(const SamplingParams& params, LogprobRequest want, int64_t penalised,
                          int64_t vocab, int64_t max_candidates) {
  if (want.chosen || want.top > 0 || vocab <= 0) return 0;
  int64_t needed;
  // The same tests, in the same order, as SampleToken and SampleFromLogits.
  if (!(params.temperature > 0.0f)) {
    needed = penalised + 1;
  } else if (std::isfinite(params.temperature) && params.top_k > 0 && params.top_k < vocab) {
    needed = params.top_k + penalised;
  } else {
    return 0;
  }
  needed = std::min(needed, vocab);
  return needed <= max_candidates ? needed : 0;
}

absl::StatusOr<int32_t> SampleFromSummary(const RowSummary& row, const SamplingParams& params,
                                          uint64_t token_index) {
  const size_t n = row.top_ids.size();
  if (row.vocab <= 0 || row.vocab > std::numeric_limits<int32_t>::max() ||
      row.top_values.size() != n || row.penalised_raw.size() != row.penalised_ids.size()) {
    return absl::InvalidArgumentError("row summary: vocab out of range or mismatched sizes");
  }
  for (absl::Span<const int32_t> ids : {row.top_ids, row.penalised_ids}) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= row.vocab || (i > 0 && ids[i] <= ids[i - 1])) {
        return absl::InvalidArgumentError(
            "row summary: ids must be ascending, distinct and within the vocabulary");
      }
    }
  }
  const int64_t penalised = static_cast<int64_t>(row.penalised_ids.size());
  const int64_t needed =
      SummaryCandidates(params, LogprobRequest{}, penalised, row.vocab, row.vocab);
  if (needed == 0 || static_cast<int64_t>(n) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row summary: this request needs ", needed == 0 ? "the whole row" : absl::StrCat(needed),
        " candidates, the summary has ", n));
  }
  const double penalty = params.repetition_penalty;
  std::vector<double> pen_values;
  for (float x : row.penalised_raw) pen_values.push_back(Penalise(NanToNegInf(x), penalty));
  const std::vector<int32_t> pen_ids(row.penalised_ids.begin(), row.penalised_ids.end());
  auto is_penalised = [&](int32_t id) {
    return std::binary_search(pen_ids.begin(), pen_ids.end(), id);
  };
  // The summary's candidates in canonical order (value descending, id ascending): the
  // unpenalised ones come in the order a scan of the unpenalised row would rank them.
  auto raw = [&](size_t i) { return NanToNegInf(row.top_values[i]); };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return raw(a) > raw(b) || (raw(a) == raw(b) && row.top_ids[a] < row.top_ids[b]);
  });

  if (!(params.temperature > 0.0f)) {
    // ArgMax's answer: the largest value, the lowest id among equals.
    double best = 0.0;
    int32_t best_id = -1;
    for (size_t i : order) {
      if (!is_penalised(row.top_ids[i])) {
        best = raw(i);
        best_id = row.top_ids[i];
        break;
      }
    }
    for (size_t j = 0; j < pen_ids.size(); ++j) {
      if (best_id < 0 || pen_values[j] > best || (pen_values[j] == best && pen_ids[j] < best_id)) {
        best = pen_values[j];
        best_id = pen_ids[j];
      }
    }
    return best_id;
  }
  const size_t k = static_cast<size_t>(params.top_k);
  std::vector<int32_t> winners;
  for (size_t i : order) {
    if (winners.size() == k) break;
    if (!is_penalised(row.top_ids[i])) winners.push_back(static_cast<int32_t>(i));
  }
  // Indices into the summary, sorted by id (the summary's ids ascend, so by index).
  std::sort(winners.begin(), winners.end());
  std::vector<int32_t> winner_ids;
  for (int32_t i : winners) winner_ids.push_back(row.top_ids[i]);
  Scratch& s = ThreadScratch();
  s.candidates.clear();
  const int shift = samplemath::WeightShift(row.vocab);
  const uint64_t total = PoolCandidates(
      winner_ids,
      [&](int32_t id) {
        const size_t i = static_cast<size_t>(
            std::lower_bound(row.top_ids.begin(), row.top_ids.end(), id) - row.top_ids.begin());
        return raw(i);
      },
      pen_ids, pen_values, k, static_cast<double>(params.temperature), shift, s);
  return Draw(params, Uniform(params.seed, token_index), total, shift, s);
}

samplemath::RowSampling RowSamplingFor(const SamplingParams& params, uint64_t token_index) {
  samplemath::RowSampling r;
  r.temperature = params.temperature;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.repetition_penalty = params.repetition_penalty;
  r.top_k = params.top_k;
  r.seed = params.seed;
  r.token_index = token_index;
  return r;
}

SamplingParams SamplingParamsOf(const samplemath::RowSampling& row) {
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.repetition_penalty = row.repetition_penalty;
  p.top_k = row.top_k;
  p.seed = row.seed;
  return p;
}

}  // namespace glmserve
