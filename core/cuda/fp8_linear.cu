// FP8 linear layers on the device (docs/fp8.md): e4m3 weights, one byte each in device memory,
// widened in registers and multiplied by their block's fp32 scale (per output channel:
// block_rows 1, block_cols = cols; 128x128 blocks cut short at the edges), fp32 activations
// and accumulation. Two kernels, chosen by the number of activation rows:
//  * GEMV (m <= kFp8GemvMaxRows, decode): one block per output row streams the row's bytes
//    once for all m activation rows: bandwidth-bound, one read of each weight byte per step;
//  * tiled GEMM (larger m, prefill): 32x32 output tiles, K in steps of 32 through shared
//    memory, the weight tile widened once into shared memory and reused by 32 rows.
// Both CUDA-core kernels of our own; prefill GEMMs (per-channel or 128x128 weights) may
// instead take FP8 tensor cores through cuBLASLt (fp8_gemm.cc, opt-in; docs/cuda.md "FP8 on
// tensor cores").
// The activations are fp32 (the kernel tests) or bf16 (the CUDA runner's GEMM inputs), and the
// outputs may be a column slice of wider rows (y_ld). A third kernel runs the routed experts
// from device-side row offsets (graph-capturable decode).
// The value of a weight is the CPU's (e4m3 x scale, one fp32 rounding); only the summation
// order differs from core/cpu/ops/linear.cc, so results agree to fp32 rounding (1e-5 relative).
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_device.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kGemvThreads = 128;
constexpr int kTile = 32;     // GEMM output tile side and K step
constexpr int kTileRows = 8;  // threads per tile column: each computes 4 outputs

// Activation element i: fp32 (x32) or bf16 (x16, the CUDA runner's GEMM inputs); exactly one
// is set. A run-time choice rather than a template: the branch is uniform across the grid.
__device__ __forceinline__ float LoadX(const float* x32, const uint16_t* x16, int64_t i) {
  return x16 != nullptr ? dev::Bf16ToFloat(x16[i]) : x32[i];
}

// y[i * y_ld + n] for i < m (m <= kFp8GemvMaxRows); one block per n.
__global__ void __launch_bounds__(kGemvThreads)
    Fp8GemvKernel(const float* __restrict__ x32, const uint16_t* __restrict__ x16, int64_t m,
                  Fp8DeviceMatrix w, float* __restrict__ y, int64_t y_ld) {
  __shared__ float scratch[32];
  const int64_t n = blockIdx.x;
  float acc[kFp8GemvMaxRows] = {};
  for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) {
    const float wv = dev::Fp8At(w, n, c);
#pragma unroll
    for (int i = 0; i < kFp8GemvMaxRows; ++i) {
      if (i < m) acc[i] += LoadX(x32, x16, i * w.cols + c) * wv;
    }
  }
  for (int i = 0; i < m; ++i) {
    const float s = dev::BlockSum(acc[i], scratch);
    if (threadIdx.x == 0) y[i * y_ld + n] = s;
  }
}

// y tile [32 rows of x, 32 rows of w]; 256 threads: thread (tx, ty) = (t % 32, t / 32) computes
// y[ty + 8 j, tx] for j < 4.
__global__ void __launch_bounds__(kTile* kTileRows)
    Fp8GemmKernel(const float* __restrict__ x32, const uint16_t* __restrict__ x16, int64_t m,
                  Fp8DeviceMatrix w, float* __restrict__ y, int64_t y_ld) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kTile / kTileRows] = {};
  for (int64_t k0 = 0; k0 < w.cols; k0 += kTile) {
    for (int j = ty; j < kTile; j += kTileRows) {
      const int64_t k = k0 + tx;
      xs[j][tx] = (row0 + j < m && k < w.cols) ? LoadX(x32, x16, (row0 + j) * w.cols + k) : 0.f;
      ws[j][tx] = (n0 + j < w.rows && k < w.cols) ? dev::Fp8At(w, n0 + j, k) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile / kTileRows; ++j) {
      float s = 0.f;
      for (int k = 0; k < kTile; ++k) s += xs[ty + kTileRows * j][k] * ws[tx][k];
      acc[j] += s;
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kTile / kTileRows; ++j) {
    const int64_t r = row0 + ty + kTileRows * j, n = n0 + tx;
    if (r < m && n < w.rows) y[r * y_ld + n] = acc[j];
  }
}

