// The routed experts' GEMMs for large steps on tensor cores, driven by the device-side
// grouping (moe.cu's LaunchMoeSort offsets): no per-expert row counts cross to the host, so a
// MoE layer of any size enqueues without a cudaStreamSynchronize and can be captured in a
// CUDA graph (docs/cuda.md, "MoE without a host round trip").
//
// Rows are grouped by expert; the output rows of expert e are [offsets[e], offsets[e + 1]).
// The grid covers every 64-row tile of every expert without knowing the counts: its y extent
// is ceil(pairs / 64) + n_experts (each expert adds at most one partial tile), and block y
// finds its expert and tile by walking the offsets; blocks past the last tile return. Each
// block computes a 64 x 64 tile of out = in . W_e^T on WMMA bf16 16x16x16 fragments with fp32
// accumulation, K in steps of 32 staged through shared memory (4 warps, a 32 x 32 quarter
// each). A row's result depends only on its own input row and its expert (ascending k),
// never on the other rows of the step.
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>

#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 128;  // 4 warps
constexpr int kM = 16;         // WMMA tile side
constexpr int kBM = 64;        // rows (token, expert pairs) per block
constexpr int kBN = 64;        // output columns per block
constexpr int kBK = 32;        // K per shared-memory stage
constexpr size_t kSmemAlign = 32;

using FragA = wmma::fragment<wmma::matrix_a, kM, kM, kM, __nv_bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kM, kM, kM, __nv_bfloat16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kM, kM, kM, float>;

// a [64, 32] bf16, w [64, 32] bf16 (weight rows: B = W^T read column-major), c [64, 64] fp32.
constexpr size_t kSmemBytes = kBM * kBK * 2 + kBN * kBK * 2 + kBM * kBN * 4 + kSmemAlign;

__global__ void __launch_bounds__(kThreads)
    ExpertGemmTcKernel(const uint16_t* __restrict__ w, int64_t n, int64_t k, int n_experts,
                       const int32_t* __restrict__ offsets, const uint16_t* __restrict__ in,
                       float* __restrict__ out) {
  extern __shared__ float smem_raw[];
  __shared__ int tile_info[3];  // expert, first row, rows in this tile (0: no tile)
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) &
                                       ~(uintptr_t{kSmemAlign} - 1));
  uint16_t* a_s = reinterpret_cast<uint16_t*>(base);       // [64, 32]
  uint16_t* w_s = a_s + kBM * kBK;                         // [64, 32]
  float* c_s = reinterpret_cast<float*>(w_s + kBN * kBK);  // [64, 64]
  const auto* a_b = reinterpret_cast<const __nv_bfloat16*>(a_s);
  const auto* w_b = reinterpret_cast<const __nv_bfloat16*>(w_s);

  if (threadIdx.x == 0) {
    // Expert e owns global row tiles [tiles before e, + ceil(rows_e / 64)).
    int64_t target = blockIdx.y, before = 0;
    tile_info[0] = -1;
    tile_info[2] = 0;
    for (int e = 0; e < n_experts; ++e) {
      const int begin = offsets[e], rows = offsets[e + 1] - begin;
      const int64_t tiles = (rows + kBM - 1) / kBM;
      if (target < before + tiles) {
        const int first = begin + static_cast<int>((target - before) * kBM);
        tile_info[0] = e;
        tile_info[1] = first;
        tile_info[2] = min(kBM, offsets[e + 1] - first);
        break;
      }
      before += tiles;
    }
  }
  __syncthreads();
  const int expert = tile_info[0], row0 = tile_info[1], rows = tile_info[2];
  if (rows == 0) return;  // past the last tile: the whole block
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const uint16_t* we = w + static_cast<int64_t>(expert) * n * k;
  const int warp = threadIdx.x >> 5;
  const int wr = warp / 2, wc = warp % 2;  // this warp's 32 x 32 quarter

  FragAcc acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    __syncthreads();  // the previous stage's readers are done
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {
      const int r = i / kBK, kk = i % kBK;
      const int64_t col = k0 + kk;
      a_s[i] = r < rows && col < k ? in[static_cast<int64_t>(row0 + r) * k + col] : 0;
      w_s[i] = n0 + r < n && col < k ? we[(n0 + r) * k + col] : 0;
    }
    __syncthreads();
    for (int step = 0; step < kBK / kM; ++step) {
      FragA a[2];
      FragBCol b[2];
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a[i], a_b + (wr * 32 + i * kM) * kBK + step * kM, kBK);
        wmma::load_matrix_sync(b[i], w_b + (wc * 32 + i * kM) * kBK + step * kM, kBK);
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(c_s + (wr * 32 + i * kM) * kBN + wc * 32 + j * kM, acc[i][j], kBN,
                              wmma::mem_row_major);
    }
  __syncthreads();
  for (int i = threadIdx.x; i < kBM * kBN; i += kThreads) {
    const int r = i / kBN, c = i % kBN;
    if (r < rows && n0 + c < n) out[static_cast<int64_t>(row0 + r) * n + n0 + c] = c_s[i];
  }
}

}  // namespace

cudaError_t LaunchExpertGemmTc(const uint16_t* w, int64_t n, int64_t k, int64_t n_experts,
                               const int32_t* offsets, int64_t pairs, const uint16_t* in,
                               float* out, cudaStream_t stream) {
  if (n <= 0 || k <= 0 || n_experts <= 0 || pairs <= 0) return cudaSuccess;
  const int64_t row_tiles = (pairs + kBM - 1) / kBM + n_experts;
  const int64_t col_tiles = (n + kBN - 1) / kBN;
  if (row_tiles > 65535 || col_tiles > 2147483647 || n_experts > 2147483647) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  ExpertGemmTcKernel<<<grid, kThreads, kSmemBytes, stream>>>(w, n, k, static_cast<int>(n_experts),
                                                             offsets, in, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
