// Elementwise kernels: the embedding gather, the SwiGLU activation, dtype conversions.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

// Rows [first, first + count) of the vocabulary are the table's; other ids embed to zeros (a
// tensor-parallel rank's slice: the group's sum is then the whole embedding, exactly).
__global__ void EmbeddingKernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ ids,
                                int64_t first, int64_t count, int64_t width,
                                float* __restrict__ h) {
  const int64_t t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[t]) - first;
  if (id < 0 || id >= count) {
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) h[t * width + c] = 0.f;
    return;
  }
  const uint16_t* row = table + id * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
    h[t * width + c] = dev::Bf16ToFloat(row[c]);
}

__global__ void SwiGluKernel(const float* __restrict__ gate_up, int64_t rows, int64_t width,
                             uint16_t* __restrict__ out) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const float* g = gate_up + r * 2 * width;
    out[i] = dev::FloatToBf16(rowmath::SiluMul(g[c], g[width + c]));
  }
}

__global__ void FloatToBf16Kernel(const float* __restrict__ in, int64_t n,
                                  uint16_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = dev::FloatToBf16(in[i]);
  }
}

__global__ void RowsToBf16Kernel(const float* __restrict__ in, int64_t rows, int64_t cols,
                                 int64_t in_stride, uint16_t* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = dev::FloatToBf16(in[(i / cols) * in_stride + i % cols]);
  }
}

__global__ void Bf16ToFloatKernel(const uint16_t* __restrict__ in, int64_t n,
                                  float* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = dev::Bf16ToFloat(in[i]);
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const uint16_t* table, const int32_t* ids, int64_t tokens,
                            int64_t width, float* h, cudaStream_t stream) {
  return LaunchEmbeddingSlice(table, ids, tokens, 0, INT64_MAX, width, h, stream);
}

cudaError_t LaunchEmbeddingSlice(const uint16_t* table, const int32_t* ids, int64_t tokens,
                                 int64_t first, int64_t count, int64_t width, float* h,
                                 cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  EmbeddingKernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(table, ids, first, count,
                                                                     width, h);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* gate_up, int64_t rows, int64_t width, uint16_t* out,
                         cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  SwiGluKernel<<<GridStrideBlocks(rows * width, 256), 256, 0, stream>>>(gate_up, rows, width, out);
  return cudaGetLastError();
}

cudaError_t LaunchFloatToBf16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FloatToBf16Kernel<<<GridStrideBlocks(n, 256), 256, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchRowsToBf16(const float* in, int64_t rows, int64_t cols, int64_t in_stride,
                             uint16_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  RowsToBf16Kernel<<<GridStrideBlocks(rows * cols, 256), 256, 0, stream>>>(in, rows, cols,
                                                                           in_stride, out);
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToFloat(const uint16_t* in, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  Bf16ToFloatKernel<<<GridStrideBlocks(n, 256), 256, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
