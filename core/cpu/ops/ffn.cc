#include "core/cpu/ops/ffn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/aligned_vector.h"
#include "core/base/parallel.h"
#include "core/cpu/ops/linear.h"
#include "core/model/row_math.h"

namespace glmserve {

void SiluMul(float* g, const float* u, int64_t n) {
  // Elementwise: how the range is cut cannot change a bit. Chunks of kGrain values; a single
  // chunk (decode-sized rows) runs on the caller, as ParallelFor does with one item.
  constexpr int64_t kGrain = int64_t{1} << 16;
  ParallelFor((n + kGrain - 1) / kGrain, 1, [&](int64_t begin, int64_t end) {
    const int64_t stop = std::min(n, end * kGrain);
    for (int64_t i = begin * kGrain; i < stop; ++i) g[i] = rowmath::SiluMul(g[i], u[i]);
  });
}

void SwiGluFfn(const float* x, int64_t m, const FfnWeights& w, float* y, CpuMath math) {
  const int64_t width = w.gate.rows;
  // gate and up [m, width], reused from call to call on this thread (as MoeFfn's arenas): fresh
  // vectors were 180 MB zeroed and faulted in per 2,048-token dense layer of glm-4.5-air, about
  // 0.04 s. Every element is written by the projections before it is read.
  static thread_local AlignedVector<float> gate_arena, up_arena;
  float* gate = GrowTo(&gate_arena, m * width);
  float* up = GrowTo(&up_arena, m * width);
  const LinearJob jobs[] = {{x, m, &w.gate, nullptr, gate}, {x, m, &w.up, nullptr, up}};
  LinearMany(jobs, math);
  SiluMul(gate, up, m * width);
  Linear(gate, m, w.down, nullptr, y, math);
}

}  // namespace glmserve
