// Sampling on the device: each row's token chosen exactly as core/engine/sampler.cc's
// SampleToken chooses it (greedy, temperature, top-k, top-p, min-p, repetition penalty,
// seeded), so the logits never leave the device. Both sides share core/model/sample_math.h:
// the penalty and the temperature in float64, integer weights from DetExp, exact sums. Sums of
// integers do not depend on the order of the additions, so this kernel can add a row's
// weights with shared-memory atomics and still agree with the host's loops bit for bit.
//
// One block per row. The canonical order (weight descending, id ascending) is never sorted:
// every question about it is a radix selection over a key that orders ids the same way.
//   - top-k: the k-th largest of (scaled logit, lower id first): a 96-bit key, count mass;
//   - top-p: the first id whose running weight reaches NucleusTarget: the 64-bit key
//     (W << id_bits) | (id_mask - id), weight mass;
//   - the draw: the first id whose running weight exceeds DrawTarget, the same key.
// Each selection decides the key eight bits at a time from the top: a 256-bin histogram of
// the mass of the ids whose key matches the bits decided so far, then one thread finds the bin
// where the running mass crosses the target. Nothing is stored per id: every pass recomputes
// the id's scaled logit and weight from the row (a few dozen float64 operations), so the
// kernel needs no scratch memory. Only __syncthreads and shared-memory atomics: it runs under
// tools/cuda_emu as written.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"
#include "core/model/sample_math.h"

namespace glmserve::cuda {
namespace {

namespace sm = samplemath;

constexpr int kThreads = 256;

// A position in a canonical order: larger keys come first; `lo` breaks ties.
struct Key96 {
  uint64_t hi;
  uint32_t lo;
};

__device__ __forceinline__ bool KeyLess(Key96 a, Key96 b) {
  return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

// Order-preserving key of a double that holds no NaN (-0 and +0 map alike).
__device__ __forceinline__ uint64_t DoubleKey(double x) {
  if (x == 0.0) x = 0.0;
  const uint64_t bits = sm::DoubleBits(x);
  return (bits & 0x8000000000000000ULL) ? ~bits : (bits | 0x8000000000000000ULL);
}

// The 8-bit digit `pass` (0: the top) of a 96-bit key, and whether the key's digits above it
// match `prefix`.
__device__ __forceinline__ uint32_t Digit(Key96 k, int pass) {
  return pass < 8 ? static_cast<uint32_t>(k.hi >> (56 - 8 * pass)) & 0xffu
                  : (k.lo >> (24 - 8 * (pass - 8))) & 0xffu;
}
__device__ __forceinline__ bool AboveMatches(Key96 k, Key96 prefix, int pass) {
  if (pass == 0) return true;
  if (pass <= 8) return (k.hi >> (64 - 8 * pass)) == (prefix.hi >> (64 - 8 * pass));
  return k.hi == prefix.hi &&
         (k.lo >> (32 - 8 * (pass - 8))) == (prefix.lo >> (32 - 8 * (pass - 8)));
}

struct SelectState {
  Key96 prefix;
  uint64_t remaining;  // of the target, the mass still to cover among keys matching prefix
};

// The largest key K (over ids [0, vocab)) such that the mass of the keys >= K reaches
// `target` (>= 1, at most the total mass): the id where a walk down the order first reaches
// it. `passes` is 8 for keys whose `lo` is 0
// throughout (a 64-bit key), 12 otherwise. Reached by every thread; `hist` holds 256 entries.
template <typename KeyOf, typename MassOf>
__device__ Key96 SelectByMass(int64_t vocab, uint64_t target, int passes, KeyOf key_of,
                              MassOf mass_of, unsigned long long* hist, SelectState* st) {
  if (threadIdx.x == 0) {
    st->prefix = {0, 0};
    st->remaining = target;
  }
  for (int pass = 0; pass < passes; ++pass) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const Key96 prefix = st->prefix;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const Key96 k = key_of(i);
      if (!AboveMatches(k, prefix, pass)) continue;
      const uint64_t mass = mass_of(i);
      if (mass != 0) atomicAdd(&hist[Digit(k, pass)], static_cast<unsigned long long>(mass));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t above = 0;
      int digit = 255;
      for (; digit > 0 && above + hist[digit] < st->remaining; --digit) above += hist[digit];
      st->remaining -= above;
      if (pass < 8) {
        st->prefix.hi |= static_cast<uint64_t>(digit) << (56 - 8 * pass);
      } else {
        st->prefix.lo |= static_cast<uint32_t>(digit) << (24 - 8 * (pass - 8));
      }
    }
    __syncthreads();
  }
  const Key96 result = st->prefix;
  __syncthreads();  // st is reused by the next selection
  return result;
}

// Block reductions through `slots` (kThreads entries). Reached by every thread.
__device__ double BlockMax(double v, double* slots) {
  slots[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      slots[threadIdx.x] = fmax(slots[threadIdx.x], slots[threadIdx.x + half]);
    __syncthreads();
  }
  const double result = slots[0];
  __syncthreads();
  return result;
}

__device__ uint64_t BlockSum(uint64_t v, unsigned long long* slots) {
  slots[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) slots[threadIdx.x] += slots[threadIdx.x + half];
    __syncthreads();
  }
  const uint64_t result = slots[0];
  __syncthreads();
  return result;
}

