// GLM-4.5's causal paged attention on tensor cores (flash-attention style; docs/cuda.md,
// "Attention on tensor cores"): the same tiles, split ranges, partial layout and result as
// attention.cu's CUDA-core kernel, with both products on WMMA bf16 16x16x16 fragments and
// fp32 accumulation (sm_80+).
//
// A block (4 warps) takes one tile (rows = num_q x group <= 32 query rows: the tile's tokens
// times the query heads sharing one KV head, so each K/V chunk is read once for all of them),
// one KV head and one split of the KV range, and walks the range in chunks of 64 keys:
//    S [32, 64]  = Q [32, Dp] K^T [Dp, 64]          tensor cores, then x scale in fp32
//    online softmax over the chunk (fp32 running max m and sum l per row, causal mask)
//    O [32, Dp]  = alpha O + P [32, 64] V [64, Dp]   tensor cores, O kept in shared memory
// Dp is head_dim rounded up to 16 (zeros beyond it). K and V are the cache's bf16 values as
// they are; q and P enter the MMAs as hi + lo bf16 pairs (two MMAs each, about 16
// significant bits, as mla_tc.cu does for GLM-5: a single bf16 rounding of q and P moves
// expert routes past the golden fixtures' margins), so the result is as close to the CPU as
// the CUDA-core kernel's. Each row's result depends only on its own keys (batch-invariant);
// it is not bit-equal to attention.cu's, whose sums run in another order.
//
// The bf16 cache only: the FP8 cache keeps attention.cu's kernel (its e4m3 x scale values are
// not bf16 values).
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>

#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kM = 16;             // WMMA tile side
constexpr int kTcKeys = 64;        // keys per chunk: S is [32, 64]
constexpr int kTcRows = 32;        // query rows of a tile (attention.cu's kMaxRows)
constexpr size_t kSmemAlign = 32;  // WMMA pointers: 256-bit aligned

using FragA = wmma::fragment<wmma::matrix_a, kM, kM, kM, __nv_bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kM, kM, kM, __nv_bfloat16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kM, kM, kM, __nv_bfloat16, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kM, kM, kM, float>;

GLM_HD constexpr int RoundUp16(int64_t v) { return static_cast<int>((v + 15) / 16 * 16); }

// Shared memory (bytes, after aligning the base): q_hi, q_lo [32, Dp] bf16; k, v [64, Dp]
// bf16; s [32, 64] fp32; p_hi, p_lo [32, 64] bf16; o [32, Dp] fp32; m, l, alpha [32] fp32.
// Every part is a multiple of 32 bytes, so each starts aligned.
GLM_HD constexpr size_t TcSmemBytes(int dp) {
  return static_cast<size_t>(2 * kTcRows * dp * 2 + 2 * kTcKeys * dp * 2 + kTcRows * kTcKeys * 4 +
                             2 * kTcRows * kTcKeys * 2 + kTcRows * dp * 4 + 3 * kTcRows * 4) +
         kSmemAlign;
}

// v as hi + lo, both bf16: hi the nearest bf16, lo the nearest bf16 to the remainder.
__device__ __forceinline__ void SplitBf16(float v, uint16_t* hi, uint16_t* lo) {
  *hi = dev::FloatToBf16(v);
  *lo = dev::FloatToBf16(v - dev::Bf16ToFloat(*hi));
}

