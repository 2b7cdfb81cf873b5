// Linear layers: y[m, N] = x[m, K] W^T (+ bias), for W [N, K] in its stored dtype.
//
// Activations are fp32; bf16/f16 weights are widened exactly to fp32 on the fly and every
// product is accumulated in fp32. Each output element is reduced in one fixed order that
// depends only on K (16 lanes strided over k, a fixed lane tree, fixed K blocks), never on m
// or on the element's position in a tile: so a sequence's result is bit-identical whether it
// runs alone or inside a batch of any size. This is why the engine uses its own GEMM rather
// than a BLAS library, whose blocking (and small-matrix paths) change with m.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/weights.h"

namespace glmserve {

// x: [m, w.cols] row-major; y: [m, w.rows]; bias: [w.rows] or nullptr. Uses the thread
// pool (core/parallel.h).
void Linear(const float* x, int64_t m, const Matrix& w, const float* bias, float* y);

// Several independent linear layers in one parallel loop (q/k/v; every expert's gate and up):
// one dispatch instead of many, and small matrices share the threads. Each job's result is
// exactly what Linear gives for it.
struct LinearJob {
  const float* x = nullptr;  // [m, w->cols]
  int64_t m = 0;
  const Matrix* w = nullptr;
  const float* bias = nullptr;  // [w->rows] or nullptr
  float* y = nullptr;           // [m, w->rows]
};
void LinearMany(absl::Span<const LinearJob> jobs);

// Which kernel Linear dispatches to on this machine ("avx512" or "generic").
const char* LinearKernelName();

namespace internal {
// The portable kernel, exposed for tests that compare it with the dispatched one.
void LinearGeneric(const float* x, int64_t m, const Matrix& w, const float* bias, float* y);
// Output rows [nb * kBlockN, (nb + 1) * kBlockN) of one job; `panel` is scratch.
void LinearBlockGeneric(const LinearJob& job, int64_t nb, std::vector<float>* panel);
void LinearBlockAvx512(const LinearJob& job, int64_t nb, std::vector<float>* panel);
bool CpuHasAvx512();
// Widens rows [row_begin, row_begin + rows) x columns [k_begin, k_begin + k_len) of w to
// fp32 into out [rows, k_len].
void WidenPanel(const Matrix& w, int64_t row_begin, int64_t rows, int64_t k_begin, int64_t k_len,
                float* out);
// Block sizes shared by both kernels: the fixed K blocking is part of the numerics.
inline constexpr int64_t kBlockK = 512;  // K block: partial sums are added per block
inline constexpr int64_t kBlockN = 32;   // weight rows per parallel task
}  // namespace internal

}  // namespace glmserve