// The smallest key over the block (each thread offers its own smallest).
__device__ Key96 BlockMinKey(Key96 k, unsigned long long* hi, uint32_t* lo) {
  hi[threadIdx.x] = k.hi;
  lo[threadIdx.x] = k.lo;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const Key96 other{hi[threadIdx.x + half], lo[threadIdx.x + half]};
      if (KeyLess(other, Key96{hi[threadIdx.x], lo[threadIdx.x]})) {
        hi[threadIdx.x] = other.hi;
        lo[threadIdx.x] = other.lo;
      }
    }
    __syncthreads();
  }
  const Key96 result{hi[0], lo[0]};
  __syncthreads();
  return result;
}

__device__ double BlockSumDouble(double v, double* slots) {
  slots[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) slots[threadIdx.x] += slots[threadIdx.x + half];
    __syncthreads();
  }
  const double result = slots[0];
  __syncthreads();
  return result;
}

// Order-preserving key of a float, NaN read as -inf and -0 as +0.
__device__ __forceinline__ uint32_t FloatKey(float x) {
  if (x != x) x = __uint_as_float(0xff800000u);
  if (x == 0.0f) x = 0.0f;
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// exp(x - m) and its log with the limits the host's AddLogprobs takes where m is infinite.
__device__ __forceinline__ double RawWeight(double x, double m) {
  if (m == sm::Infinity()) return x == sm::Infinity() ? 1.0 : 0.0;
  if (m == -sm::Infinity()) return 1.0;
  return sm::DetExp(x - m);
}
__device__ __forceinline__ double LogWeight(double x, double m) {
  if (m == sm::Infinity()) return x == sm::Infinity() ? 0.0 : -sm::Infinity();
  if (m == -sm::Infinity()) return 0.0;
  return x - m;
}

// double -> float, +-inf beyond the float range (as the host's ToFloat).
__device__ __forceinline__ float ToFloat(double x) {
  constexpr double kMax = 3.4028234663852886e38;
  if (x > kMax) return __uint_as_float(0x7f800000u);
  if (x < -kMax) return __uint_as_float(0xff800000u);
  return static_cast<float>(x);
}

// Whether `id` is among the row's penalised ids (ascending): a binary search.
__device__ __forceinline__ bool Penalised(const int32_t* ids, int count, int64_t id) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ids[mid] < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < count && ids[lo] == id;
}

