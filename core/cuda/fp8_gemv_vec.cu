// The FP8 decode GEMV with vectorised loads (docs/cuda.md "FP8 decode GEMV"): the same results
// as fp8_linear.cu's GEMVs (one read of each weight byte per step, up to kFp8GemvMaxRows
// activation rows), reading the weights 16 bytes per lane per load instead of one:
//
//   block = 4 warps; warp w owns kRowsPerWarp output rows (independent loads in flight);
//   lane l reads codes [row, c0 + 16 l, +16) as one uint4 and the 16 matching bf16 activations
//   of each activation row as two uint4, c0 stepping by 512;
//   the scale is applied once per row (per-channel form) or once per 16-code chunk, which
//   lies inside one 128-wide block (block form); warp sums, lane 0 writes.
//
// The quantized-activation form (LaunchFp8GemvVecQ / LaunchFp8ExpertGemvVecQ, tensor cores on):
// the activations arrive as e4m3 codes with one scale per token and 1x128 group (fp8_quant.cu's
// quantizer, the one the tensor-core prefill GEMM uses). A lane's 16-code chunk lies inside one
// group (16 divides 128), so its partial dot product is multiplied by that group's scale, as
// the block-scaled GEMM scales each group's sum; per-channel weights take their row scale at the
// end (the GEMM's epilogue), 128x128 blocks theirs per chunk: prefill and decode then differ
// only by the fp32 summation order.
//
// Needs cols % 16 == 0, block_cols % 16 == 0 (or one block per row) and 16-byte aligned
// codes and activations; the launchers report cudaErrorNotSupported otherwise, and the caller
// keeps the byte-wise kernels.
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kVecThreads = 128;
constexpr int kVecWarps = kVecThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kVecWarps * kRowsPerWarp;

// 16 activations of a row from x + offset: bf16 (two 16-byte loads) or e4m3 codes (one).
__device__ __forceinline__ void LoadX16(const uint16_t* __restrict__ x, float (&xv)[16]) {
  const uint4* xp = reinterpret_cast<const uint4*>(x);
  dev::Unpack8(xp[0], xv);
  dev::Unpack8(xp[1], xv + 8);
}
__device__ __forceinline__ void LoadX16(const uint8_t* __restrict__ x, float (&xv)[16]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(x);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    xv[b] = dev::E4m3ToFloat(static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4))));
  }
}

// acc[j][i] += (row0 + j) . x_i over this lane's chunks; the weight scale folded in per chunk
// only for the block form (per_channel: the caller multiplies once at the end). XT: uint16_t
// (bf16 activations, x_scales null) or uint8_t (e4m3 codes; row i's group g scale at
// x_scales[g * scale_ld + i], applied to the chunk's partial sum).
template <typename XT>
__device__ __forceinline__ void RowsDot(const Fp8DeviceMatrix& w, int64_t row0, int64_t rows,
                                        const XT* __restrict__ x,
                                        const float* __restrict__ x_scales, int64_t scale_ld,
                                        int nx, bool per_channel,
                                        float (&acc)[kRowsPerWarp][kFp8GemvMaxRows]) {
  const int lane = threadIdx.x & 31;
  const int64_t scale_cols = (w.cols + w.block_cols - 1) / w.block_cols;
  for (int64_t c0 = static_cast<int64_t>(lane) * 16; c0 < w.cols; c0 += 32 * 16) {
    float wv[kRowsPerWarp][16];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      uint4 raw{0, 0, 0, 0};
      if (row0 + j < rows)
        raw = *reinterpret_cast<const uint4*>(w.codes + (row0 + j) * w.cols + c0);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      const float s = per_channel || row0 + j >= rows
                          ? 1.f
                          : w.scales[((row0 + j) / w.block_rows) * scale_cols + c0 / w.block_cols];
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        wv[j][b] = dev::E4m3ToFloat(static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)))) * s;
      }
    }
