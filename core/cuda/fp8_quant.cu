// The kernels around the tensor-core FP8 GEMM (core/cuda/fp8_gemm.h, docs/cuda.md): activations
// quantized on the fly per 1x128 group, the per-output-channel epilogue, and the padded copy of
// 128x128 block scales that cuBLASLt's block-scaled mode reads.
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

static_assert(kFp8ActGroup == 128, "one thread per element of a group");

// Block (i, g): row i of x [m, k] bf16, columns [128 g, min(128 g + 128, k)) (the last group
// cut short). amax over the group's finite values (a warp max, then the 4 warps' maxima in
// shared memory), scale = amax / 448 (dev::KvScale: at least FLT_MIN, 1 for a zero group),
// codes[i, c] = e4m3(x[i, c] / scale), scales[g * scale_ld + i] = scale.
__global__ void __launch_bounds__(kFp8ActGroup)
    QuantizeGroupsFp8Kernel(const uint16_t* __restrict__ x, int64_t k, uint8_t* __restrict__ codes,
                            float* __restrict__ scales, int64_t scale_ld) {
  __shared__ float warp_max[kFp8ActGroup / 32];
  const int64_t row = blockIdx.x, g = blockIdx.y;
  const int64_t c = g * kFp8ActGroup + threadIdx.x;
  const float v = c < k ? dev::Bf16ToFloat(x[row * k + c]) : 0.f;
  const float a = fabsf(v);
  float amax = a <= 3.40282347e+38f ? a : 0.f;  // finite only (NaN compares false)
  amax = dev::WarpMax(amax);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  float m = 0.f;
  for (int w = 0; w < kFp8ActGroup / 32; ++w) m = fmaxf(m, warp_max[w]);
  const float scale = dev::KvScale(m);
  if (c < k) codes[row * k + c] = dev::FloatToE4m3(v / scale);
  if (threadIdx.x == 0) scales[g * scale_ld + row] = scale;
}

// y[i * y_ld + n] *= col_scales[n], i < m, n < cols (grid-stride).
__global__ void ScaleColsKernel(float* __restrict__ y, int64_t m, int64_t cols, int64_t y_ld,
                                const float* __restrict__ col_scales) {
  const int64_t total = m * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, n = e % cols;
    y[i * y_ld + n] *= col_scales[n];
  }
}

// dst [block_rows_n, ld] = src [block_rows_n, blocks_k] with columns past blocks_k set to 1.
__global__ void PadBlockScalesKernel(const float* __restrict__ src, int64_t rows, int64_t cols,
                                     float* __restrict__ dst, int64_t ld) {
  const int64_t total = rows * ld;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / ld, c = e % ld;
    dst[e] = c < cols ? src[r * cols + c] : 1.f;
  }
}

}  // namespace

cudaError_t LaunchQuantizeFp8Groups(const uint16_t* x, int64_t m, int64_t k, uint8_t* codes,
                                    float* scales, int64_t scale_ld, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  const int64_t groups = Fp8ActGroups(k);
  if (k <= 0 || m > 2147483647 || groups > 65535 || scale_ld < m) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>(groups));
  QuantizeGroupsFp8Kernel<<<grid, kFp8ActGroup, 0, stream>>>(x, k, codes, scales, scale_ld);
  return cudaGetLastError();
}

cudaError_t LaunchScaleCols(float* y, int64_t m, int64_t cols, int64_t y_ld,
                            const float* col_scales, cudaStream_t stream) {
  if (m <= 0 || cols <= 0) return cudaSuccess;
  if (y_ld < cols) return cudaErrorInvalidValue;
  ScaleColsKernel<<<GridStrideBlocks(m * cols, 256), 256, 0, stream>>>(y, m, cols, y_ld,
                                                                       col_scales);
  return cudaGetLastError();
}

cudaError_t LaunchPadBlockScales(const float* src, int64_t rows, int64_t cols, float* dst,
                                 int64_t ld, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ld < cols) return cudaErrorInvalidValue;
  PadBlockScalesKernel<<<GridStrideBlocks(rows * ld, 256), 256, 0, stream>>>(src, rows, cols, dst,
                                                                             ld);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
