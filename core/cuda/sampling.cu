// Row scans for sampling on the device: each row's argmax, and each row's k largest values,
// with exactly the CPU sampler's semantics (core/engine/sampler_scan.h: NaN read as -inf, ties to
// the lower id, float compares), so that the host can finish a draw from a few candidates
// per sequence instead of the whole 151552-wide row.
//
// One block per row. RowTopK finds the k-th largest by a radix select over an order-
// preserving 32-bit key of the value (four 8-bit passes, a 256-bin shared histogram each),
// then writes the winners in ascending id order: every value above the threshold key, and
// of the values equal to it the lowest ids. Only __syncthreads and shared-memory atomics: no
// warp intrinsics, so the kernels also run under tools/cuda_emu.
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float NanToNegInf(float x) {
  return x != x ? __uint_as_float(0xff800000u) : x;
}

__device__ __forceinline__ bool IsFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// finite[blockIdx.x] = whether every thread saw only finite values (`mine`). Reached by every
// thread of the block.
__device__ void WriteRowFinite(bool mine, int* flag, int32_t* finite) {
  if (threadIdx.x == 0) *flag = 1;
  __syncthreads();
  if (!mine) *flag = 0;
  __syncthreads();
  if (threadIdx.x == 0 && finite != nullptr) finite[blockIdx.x] = *flag;
}

// Order-preserving key: a < b as floats (NaN as -inf) iff Key(a) < Key(b); -0 and +0, equal
// as floats, get the same key.
__device__ __forceinline__ uint32_t Key(float x) {
  x = NanToNegInf(x);
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads)
    RowArgMaxKernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ ids,
                    float* __restrict__ values, int32_t* __restrict__ finite) {
  __shared__ float best_value[kThreads];
  __shared__ int32_t best_id[kThreads];
  __shared__ int all_finite;
  bool my_finite = true;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float v = NanToNegInf(row[0]);
  int32_t id = 0;
  // Each thread's ids ascend, so a strictly larger value is the only way to move.
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    my_finite &= IsFinite(row[i]);
    const float x = NanToNegInf(row[i]);
    if (x > v) {
      v = x;
      id = static_cast<int32_t>(i);
    }
  }
  best_value[threadIdx.x] = v;
  best_id[threadIdx.x] = id;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ov = best_value[threadIdx.x + half];
      const int32_t oid = best_id[threadIdx.x + half];
      if (ov > best_value[threadIdx.x] ||
          (ov == best_value[threadIdx.x] && oid < best_id[threadIdx.x])) {
        best_value[threadIdx.x] = ov;
        best_id[threadIdx.x] = oid;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = best_id[0];
    values[blockIdx.x] = best_value[0];
  }
  WriteRowFinite(my_finite, &all_finite, finite);
}

// Exclusive prefix sum of `flag` over the block in thread order (Hillis-Steele in `scan`,
// kThreads ints); returns the thread's prefix and sets *total. Reached by every thread.
__device__ int BlockExclusiveScan(int flag, int* scan, int* total) {
  scan[threadIdx.x] = flag;
  __syncthreads();
  for (int offset = 1; offset < kThreads; offset *= 2) {
    const int add = threadIdx.x >= offset ? scan[threadIdx.x - offset] : 0;
    __syncthreads();
    scan[threadIdx.x] += add;
    __syncthreads();
  }
  *total = scan[kThreads - 1];
  const int inclusive = scan[threadIdx.x];
  __syncthreads();  // scan is reused by the next call
  return inclusive - flag;
}

__global__ void __launch_bounds__(kThreads)
    RowTopKKernel(const float* __restrict__ logits, int64_t vocab, int k,
                  int32_t* __restrict__ out_ids, float* __restrict__ out_values,
                  int32_t* __restrict__ finite) {
  __shared__ int histogram[256];
  __shared__ int all_finite;
  bool my_finite = true;
  __shared__ int scan[kThreads];
  __shared__ uint32_t prefix;
  __shared__ int want;  // of the keys matching `prefix` so far, how many to take
  __shared__ int any;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;

  // Radix select: the threshold key T such that fewer than k keys exceed it and at least k
  // are >= it, and `want`, how many of the keys equal to T are taken.
  if (threadIdx.x == 0) {
    prefix = 0;
    want = k;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (shift == 24) my_finite &= IsFinite(row[i]);
      const uint32_t key = Key(row[i]);
      if ((key & high_mask) == prefix) atomicAdd(&histogram[(key >> shift) & 0xffu], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      int digit = 255;
      for (; digit > 0 && above + histogram[digit] < want; --digit) above += histogram[digit];
      want -= above;
      prefix |= static_cast<uint32_t>(digit) << shift;
    }
    __syncthreads();
  }
  const uint32_t threshold = prefix;
  const int take_equal = want;

  // Winners in ascending id order, tile by tile.
  int written = 0, equal_seen = 0;
  for (int64_t base = 0; base < vocab; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const uint32_t key = i < vocab ? Key(row[i]) : 0u;
    if (threadIdx.x == 0) any = 0;
    __syncthreads();
    if (i < vocab && key >= threshold) any = 1;
    __syncthreads();
    const int tile_has_winner = any;
    __syncthreads();                 // everyone has read `any` before the next tile resets it
    if (!tile_has_winner) continue;  // uniform across the block
    int equal_total = 0, selected_total = 0;
    const int is_equal = i < vocab && key == threshold;
    const int equal_rank = equal_seen + BlockExclusiveScan(is_equal, scan, &equal_total);
    const int selected = i < vocab && (key > threshold || (is_equal && equal_rank < take_equal));
    const int slot = written + BlockExclusiveScan(selected, scan, &selected_total);
    if (selected) {
      out_ids[static_cast<int64_t>(blockIdx.x) * k + slot] = static_cast<int32_t>(i);
      out_values[static_cast<int64_t>(blockIdx.x) * k + slot] = NanToNegInf(row[i]);
    }
    written += selected_total;
    equal_seen += equal_total;
  }
  WriteRowFinite(my_finite, &all_finite, finite);
}

}  // namespace

cudaError_t LaunchRowArgMax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids,
                            float* values, int32_t* finite, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  RowArgMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, ids, values,
                                                                        finite);
  return cudaGetLastError();
}

cudaError_t LaunchRowTopK(const float* logits, int64_t rows, int64_t vocab, int k, int32_t* ids,
                          float* values, int32_t* finite, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  if (k < 1 || k > kMaxDeviceTopK || k > vocab) return cudaErrorInvalidValue;
  RowTopKKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, k, ids, values,
                                                                      finite);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