#pragma unroll
    for (int i = 0; i < kFp8GemvMaxRows; ++i) {
      if (i >= nx) break;
      float xv[16];
      LoadX16(x + i * w.cols + c0, xv);
      const float xs = x_scales != nullptr ? x_scales[(c0 / kFp8ActGroup) * scale_ld + i] : 1.f;
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        float d = 0.f;
#pragma unroll
        for (int b = 0; b < 16; ++b) d += wv[j][b] * xv[b];
        acc[j][i] += x_scales != nullptr ? d * xs : d;
      }
    }
  }
}

// Warp sums of acc, written by lane 0 (times the row's scale in the per-channel form).
__device__ __forceinline__ void WriteRows(const Fp8DeviceMatrix& w, int64_t row0, int nx,
                                          bool per_channel,
                                          float (&acc)[kRowsPerWarp][kFp8GemvMaxRows],
                                          float* __restrict__ y, int64_t y_ld) {
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
#pragma unroll
    for (int i = 0; i < kFp8GemvMaxRows; ++i) {
      if (i >= nx) break;
      const float s = dev::WarpSum(acc[j][i]);
      if ((threadIdx.x & 31) == 0 && row0 + j < w.rows) {
        const float ws = per_channel ? w.scales[row0 + j] : 1.f;
        y[i * y_ld + row0 + j] = s * ws;
      }
    }
  }
}

template <typename XT>
__global__ void __launch_bounds__(kVecThreads)
    Fp8GemvVecKernel(const XT* __restrict__ x, const float* __restrict__ x_scales, int64_t scale_ld,
                     int m, Fp8DeviceMatrix w, float* __restrict__ y, int64_t y_ld) {
  const bool per_channel = w.block_rows == 1 && w.block_cols >= w.cols;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x) * kVecWarps + (threadIdx.x >> 5)) * kRowsPerWarp;
  float acc[kRowsPerWarp][kFp8GemvMaxRows] = {};
  RowsDot(w, row0, w.rows, x, x_scales, scale_ld, m, per_channel, acc);
  WriteRows(w, row0, m, per_channel, acc, y, y_ld);
}

