// What the grouped expert GEMMs on tensor cores share (moe_gemm_tc.cu for bf16 experts,
// fp8_moe_gemm_tc.cu for FP8 ones): the tiling, the shared-memory layout and how a block finds
// its tile from the device-side expert offsets (moe.cu's LaunchMoeSort) without the host.
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

#include <cstddef>
#include <cstdint>

namespace glmserve::cuda::moe_tile {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 128;  // 4 warps, each a 32 x 32 quarter of the output tile
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

// The dynamic shared memory carved as kSmemBytes describes.
struct Smem {
  uint16_t* a;  // [64, 32]
  uint16_t* w;  // [64, 32]
  float* c;     // [64, 64]
};
__device__ __forceinline__ Smem CarveSmem(float* smem_raw) {
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) &
                                       ~(uintptr_t{kSmemAlign} - 1));
  Smem s;
  s.a = reinterpret_cast<uint16_t*>(base);
  s.w = s.a + kBM * kBK;
  s.c = reinterpret_cast<float*>(s.w + kBN * kBK);
  return s;
}

// Block y's row tile into tile_info (expert, first row, rows; rows 0 past the last tile):
// expert e owns global row tiles [tiles before e, + ceil(rows_e / 64)). Ends synchronised.
__device__ __forceinline__ void FindTile(int n_experts, const int32_t* __restrict__ offsets,
                                         int* tile_info) {
  if (threadIdx.x == 0) {
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
}

}  // namespace glmserve::cuda::moe_tile
