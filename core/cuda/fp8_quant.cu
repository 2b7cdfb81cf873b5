// The two kernels around the tensor-core FP8 GEMM (core/cuda/fp8_gemm.h, docs/cuda.md):
// activations quantized on the fly per token, and the epilogue that applies the per-token and
// per-output-channel scales to the fp32 products.
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kQuantThreads = 256;

// One block per row of x [m, k] bf16: amax over the row's finite values (a warp max, then the
// warps' maxima in shared memory), scale = amax / 448 (dev::KvScale: at least FLT_MIN, 1 for a
// zero row), codes = e4m3(x / scale).
__global__ void __launch_bounds__(kQuantThreads)
    QuantizeRowsFp8Kernel(const uint16_t* __restrict__ x, int64_t k, uint8_t* __restrict__ codes,
                          float* __restrict__ scales) {
  __shared__ float warp_max[kQuantThreads / 32];
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * k;  // [k]
  float amax = 0.f;
  for (int64_t c = threadIdx.x; c < k; c += kQuantThreads) {
    const float a = fabsf(dev::Bf16ToFloat(xr[c]));
    if (a <= 3.40282347e+38f) amax = fmaxf(amax, a);  // finite only (NaN compares false)
  }
  amax = dev::WarpMax(amax);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  float m = 0.f;
  for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
  const float scale = dev::KvScale(m);
  uint8_t* out = codes + row * k;  // [k]
  for (int64_t c = threadIdx.x; c < k; c += kQuantThreads) {
    out[c] = dev::FloatToE4m3(dev::Bf16ToFloat(xr[c]) / scale);
  }
  if (threadIdx.x == 0) scales[row] = scale;
}

// y[i * y_ld + n] *= row_scales[i] * col_scales[n], i < m, n < cols (grid-stride).
__global__ void ScaleRowsColsKernel(float* __restrict__ y, int64_t m, int64_t cols, int64_t y_ld,
                                    const float* __restrict__ row_scales,
                                    const float* __restrict__ col_scales) {
  const int64_t total = m * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, n = e % cols;
    y[i * y_ld + n] *= row_scales[i] * col_scales[n];
  }
}

}  // namespace

cudaError_t LaunchQuantizeRowsFp8(const uint16_t* x, int64_t m, int64_t k, uint8_t* codes,
                                  float* scales, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k <= 0 || m > 2147483647) return cudaErrorInvalidValue;
  QuantizeRowsFp8Kernel<<<static_cast<unsigned>(m), kQuantThreads, 0, stream>>>(x, k, codes,
                                                                                scales);
  return cudaGetLastError();
}

cudaError_t LaunchScaleRowsCols(float* y, int64_t m, int64_t cols, int64_t y_ld,
                                const float* row_scales, const float* col_scales,
                                cudaStream_t stream) {
  if (m <= 0 || cols <= 0) return cudaSuccess;
  if (y_ld < cols) return cudaErrorInvalidValue;
  ScaleRowsColsKernel<<<GridStrideBlocks(m * cols, 256), 256, 0, stream>>>(y, m, cols, y_ld,
                                                                           row_scales, col_scales);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