__global__ void __launch_bounds__(kTcThreads)
    PagedAttentionTcKernel(const float* __restrict__ q, const int32_t* __restrict__ tiles,
                           const int32_t* __restrict__ block_tables,
                           const uint16_t* __restrict__ cache, AttentionShape shape, int dp,
                           int rows_cap, float* __restrict__ scratch, uint16_t* __restrict__ out) {
  extern __shared__ float smem_raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) &
                                       ~(uintptr_t{kSmemAlign} - 1));
  uint16_t* q_hi = reinterpret_cast<uint16_t*>(base);                     // [32, dp]
  uint16_t* q_lo = q_hi + kTcRows * dp;                                   // [32, dp]
  uint16_t* k_s = q_lo + kTcRows * dp;                                    // [64, dp]
  uint16_t* v_s = k_s + kTcKeys * dp;                                     // [64, dp]
  float* s_s = reinterpret_cast<float*>(v_s + kTcKeys * dp);              // [32, 64]
  uint16_t* p_hi = reinterpret_cast<uint16_t*>(s_s + kTcRows * kTcKeys);  // [32, 64]
  uint16_t* p_lo = p_hi + kTcRows * kTcKeys;                              // [32, 64]
  float* o_s = reinterpret_cast<float*>(p_lo + kTcRows * kTcKeys);        // [32, dp]
  float* m_s = o_s + kTcRows * dp;
  float* l_s = m_s + kTcRows;
  float* alpha_s = l_s + kTcRows;
  const auto* q_hi_b = reinterpret_cast<const __nv_bfloat16*>(q_hi);
  const auto* q_lo_b = reinterpret_cast<const __nv_bfloat16*>(q_lo);
  const auto* k_b = reinterpret_cast<const __nv_bfloat16*>(k_s);
  const auto* v_b = reinterpret_cast<const __nv_bfloat16*>(v_s);
  const auto* p_hi_b = reinterpret_cast<const __nv_bfloat16*>(p_hi);
  const auto* p_lo_b = reinterpret_cast<const __nv_bfloat16*>(p_lo);

  const int hd = static_cast<int>(shape.head_dim);
  const int group = static_cast<int>(shape.heads / shape.kv_heads);
  const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int num_splits = gridDim.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int32_t* td = tiles + static_cast<int64_t>(tile) * kTileInts;
  const int row0 = td[0], num_q = td[1], pos0 = td[2], bt_offset = td[3], kv_len = td[4];
  const int rows = num_q * group;              // <= rows_cap <= 32 (host contract)
  const int row_tiles = (rows + kM - 1) / kM;  // 16-row fragments holding real rows
  const int dp_tiles = dp / kM;

  // This split's key range: the CUDA-core kernel's (chunk-aligned to its 32 keys), so both
  // kernels' partials cover the same keys.
  const int split_len = ((kv_len + num_splits - 1) / num_splits + 31) / 32 * 32;
  const int kv_begin = min(kv_len, split * split_len);
  const int kv_end = min(kv_len, kv_begin + split_len);

  // Row r is query token r / group, head kvh * group + r % group; zeros past rows and hd.
  for (int i = tid; i < kTcRows * dp; i += kTcThreads) {
    const int r = i / dp, d = i % dp;
    float v = 0.f;
    if (r < rows && d < hd) {
      const int64_t head = static_cast<int64_t>(kvh) * group + r % group;
      v = q[static_cast<int64_t>(row0 + r / group) * shape.q_stride + head * hd + d];
    }
    SplitBf16(v, &q_hi[i], &q_lo[i]);
    o_s[i] = 0.f;
  }
  for (int r = tid; r < kTcRows; r += kTcThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
  }

  const int64_t kv_dim = shape.kv_heads * hd;
  const int64_t bs = shape.block_size;
  for (int c0 = kv_begin; c0 < kv_end; c0 += kTcKeys) {
    __syncthreads();  // the previous chunk's readers of k, v, p and o are done
    // K and V rows of the chunk, the cache's bf16 bits as they are (zeros past the range).
    for (int i = tid; i < kTcKeys * dp; i += kTcThreads) {
      const int j = i / dp, d = i % dp;
      const int p = c0 + j;
      uint16_t kb = 0, vb = 0;
      if (p < kv_end && d < hd) {
        const int64_t block = block_tables[bt_offset + p / bs];
        const int64_t at = (block * 2 * bs + p % bs) * kv_dim + static_cast<int64_t>(kvh) * hd + d;
        kb = cache[at];
        vb = cache[at + bs * kv_dim];  // the value row is bs rows after the key row
      }
      k_s[i] = kb;
      v_s[i] = vb;
    }
    __syncthreads();
    // S = Q K^T: fragment f is row tile f / 4, key tile f % 4; warp w takes f = w, w + 4.
    for (int f = warp; f < row_tiles * (kTcKeys / kM); f += kTcWarps) {
      const int rt = f / (kTcKeys / kM), kt = f % (kTcKeys / kM);
      FragAcc acc;
      wmma::fill_fragment(acc, 0.f);
      for (int step = 0; step < dp_tiles; ++step) {
        FragA a_hi, a_lo;
        FragBCol b;  // B = K^T: key j's row is column j
        wmma::load_matrix_sync(a_hi, q_hi_b + rt * kM * dp + step * kM, dp);
        wmma::load_matrix_sync(a_lo, q_lo_b + rt * kM * dp + step * kM, dp);
        wmma::load_matrix_sync(b, k_b + kt * kM * dp + step * kM, dp);
        wmma::mma_sync(acc, a_hi, b, acc);
        wmma::mma_sync(acc, a_lo, b, acc);
      }
      wmma::store_matrix_sync(s_s + rt * kM * kTcKeys + kt * kM, acc, kTcKeys, wmma::mem_row_major);
    }
    __syncthreads();
    // The online-softmax update: a warp per row, two keys per lane. Rows past `rows` (in the
    // last 16-row fragment) get P = 0 and alpha = 1, so their O rows stay zero.
    for (int r = warp; r < row_tiles * kM; r += kTcWarps) {
      float score[2] = {-INFINITY, -INFINITY};
      if (r < rows) {
        const int query_pos = pos0 + r / group;
        for (int h = 0; h < 2; ++h) {
          const int j = lane + 32 * h, p = c0 + j;
          if (p < kv_end && p <= query_pos) score[h] = s_s[r * kTcKeys + j] * shape.scale;
        }
      }
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, dev::WarpMax(fmaxf(score[0], score[1])));
      float sum = 0.f;
      for (int h = 0; h < 2; ++h) {
        // Fully masked so far: nothing to add (and no inf - inf).
        const float prob = score[h] == -INFINITY ? 0.f : expf(score[h] - m_new);
        SplitBf16(prob, &p_hi[r * kTcKeys + lane + 32 * h], &p_lo[r * kTcKeys + lane + 32 * h]);
        sum += prob;
      }
      const float alpha = m_old == -INFINITY ? (r < rows ? 0.f : 1.f) : expf(m_old - m_new);
      const float prob_sum = dev::WarpSum(sum);
      __syncwarp();  // all lanes have read m_s[r]
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + prob_sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();
    for (int i = tid; i < row_tiles * kM * dp; i += kTcThreads) o_s[i] *= alpha_s[i / dp];
    __syncthreads();
    // O += P V: fragment f is row tile f / dp_tiles, column tile f % dp_tiles.
    for (int f = warp; f < row_tiles * dp_tiles; f += kTcWarps) {
      const int rt = f / dp_tiles, nt = f % dp_tiles;
      FragAcc acc;
      float* o_tile = o_s + rt * kM * dp + nt * kM;
      wmma::load_matrix_sync(acc, o_tile, dp, wmma::mem_row_major);
      for (int kt = 0; kt < kTcKeys / kM; ++kt) {
        FragA a_hi, a_lo;
        FragBRow b;
        wmma::load_matrix_sync(a_hi, p_hi_b + rt * kM * kTcKeys + kt * kM, kTcKeys);
        wmma::load_matrix_sync(a_lo, p_lo_b + rt * kM * kTcKeys + kt * kM, kTcKeys);
        wmma::load_matrix_sync(b, v_b + kt * kM * dp + nt * kM, dp);
        wmma::mma_sync(acc, a_hi, b, acc);
        wmma::mma_sync(acc, a_lo, b, acc);
      }
      wmma::store_matrix_sync(o_tile, acc, dp, wmma::mem_row_major);
    }
  }
  __syncthreads();  // o, m and l final

  if (num_splits == 1) {
    for (int e = tid; e < rows * hd; e += kTcThreads) {
      const int r = e / hd, d = e % hd;
      const int64_t head = static_cast<int64_t>(kvh) * group + r % group;
      const float l = l_s[r];
      out[static_cast<int64_t>(row0 + r / group) * shape.heads * hd + head * hd + d] =
          dev::FloatToBf16(l > 0.f ? o_s[r * dp + d] / l : 0.f);
    }
  } else {
    // attention.cu's partial layout: acc [rows_cap, hd], m [rows_cap], l [rows_cap]; every
    // split writes its part, empty or not, so the combine never reads stale scratch.
    float* part =
        scratch + ((static_cast<int64_t>(tile) * shape.kv_heads + kvh) * num_splits + split) *
                      AttentionPartialFloats(rows_cap, hd);
    for (int e = tid; e < rows * hd; e += kTcThreads) part[e] = o_s[(e / hd) * dp + e % hd];
    for (int r = tid; r < rows; r += kTcThreads) {
      part[rows_cap * hd + r] = m_s[r];
      part[rows_cap * hd + rows_cap + r] = l_s[r];
    }
  }
}

}  // namespace

