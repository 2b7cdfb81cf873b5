// RMSNorm fused with the residual add, and the plain residual add.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kNormThreads = 256;

// One block per output row. The sum of squares is reduced in fp32; the row is read twice
// (the second pass hits L1/L2) rather than held in registers, so any width works.
__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ h, const float* __restrict__ delta,
                     const float* __restrict__ gain, int64_t width, float eps,
                     const int32_t* __restrict__ row_index, uint16_t* __restrict__ out_bf16,
                     float* __restrict__ out_f32) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t src = row_index != nullptr ? row_index[r] : r;
  float* hr = h + src * width;
  float squares = 0.f;
  if (delta != nullptr) {
    const float* dr = delta + src * width;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const float v = hr[c] + dr[c];
      hr[c] = v;  // this thread re-reads only the columns it wrote
      squares += v * v;
    }
  } else {
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) squares += hr[c] * hr[c];
  }
  const float inv = rowmath::RmsInvScale(dev::BlockSum(squares, scratch), width, eps);
  uint16_t* ob = out_bf16 + r * width;
  float* of = out_f32 != nullptr ? out_f32 + r * width : nullptr;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const float y = gain[c] * (hr[c] * inv);
    ob[c] = dev::FloatToBf16(y);
    if (of != nullptr) of[c] = y;
  }
}

__global__ void AddKernel(float* __restrict__ h, const float* __restrict__ delta, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    h[i] += delta[i];
  }
}

}  // namespace

cudaError_t LaunchAddRmsNorm(float* h, const float* delta, const float* gain, int64_t rows,
                             int64_t width, float eps, const int32_t* row_index, uint16_t* out_bf16,
                             float* out_f32, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  if (row_index != nullptr && delta != nullptr) return cudaErrorInvalidValue;
  AddRmsNormKernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(
      h, delta, gain, width, eps, row_index, out_bf16, out_f32);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* h, const float* delta, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<GridStrideBlocks(n, 256), 256, 0, stream>>>(h, delta, n);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
