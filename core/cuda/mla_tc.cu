// GLM-5's absorbed MLA attention on tensor cores (FlashMLA-style decode; docs/cuda.md, "GLM-5
// on the device"), WMMA bf16 16x16x16 fragments with fp32 accumulation (sm_80+). Three
// kernels per layer:
//  1. absorb (grid tokens x Hp): q = [W_uk[h]^T q_nope | q_rot | 0] (Kp = R + dr rounded up to
//     16; GLM-5: 576) in fp32, stored as two bf16 rows: hi = bf16(q), lo = bf16(q - hi) (zeros
//     for the padding heads up to Hp, a multiple of 16);
//  2. split (grid tiles x head tiles x splits; flash-decoding over the attended keys): a block
//     takes 16 query heads (the MMA's M) and one chunk of kMlaTcChunk attended keys (the
//     selection's positions, or every causal key), gathers 16 key rows of the latent cache at
//     a time into shared memory and forms
//        S [16 heads, 64 keys] = (Q_hi + Q_lo) [16, Kp] K^T [Kp, 64]   (tensor cores, the
//                                4 warps splitting Kp; Q's fragments read from global memory),
//     the chunk's row max m and P = exp(S - m) (fp32, split as P_hi + P_lo), l = sum P, then
//        O [16 heads, Rp] = (P_hi + P_lo) [16, 64] V [64, Rp]   (V: the keys' latent columns)
//     in accumulator fragments (no rescaling inside a chunk: m is the chunk's final max);
//     O, m and l go to fp32 scratch per (token, head, split);
//  3. combine (grid tokens x H): o_lat = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s, then
//     out = W_uv[h] o_lat (bf16), as mla.cu's kernel ends.
// Precision: the keys are bf16 already (the cache); q and P enter the bf16 MMAs as hi + lo
// pairs (two MMAs each: about 16 significant bits, against FlashMLA's single bf16 rounding,
// which moved routes and selections past the golden fixtures' margins), products exact and
// sums fp32. Decode reads each key row once per pass either way, so the doubled MMAs cost
// tensor-core time, not bandwidth. Every token's result depends only on its own keys:
// batch-invariant like mla.cu's kernel, not bit-equal to it.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_device.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kM = 16;  // WMMA tile side: heads per block, keys per gathered tile
constexpr int kChunkTiles = static_cast<int>(kMlaTcChunk) / kM;
constexpr int kMaxAccPerWarp = 8;  // O's 16-column tiles per warp: Rp <= 4 x 8 x 16 = 512
constexpr size_t kSmemAlign = 32;  // WMMA pointers: 256-bit aligned

using Frag16A = wmma::fragment<wmma::matrix_a, kM, kM, kM, __nv_bfloat16, wmma::row_major>;
using Frag16BCol = wmma::fragment<wmma::matrix_b, kM, kM, kM, __nv_bfloat16, wmma::col_major>;
using Frag16BRow = wmma::fragment<wmma::matrix_b, kM, kM, kM, __nv_bfloat16, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kM, kM, kM, float>;

GLM_HD constexpr int64_t RoundUp16(int64_t v) { return (v + 15) / 16 * 16; }

// Split kernel's shared memory (bytes, after aligning the base): the K tile [16, Kp] bf16,
// S [16, 64] fp32, the 4 warps' partial S tiles [4, 16, 16] fp32, P_hi and P_lo [16, 64]
// bf16, m and l.
GLM_HD constexpr int64_t SplitSmemBytes(int64_t kp) {
  return kM * kp * 2 + kM * kMlaTcChunk * 4 + kTcWarps * kM * kM * 4 + 2 * kM * kMlaTcChunk * 2 +
         2 * kM * 4 + static_cast<int64_t>(kSmemAlign);
}

// v as hi + lo, both bf16: hi the nearest bf16, lo the nearest bf16 to the remainder.
__device__ __forceinline__ void SplitBf16(float v, uint16_t* hi, uint16_t* lo) {
  *hi = dev::FloatToBf16(v);
  *lo = dev::FloatToBf16(v - dev::Bf16ToFloat(*hi));
}