// Block (row group, e): expert e's rows [offsets[e], offsets[e + 1]) of `in`, in passes of
// kFp8GemvMaxRows; experts without rows exit at once (graph-capturable, no host offsets).
template <typename XT>
__global__ void __launch_bounds__(kVecThreads)
    Fp8ExpertGemvVecKernel(const XT* __restrict__ in, const float* __restrict__ in_scales,
                           int64_t scale_ld, const int32_t* __restrict__ offsets, Fp8DeviceMatrix w,
                           float* __restrict__ out, int64_t out_ld) {
  const int64_t e = blockIdx.y;
  const int begin = offsets[e], end = offsets[e + 1];
  if (begin >= end) return;
  const int64_t scale_rows = (w.rows + w.block_rows - 1) / w.block_rows;
  const int64_t scale_cols = (w.cols + w.block_cols - 1) / w.block_cols;
  w.codes += e * w.rows * w.cols;
  w.scales += e * scale_rows * scale_cols;
  const bool per_channel = w.block_rows == 1 && w.block_cols >= w.cols;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x) * kVecWarps + (threadIdx.x >> 5)) * kRowsPerWarp;
  for (int t0 = begin; t0 < end; t0 += static_cast<int>(kFp8GemvMaxRows)) {
    const int nt = min(static_cast<int>(kFp8GemvMaxRows), end - t0);
    float acc[kRowsPerWarp][kFp8GemvMaxRows] = {};
    RowsDot(w, row0, w.rows, in + static_cast<int64_t>(t0) * w.cols,
            in_scales != nullptr ? in_scales + t0 : nullptr, scale_ld, nt, per_channel, acc);
    WriteRows(w, row0, nt, per_channel, acc, out + static_cast<int64_t>(t0) * out_ld, out_ld);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool PerChannel(const Fp8DeviceMatrix& w) { return w.block_rows == 1 && w.block_cols >= w.cols; }

bool VecOk(const Fp8DeviceMatrix& w, const void* x) {
  return w.cols > 0 && w.cols % 16 == 0 && (PerChannel(w) || w.block_cols % 16 == 0) &&
         Aligned16(w.codes) && Aligned16(x);
}

template <typename XT>
cudaError_t GemvVec(const XT* x, const float* x_scales, int64_t scale_ld, int64_t m,
                    const Fp8DeviceMatrix& w, float* y, int64_t y_ld, cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return cudaSuccess;
  if (m > kFp8GemvMaxRows || y_ld < w.rows || w.block_rows <= 0 || w.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  if (!VecOk(w, x)) return cudaErrorNotSupported;
  if (x_scales != nullptr && scale_ld < m) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  // Through a pointer: the launch syntax takes a plain name (the emulation rewrites it).
  void (*kernel)(const XT*, const float*, int64_t, int, Fp8DeviceMatrix, float*, int64_t) =
      Fp8GemvVecKernel<XT>;
  kernel<<<blocks, kVecThreads, 0, stream>>>(x, x_scales, scale_ld, static_cast<int>(m), w, y,
                                             y_ld);
  return cudaGetLastError();
}

template <typename XT>
cudaError_t ExpertGemvVec(const Fp8DeviceMatrix& expert0, int64_t n_experts, const int32_t* offsets,
                          const XT* in, const float* in_scales, int64_t scale_ld, float* out,
                          int64_t out_ld, cudaStream_t stream) {
  if (expert0.rows <= 0 || expert0.cols <= 0 || n_experts <= 0) return cudaSuccess;
  if (n_experts > 65535 || out_ld < expert0.rows || expert0.block_rows <= 0 ||
      expert0.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  // Every expert's codes start at e * rows * cols: aligned when expert 0's are and cols % 16.
  if (!VecOk(expert0, in)) return cudaErrorNotSupported;
  const dim3 grid(static_cast<unsigned>((expert0.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(n_experts));
  void (*kernel)(const XT*, const float*, int64_t, const int32_t*, Fp8DeviceMatrix, float*,
                 int64_t) = Fp8ExpertGemvVecKernel<XT>;
  kernel<<<grid, kVecThreads, 0, stream>>>(in, in_scales, scale_ld, offsets, expert0, out, out_ld);
  return cudaGetLastError();
}

}  // namespace

bool Fp8GemvVecSupported(const Fp8DeviceMatrix& w, const uint16_t* x) { return VecOk(w, x); }

bool Fp8GemvVecQSupported(const Fp8DeviceMatrix& w) {
  // The codes scratch rows start at multiples of cols (% 16) from a 256-byte-aligned base.
  return VecOk(w, w.codes);
}

cudaError_t LaunchFp8GemvVec(const uint16_t* x, int64_t m, const Fp8DeviceMatrix& w, float* y,
                             int64_t y_ld, cudaStream_t stream) {
  return GemvVec(x, nullptr, 0, m, w, y, y_ld, stream);
}

cudaError_t LaunchFp8GemvVecQ(const uint8_t* x_codes, const float* x_scales, int64_t scale_ld,
                              int64_t m, const Fp8DeviceMatrix& w, float* y, int64_t y_ld,
                              cudaStream_t stream) {
  if (x_scales == nullptr) return cudaErrorInvalidValue;
  return GemvVec(x_codes, x_scales, scale_ld, m, w, y, y_ld, stream);
}

cudaError_t LaunchFp8ExpertGemvVec(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                   const int32_t* offsets, const uint16_t* in, float* out,
                                   int64_t out_ld, cudaStream_t stream) {
  return ExpertGemvVec(expert0, n_experts, offsets, in, nullptr, 0, out, out_ld, stream);
}

cudaError_t LaunchFp8ExpertGemvVecQ(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                    const int32_t* offsets, const uint8_t* in_codes,
                                    const float* in_scales, int64_t scale_ld, float* out,
                                    int64_t out_ld, cudaStream_t stream) {
  // scale_ld: every routed pair's row (offsets[n_experts] of them) is a column of the scales.
  if (in_scales == nullptr || scale_ld <= 0) return cudaErrorInvalidValue;
  return ExpertGemvVec(expert0, n_experts, offsets, in_codes, in_scales, scale_ld, out, out_ld,
                       stream);
}

}  // namespace glmserve::cuda
