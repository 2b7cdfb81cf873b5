#include "core/ops/linear.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"

namespace glmserve {
namespace internal {

bool CpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

void WidenPanel(const Matrix& w, int64_t row_begin, int64_t rows, int64_t k_begin, int64_t k_len,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = (row_begin + r) * w.cols + k_begin;
    float* dst = out + r * k_len;
    switch (w.dtype) {
      case DType::kF32:
        std::copy_n(static_cast<const float*>(w.data) + base, k_len, dst);
        break;
      case DType::kBF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + base;
        for (int64_t k = 0; k < k_len; ++k) dst[k] = Bf16ToFloat(src[k]);
        break;
      }
      case DType::kF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + base;
        for (int64_t k = 0; k < k_len; ++k) dst[k] = F16ToFloat(src[k]);
        break;
      }
    }
  }
}

// The reference arithmetic: 16 lanes, lane j sums k = j, j+16, ... of one K block, then the
// lanes are combined by a fixed pairwise tree, and the block sums are added in order.
static inline float Dot16(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    for (int j = 0; j < 16; ++j) lane[j] += a[k + j] * b[k + j];
  }
  for (int j = 0; k + j < n; ++j) lane[j] += a[k + j] * b[k + j];
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

void LinearBlockGeneric(const LinearJob& job, int64_t nb, std::vector<float>* panel) {
  const Matrix& w = *job.w;
  const int64_t m = job.m, n_rows = w.rows, k_total = w.cols;
  const int64_t n0 = nb * kBlockN, nn = std::min(kBlockN, n_rows - n0);
  float* y = job.y;
  for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * n_rows + n0, nn, 0.f);
  panel->resize(kBlockN * std::min(k_total, kBlockK));
  for (int64_t k0 = 0; k0 < k_total; k0 += kBlockK) {
    const int64_t kk = std::min(kBlockK, k_total - k0);
    WidenPanel(w, n0, nn, k0, kk, panel->data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < nn; ++n) {
        y[i * n_rows + n0 + n] += Dot16(job.x + i * k_total + k0, panel->data() + n * kk, kk);
      }
    }
  }
  if (job.bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < nn; ++n) y[i * n_rows + n0 + n] += job.bias[n0 + n];
  }
}

namespace {

using BlockFn = void (*)(const LinearJob&, int64_t, std::vector<float>*);

void RunJobs(absl::Span<const LinearJob> jobs, BlockFn block_fn) {
  // Blocks of all jobs in one index space: [starts[j], starts[j + 1]) belong to job j.
  std::vector<int64_t> starts(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t blocks = jobs[j].m > 0 ? (jobs[j].w->rows + kBlockN - 1) / kBlockN : 0;
    starts[j + 1] = starts[j] + blocks;
  }
  ParallelFor(starts.back(), 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panel;
    for (int64_t b = begin; b < end; ++b) {
      const size_t j = std::upper_bound(starts.begin(), starts.end(), b) - starts.begin() - 1;
      block_fn(jobs[j], b - starts[j], &panel);
    }
  });
}

}  // namespace

void LinearGeneric(const float* x, int64_t m, const Matrix& w, const float* bias, float* y) {
  const LinearJob job{x, m, &w, bias, y};
  RunJobs({job}, LinearBlockGeneric);
}

}  // namespace internal

void LinearMany(absl::Span<const LinearJob> jobs) {
  internal::RunJobs(
      jobs, internal::CpuHasAvx512() ? internal::LinearBlockAvx512 : internal::LinearBlockGeneric);
}

void Linear(const float* x, int64_t m, const Matrix& w, const float* bias, float* y) {
  if (m <= 0 || w.rows <= 0) return;
  const LinearJob job{x, m, &w, bias, y};
  LinearMany({job});
}

const char* LinearKernelName() { return internal::CpuHasAvx512() ? "avx512" : "generic"; }

}  // namespace glmserve