// Attended keys of token t: the selection (count >= 0) or every causal key up to pos.
__device__ __forceinline__ int64_t AttendedKeys(const int32_t* sel_count, int64_t t, int32_t pos) {
  const int32_t count = sel_count != nullptr ? sel_count[t] : -1;
  return count < 0 ? static_cast<int64_t>(pos) + 1 : count;
}

// grid (tokens, Hp). smem: q_nope [dn]. q_cat [tokens, Hp, 2 (hi, lo), Kp].
__global__ void __launch_bounds__(kTcThreads)
    MlaTcAbsorbKernel(const float* __restrict__ q, const uint16_t* __restrict__ kv_b,
                      Fp8DeviceMatrix kv_b8, MlaShape s, int64_t kp, uint16_t* __restrict__ q_cat) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x, h = blockIdx.y, hp = gridDim.y;
  const int64_t dn = s.nope_dim, dr = s.rope_dim, r = s.latent_dim;
  uint16_t* hi = q_cat + (t * hp + h) * 2 * kp;
  uint16_t* lo = hi + kp;
  if (h >= s.heads) {  // padding head of the last tile: zeros (the whole block returns)
    for (int64_t c = threadIdx.x; c < kp; c += blockDim.x) hi[c] = lo[c] = 0;
    return;
  }
  const float* qt = q + (t * s.heads + h) * s.qk_dim();
  for (int64_t c = threadIdx.x; c < dn; c += blockDim.x) smem[c] = qt[c];
  __syncthreads();
  const int64_t uk_row = h * (dn + s.v_dim);  // W_uk[h]: rows [uk_row, uk_row + dn)
  for (int64_t c = threadIdx.x; c < kp; c += blockDim.x) {
    float v = 0.f;
    if (c < r) {
      for (int64_t d = 0; d < dn; ++d) v += dev::Bf16OrFp8At(kv_b, kv_b8, uk_row + d, c) * smem[d];
    } else if (c < r + dr) {
      v = qt[dn + c - r];
    }
    SplitBf16(v, &hi[c], &lo[c]);
  }
}

// Gathers attended keys [first, first + 16) of a token into ks [16, kp] (zeros past n and
// past R + dr).
__device__ __forceinline__ void GatherKeys(uint16_t* ks, int64_t first, int64_t n, int32_t count,
                                           const int32_t* list, const int32_t* block_tables,
                                           int32_t bt_offset, const uint16_t* cache_layer,
                                           const MlaShape& s, int64_t kp) {
  const int64_t width = s.latent_dim + s.rope_dim;
  for (int64_t i = threadIdx.x; i < kM * kp; i += blockDim.x) {
    const int64_t j = i / kp, c = i % kp, idx = first + j;
    uint16_t v = 0;
    if (idx < n && c < width) {
      const int64_t p = count < 0 ? idx : list[idx];
      const int64_t slot =
          static_cast<int64_t>(block_tables[bt_offset + p / s.block_size]) * s.block_size +
          p % s.block_size;
      v = cache_layer[slot * s.row_width() + c];
    }
    ks[i] = v;
  }
}

