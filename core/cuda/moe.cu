// The mixture-of-experts pieces: router rows, grouping (token, k) pairs by expert, gathering
// their inputs, the device-driven expert GEMV for small batches, and the weighted combine.
// The large-batch expert GEMMs go through cuBLAS (core/cuda/layers.cc).
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

// ---- router ---------------------------------------------------------------------------
// One thread per token; its s and c rows live in dynamic shared memory (2 * n_experts floats
// per thread) rather than in per-thread local arrays sized for the largest expert count.
__global__ void RouterKernel(const float* __restrict__ logits, int64_t tokens,
                             const float* __restrict__ bias, rowmath::RouterRowParams p,
                             int32_t* __restrict__ experts, float* __restrict__ weights) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  float* s = smem + threadIdx.x * 2 * p.n_experts;
  float* c = s + p.n_experts;
  rowmath::RouteRow(logits + t * p.n_experts, bias, p, s, c, experts + t * p.top_k,
                    weights + t * p.top_k);
}

// ---- grouping by expert ---------------------------------------------------------------
constexpr int kSortThreads = rowmath::kMaxExperts;  // one thread owns one expert
constexpr int kSortTile = 4096;

// One block. Counts per expert (shared atomics: the counts do not depend on their order),
// an exclusive scan, then each expert's thread walks all pairs in order and places its own:
// a stable order that is the same on every run.
__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const int32_t* __restrict__ experts, int64_t pairs, int n_experts,
                  int32_t* __restrict__ offsets, int32_t* __restrict__ sorted,
                  int32_t* __restrict__ pair_pos) {
  __shared__ int counts[rowmath::kMaxExperts];
  __shared__ int32_t tile_ids[kSortTile];
  const int tid = threadIdx.x;
  if (tid < n_experts) counts[tid] = 0;
  __syncthreads();
  for (int64_t i = tid; i < pairs; i += blockDim.x) {
    const int e = experts[i];
    if (e >= 0 && e < n_experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int e = 0; e < n_experts; ++e) {
      const int count = counts[e];
      counts[e] = run;
      offsets[e] = run;
      run += count;
    }
    offsets[n_experts] = run;
  }
  __syncthreads();
  int next = tid < n_experts ? counts[tid] : 0;
  for (int64_t base = 0; base < pairs; base += kSortTile) {
    const int len = static_cast<int>(pairs - base < kSortTile ? pairs - base : kSortTile);
    __syncthreads();  // the previous tile is no longer read
    for (int i = tid; i < len; i += blockDim.x) tile_ids[i] = experts[base + i];
    __syncthreads();
    if (tid < n_experts) {
      for (int i = 0; i < len; ++i) {
        if (tile_ids[i] == tid) {
          sorted[next] = static_cast<int32_t>(base + i);
          pair_pos[base + i] = next;
          ++next;
        }
      }
    }
  }
}

__global__ void GatherRowsKernel(const uint16_t* __restrict__ x, int64_t width,
                                 const int32_t* __restrict__ sorted, int64_t top_k,
                                 uint16_t* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t src = sorted[i] / top_k;
  if (width % 8 == 0) {  // 16-byte rows: vector copies
    const uint4* s = reinterpret_cast<const uint4*>(x + src * width);
    uint4* d = reinterpret_cast<uint4*>(out + i * width);
    for (int64_t c = threadIdx.x; c < width / 8; c += blockDim.x) d[c] = s[c];
  } else {
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
      out[i * width + c] = x[src * width + c];
  }
}

// ---- expert GEMV ----------------------------------------------------------------------
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kRowsPerWarp = 4;
constexpr int kTokensPerPass = 8;
constexpr int kRowsPerBlock = kGemvWarps * kRowsPerWarp;

// Block (x, e): weight rows [x * 32, x * 32 + 32) of expert e against every row the expert
// received, 8 at a time. Each warp owns 4 weight rows; lanes stride over k with 16-byte
// loads. Blocks of experts without rows exit at once, so the grid can cover all experts
// without knowing on the host which ones are active.
__global__ void __launch_bounds__(kGemvThreads)
    ExpertGemvKernel(const uint16_t* __restrict__ w, int64_t n, int64_t k,
                     const int32_t* __restrict__ offsets, const uint16_t* __restrict__ in,
                     float* __restrict__ out) {
  const int e = blockIdx.y;
  const int begin = offsets[e], end = offsets[e + 1];
  if (begin >= end) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  if (n0 >= n) return;  // whole warps only: no block-level synchronisation below
  const uint16_t* we = w + static_cast<int64_t>(e) * n * k;
  const bool vector_path = k % 8 == 0;

  for (int t0 = begin; t0 < end; t0 += kTokensPerPass) {
    const int nt = min(kTokensPerPass, end - t0);
    float acc[kRowsPerWarp][kTokensPerPass];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int t = 0; t < kTokensPerPass; ++t) acc[r][t] = 0.f;

    if (vector_path) {
      for (int64_t kk = lane * 8; kk < k; kk += 32 * 8) {
        float wv[kRowsPerWarp][8];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          if (n0 + r < n) {
            dev::Unpack8(*reinterpret_cast<const uint4*>(we + (n0 + r) * k + kk), wv[r]);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) wv[r][i] = 0.f;
          }
        }
#pragma unroll
        for (int t = 0; t < kTokensPerPass; ++t) {
          if (t < nt) {
            float xv[8];
            dev::Unpack8(
                *reinterpret_cast<const uint4*>(in + static_cast<int64_t>(t0 + t) * k + kk), xv);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[r][t] += wv[r][i] * xv[i];
          }
        }
      }
    } else {
      for (int64_t kk = lane; kk < k; kk += 32) {
        float wv[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          wv[r] = n0 + r < n ? dev::Bf16ToFloat(we[(n0 + r) * k + kk]) : 0.f;
        }
#pragma unroll
        for (int t = 0; t < kTokensPerPass; ++t) {
          if (t < nt) {
            const float xv = dev::Bf16ToFloat(in[static_cast<int64_t>(t0 + t) * k + kk]);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] += wv[r] * xv;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int t = 0; t < kTokensPerPass; ++t) {
        const float v = dev::WarpSum(acc[r][t]);
        if (lane == 0 && t < nt && n0 + r < n) out[static_cast<int64_t>(t0 + t) * n + n0 + r] = v;
      }
    }
  }
}

