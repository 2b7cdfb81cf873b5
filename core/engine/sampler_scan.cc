#include "core/engine/sampler_scan.h"

#include <algorithm>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace glmserve::sampler_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kBlock = 64;

float NanToNegInf(float x) { return x != x ? kNegInf : x; }

// max(-inf, x[0..n)) ignoring NaN. SSE's maxps(a, b) is exactly `a > b ? a : b` (a NaN in
// a yields b), which is the scalar fallback's expression too; GCC does not turn that
// expression into maxps by itself, hence the intrinsics.
float BlockMax(const float* x, int32_t n) {
  int32_t i = 0;
  float m = kNegInf;
#if defined(__SSE2__)
  __m128 a = _mm_set1_ps(kNegInf), b = a, c = a, d = a;
  for (; i + 16 <= n; i += 16) {
    a = _mm_max_ps(_mm_loadu_ps(x + i), a);
    b = _mm_max_ps(_mm_loadu_ps(x + i + 4), b);
    c = _mm_max_ps(_mm_loadu_ps(x + i + 8), c);
    d = _mm_max_ps(_mm_loadu_ps(x + i + 12), d);
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d)));
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Heap order: a before b when a is better (larger, or equal with a lower id), so the heap's
// top is the worst kept.
bool Better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

FloatBest ArgMaxRange(const float* x, int32_t begin, int32_t end) {
  FloatBest best{kNegInf, begin};
  for (int32_t b = begin; b < end; b += kBlock) {
    const int32_t n = std::min(kBlock, end - b);
    // Only a block holding a strictly larger value moves the answer (an equal one has a
    // higher id); then find its first occurrence there.
    const float m = BlockMax(x + b, n);
    if (m > best.value) {
      int32_t i = 0;
      while (x[b + i] != m) ++i;
      best = {m, b + i};
    }
  }
  return best;
}

TopKFloat::TopKFloat(size_t k, std::vector<std::pair<float, int32_t>>* heap) : k_(k), heap_(*heap) {
  heap_.clear();
}

void TopKFloat::Offer(float value, int32_t id) {
  value = NanToNegInf(value);
  if (heap_.size() < k_) {
    heap_.push_back({value, id});
    std::push_heap(heap_.begin(), heap_.end(), Better);
  } else if (k_ > 0 && value > heap_.front().first) {
    std::pop_heap(heap_.begin(), heap_.end(), Better);
    heap_.back() = {value, id};
    std::push_heap(heap_.begin(), heap_.end(), Better);
  }
}

void TopKFloat::Scan(const float* x, int32_t begin, int32_t end) {
  int32_t i = begin;
  for (; i < end && heap_.size() < k_; ++i) Offer(x[i], i);
  if (k_ == 0) return;
  for (; i < end; i += kBlock) {
    const int32_t n = std::min(kBlock, end - i);
    if (!(BlockMax(x + i, n) > heap_.front().first)) continue;
    for (int32_t j = i; j < i + n; ++j) {
      if (x[j] > heap_.front().first) Offer(x[j], j);
    }
  }
}

std::vector<int32_t> TopKFloat::TakeIds() {
  std::vector<int32_t> ids;
  ids.reserve(heap_.size());
  for (const auto& [value, id] : heap_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  heap_.clear();
  return ids;
}

}  // namespace glmserve::sampler_internal
