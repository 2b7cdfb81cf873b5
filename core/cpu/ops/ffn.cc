#include "core/cpu/ops/ffn.h"

#include <cmath>
#include <vector>

#include "core/cpu/ops/linear.h"
#include "core/model/row_math.h"

namespace glmserve {

void SiluMul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = rowmath::SiluMul(g[i], u[i]);
}

void SwiGluFfn(const float* x, int64_t m, const FfnWeights& w, float* y, CpuMath math) {
  const int64_t width = w.gate.rows;
  std::vector<float> gate(m * width), up(m * width);
  const LinearJob jobs[] = {{x, m, &w.gate, nullptr, gate.data()},
                            {x, m, &w.up, nullptr, up.data()}};
  LinearMany(jobs, math);
  SiluMul(gate.data(), up.data(), m * width);
  Linear(gate.data(), m, w.down, nullptr, y, math);
}

}  // namespace glmserve
