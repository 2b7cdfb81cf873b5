// The routed experts' GEMMs of large steps for FP8 experts, on bf16 tensor cores, driven by
// the device-side grouping (moe.cu's LaunchMoeSort offsets): moe_gemm_tc.cu's grouped GEMM
// with e4m3 weights. No per-expert row count crosses to the host, so an FP8 MoE layer of any
// size enqueues without a cudaStreamSynchronize and can be captured in a CUDA graph
// (docs/cuda.md, "MoE without a host round trip").
//
// The grid is ExpertGemmTcKernel's: x covers the 64-column output tiles, y ceil(pairs / 64) +
// n_experts row tiles (each expert adds at most one partial tile); block y finds its expert
// and first row by walking the offsets, blocks past the last tile return. Each block computes
// a 64 x 64 tile of out = in . W_e^T on WMMA bf16 16x16x16 fragments with fp32 accumulation,
// K in steps of 32 staged through shared memory (4 warps, a 32 x 32 quarter each).
//
// Weights: every e4m3 value is a bf16 value (3 mantissa bits, exponents inside bf16's range,
// subnormals included), so the codes are widened to bf16 exactly and each product code x
// activation is exact; the fp32 scale multiplies outside the tensor cores:
//  * scale constant along k (block_cols >= cols: per output channel, block_rows 1): the tile's
//    sums are multiplied by the scale of their output column when written out;
//  * scale blocks of the 128x128 form (generally: block_rows a multiple of 64, block_cols a
//    multiple of 32): a tile's 64 columns start at a multiple of 64, so they lie in one block
//    row, and a K stage lies in one block column; the products of one block column (one K
//    group) are summed in fragments of their own, then scale x that partial sum is added to the
//    running fragments (element-wise: the scale is uniform over the tile). Blocks cut short at
//    the edges are the last group.
// Other block shapes are not supported (cudaErrorNotSupported; the caller keeps the
// per-expert FP8 GEMMs). The CPU's weight is e4m3 x scale rounded once in fp32; here the scale
// is applied to a sum instead, so results agree with the CPU's FP8 path to fp32 rounding and
// summation order. A row's result depends only on its own input row and its expert (K in
// ascending order, fixed groups), never on the other rows of the step.
//
// LaunchFp8ExpertGemmTcQ is the quantized-activation form (FP8 tensor cores on, docs/cuda.md
// "One activation arithmetic"): the rows arrive as e4m3 codes with one scale per row and
// 128-wide group (fp8_quant.cu), also widened exactly to bf16, and each row gets
// LaunchFp8ExpertGemvVecQ's sum_g sA[row, g] x sB[g] x (codes . codes) up to the fp32
// summation order. sA differs per row, so it scales the group's sums after they are staged
// through shared memory (Fp8ExpertGemmTcQKernel).
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>

#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
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

// The scale forms the kernel serves (see the file comment); 0 when neither.
enum ScaleForm : int { kUnsupported = 0, kPerRow = 1, kBlocks = 2 };

ScaleForm FormOf(const Fp8DeviceMatrix& w) {
  if (w.block_rows <= 0 || w.block_cols <= 0) return kUnsupported;
  if (w.block_cols >= w.cols) return kPerRow;
  if (w.block_rows % kBN == 0 && w.block_cols % kBK == 0) return kBlocks;
  return kUnsupported;
}

// The e4m3 code as bf16 bits: exact (fp8_util.cuh's decode, whose fp32 result has at most 4
// significant bits).
__device__ __forceinline__ uint16_t E4m3ToBf16Bits(uint8_t code) {
  return static_cast<uint16_t>(__float_as_uint(dev::E4m3ToFloat(code)) >> 16);
}

// An activation as bf16 bits: bf16 as it is, an e4m3 code widened exactly.
__device__ __forceinline__ uint16_t ActBits(uint16_t v) { return v; }
__device__ __forceinline__ uint16_t ActBits(uint8_t code) { return E4m3ToBf16Bits(code); }