// grid (tiles, ceil(H / 16), splits). Tiles hold one token each (the runner's MLA plan).
__global__ void __launch_bounds__(kTcThreads)
    MlaTcSplitKernel(const uint16_t* __restrict__ q_cat, const int32_t* __restrict__ tiles,
                     const int32_t* __restrict__ block_tables,
                     const uint16_t* __restrict__ cache_layer, MlaShape s, int64_t kp, int64_t rp,
                     const int32_t* __restrict__ sel_count, const int32_t* __restrict__ sel_pos,
                     int64_t sel_stride, float* __restrict__ o_part, float* __restrict__ ml_part) {
  extern __shared__ float smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) &
                                       ~(uintptr_t{kSmemAlign} - 1));
  uint16_t* ks = reinterpret_cast<uint16_t*>(base);                         // [16, kp]
  float* sc = reinterpret_cast<float*>(ks + kM * kp);                       // [16, 64]
  float* part = sc + kM * kMlaTcChunk;                                      // [4, 16, 16]
  uint16_t* p_hi = reinterpret_cast<uint16_t*>(part + kTcWarps * kM * kM);  // [16, 64]
  uint16_t* p_lo = p_hi + kM * kMlaTcChunk;                                 // [16, 64]
  float* stats = reinterpret_cast<float*>(p_lo + kM * kMlaTcChunk);         // m [16], l [16]
  const auto* ks_b = reinterpret_cast<const __nv_bfloat16*>(ks);
  const auto* p_hi_b = reinterpret_cast<const __nv_bfloat16*>(p_hi);
  const auto* p_lo_b = reinterpret_cast<const __nv_bfloat16*>(p_lo);

  const int32_t* tile = tiles + blockIdx.x * kTileInts;
  const int32_t row0 = tile[0], pos0 = tile[2], bt_offset = tile[3], kv_len = tile[4];
  if (kv_len == 0) return;  // padding: the combine writes zeros
  const int64_t t = row0, splits = gridDim.z, hp = static_cast<int64_t>(gridDim.y) * kM;
  const int32_t count = sel_count != nullptr ? sel_count[t] : -1;
  const int64_t n = AttendedKeys(sel_count, t, pos0);
  const int64_t first = static_cast<int64_t>(blockIdx.z) * kMlaTcChunk;
  if (first >= n) return;  // the whole block: the combine reads only splits with keys
  const int32_t* list = sel_pos + t * sel_stride;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kM;
  const int warp = static_cast<int>(threadIdx.x / 32);

  // The head tile's q rows straight from global memory: hi rows at stride 2 Kp, lo after.
  const auto* q_hi = reinterpret_cast<const __nv_bfloat16*>(q_cat + (t * hp + h0) * 2 * kp);
  const auto* q_lo = q_hi + kp;
  const unsigned q_ld = static_cast<unsigned>(2 * kp);
  // Scores, 16 keys at a time; each warp sums a quarter of the Kp steps, the quarters are
  // added in warp order.
  for (int kt = 0; kt < kChunkTiles; ++kt) {
    __syncthreads();  // the previous tile's readers of ks (and part) are done
    GatherKeys(ks, first + kt * kM, n, count, list, block_tables, bt_offset, cache_layer, s, kp);
    __syncthreads();
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
    for (int64_t step = warp; step < kp / kM; step += kTcWarps) {
      Frag16A a_hi, a_lo;
      Frag16BCol b;  // B = K^T: key j's row is column j
      wmma::load_matrix_sync(a_hi, q_hi + step * kM, q_ld);
      wmma::load_matrix_sync(a_lo, q_lo + step * kM, q_ld);
      wmma::load_matrix_sync(b, ks_b + step * kM, static_cast<unsigned>(kp));
      wmma::mma_sync(acc, a_hi, b, acc);
      wmma::mma_sync(acc, a_lo, b, acc);
    }
    wmma::store_matrix_sync(part + warp * kM * kM, acc, kM, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < kM * kM; i += blockDim.x) {
      float v = 0.f;
      for (int w = 0; w < kTcWarps; ++w) v += part[w * kM * kM + i];
      const int h = i / kM, j = i % kM;
      const int64_t idx = first + kt * kM + j;
      sc[h * kMlaTcChunk + kt * kM + j] = idx < n ? v * s.scale : -INFINITY;
    }
  }
  __syncthreads();
  // The chunk's softmax numerators against its own max (at least one key is attended).
  if (threadIdx.x < kM) {
    const int h = static_cast<int>(threadIdx.x);
    float m = -INFINITY, l = 0.f;
    for (int j = 0; j < kMlaTcChunk; ++j) m = fmaxf(m, sc[h * kMlaTcChunk + j]);
    for (int j = 0; j < kMlaTcChunk; ++j) {
      const float p = expf(sc[h * kMlaTcChunk + j] - m);
      SplitBf16(p, &p_hi[h * kMlaTcChunk + j], &p_lo[h * kMlaTcChunk + j]);
      l += p;
    }
    stats[h] = m;
    stats[kM + h] = l;
  }
  // O = P V: warp w owns O's column tiles w, w + 4, ...; V is the gathered keys' latent part.
  FragAcc o[kMaxAccPerWarp];
  for (int a = 0; a < kMaxAccPerWarp; ++a) wmma::fill_fragment(o[a], 0.f);
  const int64_t col_tiles = rp / kM;
  for (int kt = 0; kt < kChunkTiles; ++kt) {
    __syncthreads();                  // P written; the previous tile's readers of ks are done
    if (first + kt * kM >= n) break;  // uniform: no key left in this or later tiles
    GatherKeys(ks, first + kt * kM, n, count, list, block_tables, bt_offset, cache_layer, s, kp);
    __syncthreads();
    Frag16A pa_hi, pa_lo;
    wmma::load_matrix_sync(pa_hi, p_hi_b + kt * kM, kMlaTcChunk);
    wmma::load_matrix_sync(pa_lo, p_lo_b + kt * kM, kMlaTcChunk);
    for (int a = 0; a < kMaxAccPerWarp; ++a) {
      const int64_t nt = warp + static_cast<int64_t>(a) * kTcWarps;
      if (nt >= col_tiles) break;  // uniform within the warp
      Frag16BRow v;
      wmma::load_matrix_sync(v, ks_b + nt * kM, static_cast<unsigned>(kp));
      wmma::mma_sync(o[a], pa_hi, v, o[a]);
      wmma::mma_sync(o[a], pa_lo, v, o[a]);
    }
  }
  // O rows are heads: row stride splits x Rp in the scratch [token, Hp, split, Rp].
  float* o_base = o_part + ((t * hp + h0) * splits + blockIdx.z) * rp;
  for (int a = 0; a < kMaxAccPerWarp; ++a) {
    const int64_t nt = warp + static_cast<int64_t>(a) * kTcWarps;
    if (nt >= col_tiles) break;
    wmma::store_matrix_sync(o_base + nt * kM, o[a], static_cast<unsigned>(splits * rp),
                            wmma::mem_row_major);
  }
  if (threadIdx.x < kM) {
    float* ml = ml_part + ((t * hp + h0 + threadIdx.x) * splits + blockIdx.z) * 2;
    ml[0] = stats[threadIdx.x];
    ml[1] = stats[kM + threadIdx.x];
  }
}

