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
#include "core/cuda/moe_tile.cuh"

namespace glmserve::cuda {
namespace {

// The shared tiling (moe_tile.cuh).
namespace wmma = nvcuda::wmma;
using moe_tile::CarveSmem;
using moe_tile::FindTile;
using moe_tile::FragA;
using moe_tile::FragAcc;
using moe_tile::FragBCol;
using moe_tile::kBK;
using moe_tile::kBM;
using moe_tile::kBN;
using moe_tile::kM;
using moe_tile::kSmemBytes;
using moe_tile::kThreads;
using moe_tile::Smem;

__global__ void __launch_bounds__(kThreads)
    ExpertGemmTcKernel(const uint16_t* __restrict__ w, int64_t n, int64_t k, int n_experts,
                       const int32_t* __restrict__ offsets, const uint16_t* __restrict__ in,
                       float* __restrict__ out) {
  extern __shared__ float smem_raw[];
  __shared__ int tile_info[3];  // expert, first row, rows in this tile (0: no tile)
  const Smem smem = CarveSmem(smem_raw);
  uint16_t* a_s = smem.a;  // [64, 32]
  uint16_t* w_s = smem.w;  // [64, 32]
  float* c_s = smem.c;     // [64, 64]
  const auto* a_b = reinterpret_cast<const __nv_bfloat16*>(a_s);
  const auto* w_b = reinterpret_cast<const __nv_bfloat16*>(w_s);

  FindTile(n_experts, offsets, tile_info);
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