// ---- combine --------------------------------------------------------------------------
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* __restrict__ expert_out, const int32_t* __restrict__ pair_pos,
                     const int32_t* __restrict__ experts, const float* __restrict__ weights,
                     int top_k, int64_t width, bool accumulate, int expert_begin,
                     int expert_end, float* __restrict__ out) {
  __shared__ int32_t pos[rowmath::kMaxTopK];
  __shared__ float wt[rowmath::kMaxTopK];
  __shared__ int terms;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    // The token's k terms ordered by expert id (insertion sort of <= 32 entries), so that the
    // fp32 sum runs in the CPU backend's order; experts this rank does not hold are left out.
    int32_t ids[rowmath::kMaxTopK];
    int n = 0;
    for (int k = 0; k < top_k; ++k) {
      const int32_t id = experts[t * top_k + k];
      if (id < expert_begin || id >= expert_end) continue;
      const int32_t ps = pair_pos[t * top_k + k];
      const float wk = weights[t * top_k + k];
      int j = n++;
      while (j > 0 && ids[j - 1] > id) {
        ids[j] = ids[j - 1];
        pos[j] = pos[j - 1];
        wt[j] = wt[j - 1];
        --j;
      }
      ids[j] = id;
      pos[j] = ps;
      wt[j] = wk;
    }
    terms = n;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    float sum = 0.f;
    for (int k = 0; k < terms; ++k)
      sum += expert_out[static_cast<int64_t>(pos[k]) * width + d] * wt[k];
    float* o = out + t * width + d;
    *o = accumulate ? sum + *o : sum;
  }
}

}  // namespace

cudaError_t LaunchRouter(const float* logits, int64_t tokens, const float* bias,
                         const rowmath::RouterRowParams& params, int32_t* experts, float* weights,
                         cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (params.n_experts <= 0 || params.n_experts > rowmath::kMaxExperts || params.top_k <= 0 ||
      params.top_k > rowmath::kMaxTopK || params.top_k > params.n_experts || params.n_group <= 0 ||
      params.n_group > rowmath::kMaxGroups || params.n_experts % params.n_group != 0) {
    return cudaErrorInvalidValue;
  }
  // 2 * n_experts floats per thread within 32 KiB of shared memory.
  const int per_thread = 2 * params.n_experts * static_cast<int>(sizeof(float));
  int threads = (32 * 1024) / per_thread;
  threads = threads >= 64 ? 64 : (threads < 1 ? 1 : threads);
  const unsigned blocks = static_cast<unsigned>((tokens + threads - 1) / threads);
  RouterKernel<<<blocks, threads, static_cast<size_t>(threads) * per_thread, stream>>>(
      logits, tokens, bias, params, experts, weights);
  return cudaGetLastError();
}

cudaError_t LaunchMoeSort(const int32_t* experts, int64_t pairs, int64_t n_experts,
                          int32_t* offsets, int32_t* sorted, int32_t* pair_pos,
                          cudaStream_t stream) {
  if (n_experts <= 0 || n_experts > rowmath::kMaxExperts) return cudaErrorInvalidValue;
  MoeSortKernel<<<1, kSortThreads, 0, stream>>>(experts, pairs, static_cast<int>(n_experts),
                                                offsets, sorted, pair_pos);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const uint16_t* x, int64_t width, const int32_t* sorted, int64_t pairs,
                             int64_t top_k, uint16_t* out, cudaStream_t stream) {
  if (pairs <= 0) return cudaSuccess;
  GatherRowsKernel<<<static_cast<unsigned>(pairs), 128, 0, stream>>>(x, width, sorted, top_k, out);
  return cudaGetLastError();
}

cudaError_t LaunchExpertGemv(const uint16_t* w, int64_t n, int64_t k, int64_t n_experts,
                             const int32_t* offsets, const uint16_t* in, float* out,
                             cudaStream_t stream) {
  if (n <= 0 || k <= 0 || n_experts <= 0) return cudaSuccess;
  if (n_experts > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(n_experts));
  ExpertGemvKernel<<<grid, kGemvThreads, 0, stream>>>(w, n, k, offsets, in, out);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* expert_out, const int32_t* pair_pos,
                             const int32_t* experts, const float* weights, int64_t tokens,
                             int64_t top_k, int64_t width, bool accumulate, float* out,
                             cudaStream_t stream, int expert_begin, int expert_end) {
  if (tokens <= 0) return cudaSuccess;
  if (top_k <= 0 || top_k > rowmath::kMaxTopK) return cudaErrorInvalidValue;
  MoeCombineKernel<<<static_cast<unsigned>(tokens), kCombineThreads, 0, stream>>>(
      expert_out, pair_pos, experts, weights, static_cast<int>(top_k), width, accumulate,
      expert_begin, expert_end, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