// grid (tiles, H). smem: o_lat [R].
__global__ void __launch_bounds__(kTcThreads)
    MlaTcCombineKernel(const int32_t* __restrict__ tiles, const float* __restrict__ o_part,
                       const float* __restrict__ ml_part, int64_t splits, int64_t rp,
                       const uint16_t* __restrict__ kv_b, Fp8DeviceMatrix kv_b8, MlaShape s,
                       const int32_t* __restrict__ sel_count, uint16_t* __restrict__ out) {
  extern __shared__ float o_lat[];
  const int32_t* tile = tiles + blockIdx.x * kTileInts;
  const int32_t row0 = tile[0], pos0 = tile[2], kv_len = tile[4];
  const int64_t t = row0, h = blockIdx.y, dv = s.v_dim, r = s.latent_dim;
  uint16_t* o = out + (t * s.heads + h) * dv;
  if (kv_len == 0) {  // padding row
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) o[j] = 0;
    return;
  }
  const int64_t n = AttendedKeys(sel_count, t, pos0);
  const int64_t chunks = (n + kMlaTcChunk - 1) / kMlaTcChunk;
  const int64_t used = chunks < splits ? chunks : splits;
  const int64_t hp = RoundUp16(s.heads);
  const float* ml = ml_part + (t * hp + h) * splits * 2;
  const float* op = o_part + (t * hp + h) * splits * rp;
  float big = -INFINITY;
  for (int64_t k = 0; k < used; ++k) big = fmaxf(big, ml[2 * k]);
  float denom = 0.f;
  for (int64_t k = 0; k < used; ++k) denom += expf(ml[2 * k] - big) * ml[2 * k + 1];
  const float inv = 1.0f / denom;
  for (int64_t c = threadIdx.x; c < r; c += blockDim.x) {
    float v = 0.f;
    for (int64_t k = 0; k < used; ++k) v += expf(ml[2 * k] - big) * op[k * rp + c];
    o_lat[c] = v * inv;
  }
  __syncthreads();
  const int64_t uv_row = h * (s.nope_dim + dv) + s.nope_dim;  // W_uv[h]'s first row
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t c = 0; c < r; ++c) acc += dev::Bf16OrFp8At(kv_b, kv_b8, uv_row + j, c) * o_lat[c];
    o[j] = dev::FloatToBf16(acc);
  }
}

}  // namespace

