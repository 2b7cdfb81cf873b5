#include "core/model/weights.h"

#include "core/model/weight_layout.h"

namespace glmserve {

// Both walk the one list of the span's tensors (core/model/weight_layout.h), so that a field
// added there is counted and quantized without a second list to update. Listing the slots does
// not change the weights (the const_cast only types the pointers the list hands out).
int64_t ModelWeights::ParameterBytes() const {
  int64_t total = 0;
  for (const WeightSlot& s : ListWeightSlots(const_cast<ModelWeights*>(this))) {
    total += s.matrix != nullptr ? s.matrix->bytes()
                                 : static_cast<int64_t>(s.vector->size() * sizeof(float));
  }
  return total;
}

std::vector<Matrix*> ModelWeights::LinearMatrices() {
  std::vector<Matrix*> matrices;
  for (const WeightSlot& s : ListWeightSlots(this)) {
    if (s.linear && !s.matrix->empty()) matrices.push_back(s.matrix);
  }
  return matrices;
}

}  // namespace glmserve