size_t AttentionTcSmemBytes(int64_t head_dim) { return TcSmemBytes(RoundUp16(head_dim)); }

cudaError_t PrepareAttentionTc(int max_dynamic_smem) {
  const int wanted = static_cast<int>(AttentionTcSmemBytes(kMaxHeadDim));
  return cudaFuncSetAttribute(PagedAttentionTcKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              wanted < max_dynamic_smem ? wanted : max_dynamic_smem);
}

cudaError_t LaunchPagedAttentionTc(const float* q, const int32_t* tiles, int num_tiles,
                                   const int32_t* block_tables, const uint16_t* cache_layer,
                                   const AttentionShape& shape, int num_splits, float* scratch,
                                   uint16_t* out, cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  if (cache_layer == nullptr || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0 ||
      shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim ||
      shape.heads / shape.kv_heads > kMaxGqaGroup || num_splits < 1 || num_splits > 65535 ||
      shape.kv_heads > 65535 || (num_splits > 1 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = shape.heads / shape.kv_heads;
  const int rows_cap = AttentionTileTokens(group) * static_cast<int>(group);
  const int dp = RoundUp16(shape.head_dim);
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(shape.kv_heads),
                  static_cast<unsigned>(num_splits));
  PagedAttentionTcKernel<<<grid, kTcThreads, TcSmemBytes(dp), stream>>>(
      q, tiles, block_tables, cache_layer, shape, dp, rows_cap, scratch, out);
  if (num_splits > 1) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return LaunchAttentionCombine(scratch, tiles, num_tiles, shape, num_splits, out, stream);
  }
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