MlaTcLayout MlaTcLayoutFor(const MlaShape& s, int64_t max_keys) {
  MlaTcLayout l;
  l.kp = RoundUp16(s.latent_dim + s.rope_dim);
  l.rp = RoundUp16(s.latent_dim);
  l.hp = RoundUp16(s.heads);
  l.splits = std::max<int64_t>(1, (max_keys + kMlaTcChunk - 1) / kMlaTcChunk);
  l.supported = s.heads > 0 && s.latent_dim > 0 && l.rp / kM <= kTcWarps * kMaxAccPerWarp &&
                SplitSmemBytes(l.kp) <= 48 * 1024 && l.splits <= 65535 && l.hp / kM <= 65535;
  l.q_cat_elems = l.hp * 2 * l.kp;
  l.o_part_floats = l.hp * l.splits * l.rp;
  l.ml_part_floats = l.hp * l.splits * 2;
  return l;
}

cudaError_t LaunchMlaAttentionTc(const float* q, int64_t tokens, const int32_t* tiles,
                                 int num_tiles, const int32_t* block_tables,
                                 const uint16_t* cache_layer, const uint16_t* kv_b,
                                 const Fp8DeviceMatrix& kv_b8, const MlaShape& shape,
                                 const int32_t* sel_count, const int32_t* sel_pos,
                                 int64_t sel_stride, const MlaTcLayout& layout,
                                 const MlaTcScratch& scratch, uint16_t* out, cudaStream_t stream) {
  if (num_tiles <= 0 || tokens <= 0) return cudaSuccess;
  if (!layout.supported || shape.heads > 65535 || (sel_count != nullptr && sel_pos == nullptr) ||
      (kv_b == nullptr) == (kv_b8.codes == nullptr) || scratch.q_cat == nullptr ||
      scratch.o_part == nullptr || scratch.ml_part == nullptr) {
    return cudaErrorInvalidValue;
  }
  Fp8DeviceMatrix w = kv_b8;  // the bf16 form indexes kv_b's rows by w.cols
  if (w.codes == nullptr) {
    w.rows = shape.heads * (shape.nope_dim + shape.v_dim);
    w.cols = shape.latent_dim;
  } else if (w.rows != shape.heads * (shape.nope_dim + shape.v_dim) || w.cols != shape.latent_dim ||
             w.block_rows <= 0 || w.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  const unsigned heads = static_cast<unsigned>(shape.heads);
  MlaTcAbsorbKernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(layout.hp)),
                      kTcThreads, sizeof(float) * shape.nope_dim, stream>>>(
      q, kv_b, w, shape, layout.kp, scratch.q_cat);
  const dim3 split_grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(layout.hp / kM),
                        static_cast<unsigned>(layout.splits));
  MlaTcSplitKernel<<<split_grid, kTcThreads, SplitSmemBytes(layout.kp), stream>>>(
      scratch.q_cat, tiles, block_tables, cache_layer, shape, layout.kp, layout.rp, sel_count,
      sel_pos, sel_stride, scratch.o_part, scratch.ml_part);
  MlaTcCombineKernel<<<dim3(static_cast<unsigned>(num_tiles), heads), kTcThreads,
                       sizeof(float) * shape.latent_dim, stream>>>(
      tiles, scratch.o_part, scratch.ml_part, layout.splits, layout.rp, kv_b, w, shape, sel_count,
      out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
