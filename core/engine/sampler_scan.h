// Scans over a float logits row for the sampler (core/engine/sampler.cc): the maximum with its
// lowest id, and the k largest, ties by lower id. Both treat NaN as -inf and both work in
// blocks whose maximum is taken first (a loop the compiler vectorises), so that a block that
// cannot change the answer costs one vector pass and no per-element branch. Float compares
// are exact, so these give exactly what a scalar scan in float64 over the same values gives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace glmserve::sampler_internal {

struct FloatBest {
  float value;  // the maximum, NaN read as -inf
  int32_t id;   // its lowest id
};

// The maximum of x[begin, end) (begin < end) and the first id holding it; an all -inf / NaN
// range gives {-inf, begin}.
FloatBest ArgMaxRange(const float* x, int32_t begin, int32_t end);

// Keeps the k largest of the values offered, ties by lower id. Values must be offered in
// ascending id order (Scan's ranges and Offer's ids together), which is what lets a new
// value enter only when strictly greater than the worst kept one.
class TopKFloat {
 public:
  explicit TopKFloat(size_t k, std::vector<std::pair<float, int32_t>>* heap);

  void Offer(float value, int32_t id);
  // Offers x[begin, end).
  void Scan(const float* x, int32_t begin, int32_t end);
  // The kept ids, in ascending id order (the heap storage is consumed).
  std::vector<int32_t> TakeIds();

 private:
  size_t k_;
  std::vector<std::pair<float, int32_t>>& heap_;  // top: the worst kept (value, id)
};

}  // namespace glmserve::sampler_internal