// One K stage [k0, k0 + 32) of the tile: the activations and the widened codes into shared
// memory (zeros past k, past the tile's rows and past n), then acc[i][j] += their products.
// in: bf16 rows (uint16_t) or e4m3 codes (uint8_t), [pairs, k]; we: the expert's codes [n, k];
// a_s, w_s: [64, 32].
template <typename XT>
__device__ __forceinline__ void Stage(const XT* __restrict__ in, int row0, int rows,
                                      const uint8_t* __restrict__ we, int64_t n, int64_t n0,
                                      int64_t k, int64_t k0, uint16_t* a_s, uint16_t* w_s,
                                      FragAcc (&acc)[2][2]) {
  __syncthreads();  // the previous stage's readers are done
  for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {
    const int r = i / kBK, kk = i % kBK;
    const int64_t col = k0 + kk;
    a_s[i] = r < rows && col < k ? ActBits(in[static_cast<int64_t>(row0 + r) * k + col]) : 0;
    w_s[i] = n0 + r < n && col < k ? E4m3ToBf16Bits(we[(n0 + r) * k + col]) : 0;
  }
  __syncthreads();
  const auto* a_b = reinterpret_cast<const __nv_bfloat16*>(a_s);
  const auto* w_b = reinterpret_cast<const __nv_bfloat16*>(w_s);
  const int warp = threadIdx.x >> 5;
  const int wr = warp / 2, wc = warp % 2;  // this warp's 32 x 32 quarter
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

// kForm: kPerRow or kBlocks. w: expert 0 (the others follow at e times its codes' and
// scales' sizes); out rows at out_ld.
template <int kForm>
__global__ void __launch_bounds__(kThreads)
    Fp8ExpertGemmTcKernel(Fp8DeviceMatrix w, int n_experts, const int32_t* __restrict__ offsets,
                          const uint16_t* __restrict__ in, float* __restrict__ out,
                          int64_t out_ld) {
  extern __shared__ float smem_raw[];
  __shared__ int tile_info[3];  // expert, first row, rows in this tile (0: no tile)
  const Smem smem = CarveSmem(smem_raw);
  uint16_t* a_s = smem.a;  // [64, 32]
  uint16_t* w_s = smem.w;  // [64, 32]
  float* c_s = smem.c;     // [64, 64]

  FindTile(n_experts, offsets, tile_info);
  const int expert = tile_info[0], row0 = tile_info[1], rows = tile_info[2];
  if (rows == 0) return;  // past the last tile: the whole block
  const int64_t n = w.rows, k = w.cols;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t scale_cols = (k + w.block_cols - 1) / w.block_cols;
  const int64_t scale_rows = (n + w.block_rows - 1) / w.block_rows;
  const uint8_t* we = w.codes + static_cast<int64_t>(expert) * n * k;  // [n, k]
  const float* se = w.scales + static_cast<int64_t>(expert) * scale_rows * scale_cols;
  const int warp = threadIdx.x >> 5;
  const int wr = warp / 2, wc = warp % 2;

  FragAcc acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  if (kForm == kPerRow) {
    for (int64_t k0 = 0; k0 < k; k0 += kBK) Stage(in, row0, rows, we, n, n0, k, k0, a_s, w_s, acc);
  } else {
    // One K group per block column; its scale is uniform over the tile (one block row).
    const float* srow = se + (n0 / w.block_rows) * scale_cols;
    for (int64_t g = 0; g < scale_cols; ++g) {
      FragAcc part[2][2];
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(part[i][j], 0.f);
      const int64_t g_end = (g + 1) * w.block_cols < k ? (g + 1) * w.block_cols : k;
      for (int64_t k0 = g * w.block_cols; k0 < g_end; k0 += kBK) {
        Stage(in, row0, rows, we, n, n0, k, k0, a_s, w_s, part);
      }
      const float s = srow[g];
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          for (int t = 0; t < acc[i][j].num_elements; ++t) acc[i][j].x[t] += s * part[i][j].x[t];
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
    if (r >= rows || n0 + c >= n) continue;
    // Per row: one scale for the whole of k (scale_cols is 1).
    const float v = kForm == kPerRow ? c_s[i] * se[(n0 + c) / w.block_rows] : c_s[i];
    out[static_cast<int64_t>(row0 + r) * out_ld + n0 + c] = v;
  }
}

// The quantized-activation form: in = e4m3 codes [pairs, k], row i's 128-wide group g scaled
// by x_scales[g * scale_ld + i]. K runs in segments inside one activation group and one
// weight block column (both multiples of 32 wide); a segment's products are summed in
// fragments of their own, staged through shared memory (c_s, each warp its own 32 x 32
// quarter) and added as acc += sA[row] * (sB * sum) (block form) or acc += sA[row] * sum (per
// row: its scale multiplies once at the end), the activation scale differing per row. The
// running sums stay in registers: lane l of a warp owns column l of its quarter, 32 rows.
template <int kForm>
__global__ void __launch_bounds__(kThreads)
    Fp8ExpertGemmTcQKernel(Fp8DeviceMatrix w, int n_experts, const int32_t* __restrict__ offsets,
                           const uint8_t* __restrict__ x_codes, const float* __restrict__ x_scales,
                           int64_t scale_ld, float* __restrict__ out, int64_t out_ld) {
  extern __shared__ float smem_raw[];
  __shared__ int tile_info[3];
  __shared__ float sa_s[kBM];  // this segment's activation scale per row of the tile
  const Smem smem = CarveSmem(smem_raw);
  uint16_t* a_s = smem.a;  // [64, 32]
  uint16_t* w_s = smem.w;  // [64, 32]
  float* c_s = smem.c;     // [64, 64]

  FindTile(n_experts, offsets, tile_info);
  const int expert = tile_info[0], row0 = tile_info[1], rows = tile_info[2];
  if (rows == 0) return;  // past the last tile: the whole block
  const int64_t n = w.rows, k = w.cols;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t scale_cols = (k + w.block_cols - 1) / w.block_cols;
  const int64_t scale_rows = (n + w.block_rows - 1) / w.block_rows;
  const uint8_t* we = w.codes + static_cast<int64_t>(expert) * n * k;  // [n, k]
  const float* se = w.scales + static_cast<int64_t>(expert) * scale_rows * scale_cols;
  const float* srow = se + (n0 / w.block_rows) * scale_cols;  // kBlocks: the tile's block row
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wr = warp / 2, wc = warp % 2;
  float* quarter = c_s + wr * 32 * kBN + wc * 32;  // this warp's [32, 32] at stride kBN

  float acc[32];  // rows wr * 32 + r, column wc * 32 + lane
  for (int r = 0; r < 32; ++r) acc[r] = 0.f;
  for (int64_t s0 = 0; s0 < k;) {
    // The segment: to the end of the activation group, of the weight block column, or of k.
    int64_t s1 = (s0 / kFp8ActGroup + 1) * kFp8ActGroup;
    if (kForm == kBlocks) {
      const int64_t b_end = (s0 / w.block_cols + 1) * w.block_cols;
      s1 = b_end < s1 ? b_end : s1;
    }
    s1 = k < s1 ? k : s1;
    if (threadIdx.x < kBM) {
      sa_s[threadIdx.x] =
          threadIdx.x < rows ? x_scales[(s0 / kFp8ActGroup) * scale_ld + row0 + threadIdx.x] : 0.f;
    }
    FragAcc part[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(part[i][j], 0.f);
    for (int64_t k0 = s0; k0 < s1; k0 += kBK) {
      Stage(x_codes, row0, rows, we, n, n0, k, k0, a_s, w_s, part);
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        wmma::store_matrix_sync(quarter + i * kM * kBN + j * kM, part[i][j], kBN,
                                wmma::mem_row_major);
      }
    __syncthreads();  // the quarter stored, sa_s visible
    const float sb = kForm == kBlocks ? srow[s0 / w.block_cols] : 1.f;
    for (int r = 0; r < 32; ++r) {
      const float sum = quarter[r * kBN + lane];
      acc[r] += sa_s[wr * 32 + r] * (kForm == kBlocks ? sb * sum : sum);
    }
    __syncthreads();  // sa_s and the quarter read before the next segment writes them
    s0 = s1;
  }
  const int64_t col = n0 + wc * 32 + lane;
  if (col >= n) return;
  const float ws = kForm == kPerRow ? se[col / w.block_rows] : 1.f;
  for (int r = 0; r < 32; ++r) {
    const int row = wr * 32 + r;
    if (row >= rows) break;
    out[static_cast<int64_t>(row0 + row) * out_ld + col] = kForm == kPerRow ? acc[r] * ws : acc[r];
  }
}

}  // namespace

bool Fp8ExpertGemmTcSupported(const Fp8DeviceMatrix& w) { return FormOf(w) != kUnsupported; }

cudaError_t LaunchFp8ExpertGemmTc(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                  const int32_t* offsets, int64_t pairs, const uint16_t* in,
                                  float* out, int64_t out_ld, cudaStream_t stream) {
  if (expert0.rows <= 0 || expert0.cols <= 0 || n_experts <= 0 || pairs <= 0) {
    return cudaSuccess;
  }
  if (out_ld < expert0.rows || expert0.block_rows <= 0 || expert0.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  const ScaleForm form = FormOf(expert0);
  if (form == kUnsupported) return cudaErrorNotSupported;
  const int64_t row_tiles = (pairs + kBM - 1) / kBM + n_experts;
  const int64_t col_tiles = (expert0.rows + kBN - 1) / kBN;
  if (row_tiles > 65535 || col_tiles > 2147483647 || n_experts > 2147483647) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  auto kernel = form == kPerRow ? Fp8ExpertGemmTcKernel<kPerRow> : Fp8ExpertGemmTcKernel<kBlocks>;
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(expert0, static_cast<int>(n_experts), offsets, in,
                                                 out, out_ld);
  return cudaGetLastError();
}

cudaError_t LaunchFp8ExpertGemmTcQ(const Fp8DeviceMatrix& expert0, int64_t n_experts,
                                   const int32_t* offsets, int64_t pairs, const uint8_t* x_codes,
                                   const float* x_scales, int64_t scale_ld, float* out,
                                   int64_t out_ld, cudaStream_t stream) {
  if (expert0.rows <= 0 || expert0.cols <= 0 || n_experts <= 0 || pairs <= 0) {
    return cudaSuccess;
  }
  if (out_ld < expert0.rows || expert0.block_rows <= 0 || expert0.block_cols <= 0 ||
      x_scales == nullptr || scale_ld < pairs) {
    return cudaErrorInvalidValue;
  }
  const ScaleForm form = FormOf(expert0);
  if (form == kUnsupported) return cudaErrorNotSupported;
  const int64_t row_tiles = (pairs + kBM - 1) / kBM + n_experts;
  const int64_t col_tiles = (expert0.rows + kBN - 1) / kBN;
  if (row_tiles > 65535 || col_tiles > 2147483647 || n_experts > 2147483647) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles));
  auto kernel = form == kPerRow ? Fp8ExpertGemmTcQKernel<kPerRow> : Fp8ExpertGemmTcQKernel<kBlocks>;
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(expert0, static_cast<int>(n_experts), offsets,
                                                 x_codes, x_scales, scale_ld, out, out_ld);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