// Block (n, e): output column n of routed expert e for every row the expert received
// (rows [offsets[e], offsets[e + 1]) of `in`, sorted by expert), kFp8GemvMaxRows rows per pass
// over the weight row. Expert e's codes and scales follow expert 0's (`w`) at e times their
// sizes. Blocks of experts without rows exit at once, so the grid covers every expert without
// the host knowing which are active (graph-capturable, like moe.cu's ExpertGemvKernel).
__global__ void __launch_bounds__(kGemvThreads)
    Fp8ExpertGemvKernel(const uint16_t* __restrict__ in, const int32_t* __restrict__ offsets,
                        Fp8DeviceMatrix w, float* __restrict__ out, int64_t out_ld) {
  __shared__ float scratch[32];
  const int64_t e = blockIdx.y, n = blockIdx.x;
  const int begin = offsets[e], end = offsets[e + 1];
  if (begin >= end) return;  // the whole block: no barrier is left waiting
  const int64_t scale_rows = (w.rows + w.block_rows - 1) / w.block_rows;
  const int64_t scale_cols = (w.cols + w.block_cols - 1) / w.block_cols;
  w.codes += e * w.rows * w.cols;
  w.scales += e * scale_rows * scale_cols;
  for (int t0 = begin; t0 < end; t0 += static_cast<int>(kFp8GemvMaxRows)) {
    const int nt = min(static_cast<int>(kFp8GemvMaxRows), end - t0);
    float acc[kFp8GemvMaxRows] = {};
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) {
      const float wv = dev::Fp8At(w, n, c);
#pragma unroll
      for (int i = 0; i < kFp8GemvMaxRows; ++i) {
        if (i < nt) acc[i] += dev::Bf16ToFloat(in[(t0 + i) * w.cols + c]) * wv;
      }
    }
    for (int i = 0; i < nt; ++i) {
      const float s = dev::BlockSum(acc[i], scratch);
      if (threadIdx.x == 0) out[(t0 + i) * out_ld + n] = s;
    }
  }
}

// RandomWeights' generator (core/model/checkpoint.cc: splitmix64 output, Irwin-Hall sum of four
// 16-bit fields), element by element: the device fills a preset's FP8 matrices itself.
__global__ void RandomFp8Kernel(uint8_t* __restrict__ codes, int64_t n, uint64_t key,
                                float value_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = key + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const int64_t sum = static_cast<int64_t>((z & 0xffff) + ((z >> 16) & 0xffff) +
                                             ((z >> 32) & 0xffff) + (z >> 48));
    codes[i] = dev::FloatToE4m3(static_cast<float>(sum - 2 * 65535) * value_scale);
  }
}

}  // namespace

cudaError_t LaunchRandomFp8(uint8_t* codes, int64_t n, uint64_t key, float value_scale,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  RandomFp8Kernel<<<GridStrideBlocks(n, 256), 256, 0, stream>>>(codes, n, key, value_scale);
  return cudaGetLastError();
}

namespace {

cudaError_t Fp8Linear(const float* x32, const uint16_t* x16, int64_t m, const Fp8DeviceMatrix& w,
                      float* y, int64_t y_ld, cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return cudaSuccess;
  if (y_ld < w.rows || w.block_rows <= 0 || w.block_cols <= 0) return cudaErrorInvalidValue;
  if (m <= kFp8GemvMaxRows) {
    Fp8GemvKernel<<<static_cast<unsigned>(w.rows), kGemvThreads, 0, stream>>>(x32, x16, m, w, y,
                                                                              y_ld);
  } else {
    const dim3 grid(static_cast<unsigned>((w.rows + kTile - 1) / kTile),
                    static_cast<unsigned>((m + kTile - 1) / kTile));
    Fp8GemmKernel<<<grid, kTile * kTileRows, 0, stream>>>(x32, x16, m, w, y, y_ld);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFp8Linear(const float* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                            cudaStream_t stream) {
  return Fp8Linear(x, nullptr, m, w, y, w.rows, stream);
}

cudaError_t LaunchFp8LinearBf16(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                                int64_t y_ld, cudaStream_t stream) {
  return Fp8Linear(nullptr, x, m, w, y, y_ld, stream);
}

cudaError_t LaunchFp8ExpertGemv(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                const int32_t* offsets, const uint16_t* in, float* out,
                                int64_t out_ld, cudaStream_t stream) {
  if (expert0.rows <= 0 || expert0.cols <= 0 || n_experts <= 0) return cudaSuccess;
  if (n_experts > 65535 || out_ld < expert0.rows || expert0.block_rows <= 0 ||
      expert0.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(expert0.rows), static_cast<unsigned>(n_experts));
  Fp8ExpertGemvKernel<<<grid, kGemvThreads, 0, stream>>>(in, offsets, expert0, out, out_ld);
  return cudaGetLastError();
}

cudaError_t LaunchFp8Experts(const float* x, const int64_t* row_offsets,
                             const Fp8DeviceMatrix* experts, int64_t num_experts, float* y,
                             cudaStream_t stream) {
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = row_offsets[e], rows = row_offsets[e + 1] - begin;
    if (rows <= 0) continue;
    const cudaError_t err = LaunchFp8Linear(x + begin * experts[e].cols, rows, experts[e],
                                            y + begin * experts[e].rows, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace glmserve::cuda
