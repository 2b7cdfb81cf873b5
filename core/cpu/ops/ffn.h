// SwiGLU feed-forward: y = down(silu(gate(x)) * up(x)), the dense FFN, every routed expert
// and the shared expert.
#pragma once

#include <cstdint>

#include "core/cpu/ops/linear.h"
#include "core/model/weights.h"

namespace glmserve {

// silu(g) * u elementwise, silu(g) = g / (1 + exp(-g)); writes into g.
void SiluMul(float* g, const float* u, int64_t n);

// x: [m, hidden]; y: [m, hidden] (overwritten).
void SwiGluFfn(const float* x, int64_t m, const FfnWeights& w, float* y,
               CpuMath math = CpuMath::kExact);

}  // namespace glmserve