__global__ void __launch_bounds__(kThreads)
    RowSampleKernel(const float* __restrict__ logits, int64_t vocab,
                    const sm::RowSampling* __restrict__ params,
                    const int32_t* __restrict__ penalised_ids, int32_t* __restrict__ tokens,
                    int32_t* __restrict__ finite, float* __restrict__ logprobs,
                    int32_t* __restrict__ top_ids, float* __restrict__ top_logprobs) {
  __shared__ unsigned long long hist[256];
  __shared__ unsigned long long slots_u[kThreads];
  __shared__ double slots_d[kThreads];
  __shared__ uint32_t slots_lo[kThreads];
  __shared__ SelectState st;
  __shared__ int all_finite;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const sm::RowSampling p = params[blockIdx.x];
  const int32_t* pen = penalised_ids + p.penalised_begin;
  const int pen_count = p.penalised_count;
  const double penalty = p.repetition_penalty;
  // The ids sampled from: the row's first `columns` (all when 0).
  const int64_t n = p.columns > 0 && p.columns < vocab ? p.columns : vocab;

  // The logit after the penalty (float64, NaN read as -inf): SampleToken's PenalisedRow.
  auto value = [&](int64_t i) {
    const double x = sm::NanToNegInf(static_cast<double>(row[i]));
    return pen_count > 0 && Penalised(pen, pen_count, i) ? sm::Penalise(x, penalty) : x;
  };

  bool my_finite = true;  // over the whole row, as the engine checks it
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    my_finite &= (__float_as_uint(row[i]) & 0x7f800000u) != 0x7f800000u;
  }
  if (threadIdx.x == 0) all_finite = 1;
  __syncthreads();
  if (!my_finite) all_finite = 0;
  __syncthreads();
  if (threadIdx.x == 0 && finite != nullptr) finite[blockIdx.x] = all_finite;

  // id_bits / id_mask: (id_mask - id) orders ids descending in the low bits of a 64-bit key.
  int id_bits = 0;
  while ((int64_t{1} << id_bits) < n) ++id_bits;
  const uint64_t id_mask = (uint64_t{1} << id_bits) - 1;

  int32_t token = p.forced;
  if (token < 0 && !(p.temperature > 0.0f)) {
    // Greedy: the largest value, the lowest id among equals (a key that is larger for both).
    Key96 best{0, 0};
    bool any = false;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const Key96 k{DoubleKey(value(i)), static_cast<uint32_t>(id_mask - i)};
      if (!any || KeyLess(best, k)) best = k;
      any = true;
    }
    // The smallest of the complements is the largest key.
    const Key96 mine = any ? Key96{~best.hi, ~best.lo} : Key96{~0ULL, ~0u};
    const Key96 top = BlockMinKey(mine, slots_u, slots_lo);
    token = static_cast<int32_t>(id_mask - ~top.lo);
  } else if (token < 0) {
    const double temperature = p.temperature;
    auto scaled = [&](int64_t i) { return sm::NanToNegInf(value(i) / temperature); };
    double local_max = -sm::Infinity();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local_max = fmax(local_max, scaled(i));
    const double m = BlockMax(local_max, slots_d);
    const int shift = sm::WeightShift(n);

    // Top-k: the k-th largest (scaled logit, lower id) decides who keeps a weight.
    const bool top_k = p.top_k > 0 && p.top_k < n;
    Key96 kth{0, 0};
    auto z_key = [&](int64_t i) {
      return Key96{DoubleKey(scaled(i)), static_cast<uint32_t>(id_mask - i)};
    };
    if (top_k) {
      kth = SelectByMass(
          n, static_cast<uint64_t>(p.top_k), 12, z_key, [](int64_t) { return uint64_t{1}; }, hist,
          &st);
    }
    auto weight = [&](int64_t i) -> uint64_t {
      const double z = scaled(i);
      if (top_k && KeyLess(Key96{DoubleKey(z), static_cast<uint32_t>(id_mask - i)}, kth)) return 0;
      return sm::IntWeight(z, m, shift);
    };
    // The canonical key: weight, then lower id (W <= 2^S and S + 1 + id_bits <= 64).
    auto w_key = [&](int64_t i) { return Key96{(weight(i) << id_bits) | (id_mask - i), 0}; };

    uint64_t local_sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local_sum += weight(i);
    const uint64_t total = BlockSum(local_sum, slots_u);

    // The kept prefix ends at `end` (a w_key): min-p's last survivor or top-p's nucleus,
    // whichever comes first; all ids when neither applies.
    Key96 end{0, 0};
    uint64_t kept = total;
    bool bounded = false;
    if (p.min_p > 0.0f && p.min_p < 1.0f) {
      const uint64_t min_weight = sm::MinPWeight(p.min_p, shift);
      Key96 mine{~0ULL, ~0u};
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t w = weight(i);
        const Key96 k{(w << id_bits) | (id_mask - i), 0};
        if (w >= min_weight && KeyLess(k, mine)) mine = k;
      }
      end = BlockMinKey(mine, slots_u, slots_lo);
      bounded = true;
    }
    if (p.top_p < 1.0f) {
      const Key96 nucleus =
          SelectByMass(n, sm::NucleusTarget(p.top_p, total), 8, w_key, weight, hist, &st);
      if (!bounded || KeyLess(end, nucleus)) end = nucleus;
      bounded = true;
    }
    if (bounded) {
      uint64_t local_kept = 0;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (!KeyLess(w_key(i), end)) local_kept += weight(i);
      }
      kept = BlockSum(local_kept, slots_u);
    }

    const double u = sm::Uniform(p.seed, p.token_index);
    const Key96 chosen = SelectByMass(n, sm::DrawTarget(u, kept) + 1, 8, w_key, weight, hist, &st);
    token = static_cast<int32_t>(id_mask - (chosen.hi & id_mask));
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
  if (!p.logprob && p.top_logprobs <= 0) return;

  // Logprobs: log-softmax of the raw logits over the columns, as the host's AddLogprobs
  // (float64; the sum's order and exp differ, so values agree to float64 rounding, not bits).
  auto raw = [&](int64_t i) { return sm::NanToNegInf(static_cast<double>(row[i])); };
  double raw_local = -sm::Infinity();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) raw_local = fmax(raw_local, raw(i));
  const double raw_max = BlockMax(raw_local, slots_d);
  double sum_local = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum_local += RawWeight(raw(i), raw_max);
  const double log_sum = log(BlockSumDouble(sum_local, slots_d));
  auto logprob = [&](int64_t i) { return ToFloat(LogWeight(raw(i), raw_max) - log_sum); };
  if (threadIdx.x == 0 && logprobs != nullptr) logprobs[blockIdx.x] = logprob(token);
  const int top = p.top_logprobs < n ? p.top_logprobs : static_cast<int>(n);
  if (top <= 0 || top_ids == nullptr) return;
  // The `top` largest raw logits, ties to the lower id: a count selection over
  // (value key, lower id), then the winners gathered and put in order by one thread.
  auto raw_key = [&](int64_t i) {
    return Key96{(static_cast<uint64_t>(FloatKey(row[i])) << 32) | (id_mask - i), 0};
  };
  const Key96 kth = SelectByMass(
      n, static_cast<uint64_t>(top), 8, raw_key, [](int64_t) { return uint64_t{1}; }, hist, &st);
  __shared__ int found;
  __shared__ int32_t winners[sm::kMaxRowTopLogprobs];
  if (threadIdx.x == 0) found = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (!KeyLess(raw_key(i), kth)) {
      const int slot = atomicAdd(&found, 1);
      if (slot < sm::kMaxRowTopLogprobs) winners[slot] = static_cast<int32_t>(i);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int count = found < top ? found : top;
    for (int a = 1; a < count; ++a) {  // insertion sort, best first
      const int32_t id = winners[a];
      int b = a;
      for (; b > 0 && KeyLess(raw_key(winners[b - 1]), raw_key(id)); --b)
        winners[b] = winners[b - 1];
      winners[b] = id;
    }
    for (int j = 0; j < count; ++j) {
      top_ids[blockIdx.x * sm::kMaxRowTopLogprobs + j] = winners[j];
      top_logprobs[blockIdx.x * sm::kMaxRowTopLogprobs + j] = logprob(winners[j]);
    }
  }
}

}  // namespace

cudaError_t LaunchRowSample(const float* logits, int64_t rows, int64_t vocab,
                            const samplemath::RowSampling* params, const int32_t* penalised_ids,
                            int32_t* tokens, int32_t* finite, float* logprobs, int32_t* top_ids,
                            float* top_logprobs, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  RowSampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, vocab, params, penalised_ids, tokens, finite, logprobs, top_ids, top_logprobs);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
