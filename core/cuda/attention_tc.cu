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

// The block's shared memory, carved from the dynamic allocation (TcSmemBytes).
struct TcSmem {
  uint16_t* q_hi;  // [32, dp] bf16, q rows (hi part)
  uint16_t* q_lo;  // [32, dp] bf16, q rows (lo part)
  uint16_t* k;     // [64, dp] bf16, the chunk's key rows
  uint16_t* v;     // [64, dp] bf16, the chunk's value rows
  float* s;        // [32, 64] scores
  uint16_t* p_hi;  // [32, 64] bf16, softmax numerators (hi part)
  uint16_t* p_lo;  // [32, 64] bf16, (lo part)
  float* o;        // [32, dp] the running output
  float* m;        // [32] running max
  float* l;        // [32] running sum
  float* alpha;    // [32] this chunk's rescale of o

  __device__ static TcSmem Carve(float* raw, int dp) {
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kSmemAlign - 1) &
                                         ~(uintptr_t{kSmemAlign} - 1));
    TcSmem m;
    m.q_hi = reinterpret_cast<uint16_t*>(base);
    m.q_lo = m.q_hi + kTcRows * dp;
    m.k = m.q_lo + kTcRows * dp;
    m.v = m.k + kTcKeys * dp;
    m.s = reinterpret_cast<float*>(m.v + kTcKeys * dp);
    m.p_hi = reinterpret_cast<uint16_t*>(m.s + kTcRows * kTcKeys);
    m.p_lo = m.p_hi + kTcRows * kTcKeys;
    m.o = reinterpret_cast<float*>(m.p_lo + kTcRows * kTcKeys);
    m.m = m.o + kTcRows * dp;
    m.l = m.m + kTcRows;
    m.alpha = m.l + kTcRows;
    return m;
  }
};

__device__ __forceinline__ const __nv_bfloat16* Bf16(const uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

// One tile: its rows (num_q tokens x group heads of one KV head) and where its keys are.
struct TcTile {
  int row0, pos0, bt_offset, rows, row_tiles, group, hd, dp, kvh;
};

// q rows as hi + lo pairs (zeros past the tile's rows and hd); o, m and l cleared.
__device__ void LoadQueries(const float* q, const AttentionShape& shape, const TcTile& t,
                            const TcSmem& sm) {
  for (int i = threadIdx.x; i < kTcRows * t.dp; i += kTcThreads) {
    const int r = i / t.dp, d = i % t.dp;
    float v = 0.f;
    if (r < t.rows && d < t.hd) {
      const int64_t head = static_cast<int64_t>(t.kvh) * t.group + r % t.group;
      v = q[static_cast<int64_t>(t.row0 + r / t.group) * shape.q_stride + head * t.hd + d];
    }
    SplitBf16(v, &sm.q_hi[i], &sm.q_lo[i]);
    sm.o[i] = 0.f;
  }
  for (int r = threadIdx.x; r < kTcRows; r += kTcThreads) {
    sm.m[r] = -INFINITY;
    sm.l[r] = 0.f;
  }
}

// The chunk's K and V rows [c0, c0 + 64), the cache's bf16 bits as they are (zeros past
// kv_end and past hd).
__device__ void StageKeys(const uint16_t* cache, const int32_t* block_tables,
                          const AttentionShape& shape, const TcTile& t, int c0, int kv_end,
                          const TcSmem& sm) {
  const int64_t kv_dim = shape.kv_heads * t.hd, bs = shape.block_size;
  for (int i = threadIdx.x; i < kTcKeys * t.dp; i += kTcThreads) {
    const int j = i / t.dp, d = i % t.dp;
    const int p = c0 + j;
    uint16_t kb = 0, vb = 0;
    if (p < kv_end && d < t.hd) {
      const int64_t block = block_tables[t.bt_offset + p / bs];
      const int64_t at =
          (block * 2 * bs + p % bs) * kv_dim + static_cast<int64_t>(t.kvh) * t.hd + d;
      kb = cache[at];
      vb = cache[at + bs * kv_dim];  // the value row is bs rows after the key row
    }
    sm.k[i] = kb;
    sm.v[i] = vb;
  }
}

// S = Q K^T on tensor cores: fragment f is row tile f / 4, key tile f % 4; warp w takes f = w,
// w + 4.
__device__ void ScoreChunk(const TcTile& t, const TcSmem& sm) {
  const int warp = threadIdx.x >> 5, dp = t.dp;
  for (int f = warp; f < t.row_tiles * (kTcKeys / kM); f += kTcWarps) {
    const int rt = f / (kTcKeys / kM), kt = f % (kTcKeys / kM);
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
    for (int step = 0; step < dp / kM; ++step) {
      FragA a_hi, a_lo;
      FragBCol b;  // B = K^T: key j's row is column j
      wmma::load_matrix_sync(a_hi, Bf16(sm.q_hi) + rt * kM * dp + step * kM, dp);
      wmma::load_matrix_sync(a_lo, Bf16(sm.q_lo) + rt * kM * dp + step * kM, dp);
      wmma::load_matrix_sync(b, Bf16(sm.k) + kt * kM * dp + step * kM, dp);
      wmma::mma_sync(acc, a_hi, b, acc);
      wmma::mma_sync(acc, a_lo, b, acc);
    }
    wmma::store_matrix_sync(sm.s + rt * kM * kTcKeys + kt * kM, acc, kTcKeys, wmma::mem_row_major);
  }
}

// The online-softmax update: a warp per row, two keys per lane (causal mask, x scale, fp32).
// Rows past `rows` (in the last 16-row fragment) get P = 0 and alpha = 1, so their O rows stay
// zero.
__device__ void SoftmaxUpdate(const TcTile& t, int c0, int kv_end, float scale, const TcSmem& sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < t.row_tiles * kM; r += kTcWarps) {
    float score[2] = {-INFINITY, -INFINITY};
    if (r < t.rows) {
      const int query_pos = t.pos0 + r / t.group;
      for (int h = 0; h < 2; ++h) {
        const int j = lane + 32 * h, p = c0 + j;
        if (p < kv_end && p <= query_pos) score[h] = sm.s[r * kTcKeys + j] * scale;
      }
    }
    const float m_old = sm.m[r];
    const float m_new = fmaxf(m_old, dev::WarpMax(fmaxf(score[0], score[1])));
    float sum = 0.f;
    for (int h = 0; h < 2; ++h) {
      // Fully masked so far: nothing to add (and no inf - inf).
      const float prob = score[h] == -INFINITY ? 0.f : expf(score[h] - m_new);
      const int at = r * kTcKeys + lane + 32 * h;
      SplitBf16(prob, &sm.p_hi[at], &sm.p_lo[at]);
      sum += prob;
    }
    const float alpha = m_old == -INFINITY ? (r < t.rows ? 0.f : 1.f) : expf(m_old - m_new);
    const float prob_sum = dev::WarpSum(sum);
    __syncwarp();  // all lanes have read m[r]
    if (lane == 0) {
      sm.m[r] = m_new;
      sm.l[r] = sm.l[r] * alpha + prob_sum;
      sm.alpha[r] = alpha;
    }
  }
}

// O = alpha O + P V on tensor cores: fragment f is row tile f / dp_tiles, column tile
// f % dp_tiles. Call with alpha applied to o already.
__device__ void AccumulateValues(const TcTile& t, const TcSmem& sm) {
  const int warp = threadIdx.x >> 5, dp = t.dp, dp_tiles = dp / kM;
  for (int f = warp; f < t.row_tiles * dp_tiles; f += kTcWarps) {
    const int rt = f / dp_tiles, nt = f % dp_tiles;
    FragAcc acc;
    float* o_tile = sm.o + rt * kM * dp + nt * kM;
    wmma::load_matrix_sync(acc, o_tile, dp, wmma::mem_row_major);
    for (int kt = 0; kt < kTcKeys / kM; ++kt) {
      FragA a_hi, a_lo;
      FragBRow b;
      wmma::load_matrix_sync(a_hi, Bf16(sm.p_hi) + rt * kM * kTcKeys + kt * kM, kTcKeys);
      wmma::load_matrix_sync(a_lo, Bf16(sm.p_lo) + rt * kM * kTcKeys + kt * kM, kTcKeys);
      wmma::load_matrix_sync(b, Bf16(sm.v) + kt * kM * dp + nt * kM, dp);
      wmma::mma_sync(acc, a_hi, b, acc);
      wmma::mma_sync(acc, a_lo, b, acc);
    }
    wmma::store_matrix_sync(o_tile, acc, dp, wmma::mem_row_major);
  }
}

// The tile's result: out (bf16, o / l) without splits, else attention.cu's partial layout
// (acc [rows_cap, hd], m [rows_cap], l [rows_cap]); every split writes its part, empty or
// not, so the combine never reads stale scratch.
__device__ void WriteResult(const AttentionShape& shape, const TcTile& t, int rows_cap,
                            float* scratch, uint16_t* out, const TcSmem& sm) {
  const int num_splits = gridDim.z, hd = t.hd;
  if (num_splits == 1) {
    for (int e = threadIdx.x; e < t.rows * hd; e += kTcThreads) {
      const int r = e / hd, d = e % hd;
      const int64_t head = static_cast<int64_t>(t.kvh) * t.group + r % t.group;
      const float l = sm.l[r];
      out[static_cast<int64_t>(t.row0 + r / t.group) * shape.heads * hd + head * hd + d] =
          dev::FloatToBf16(l > 0.f ? sm.o[r * t.dp + d] / l : 0.f);
    }
    return;
  }
  float* part =
      scratch +
      ((static_cast<int64_t>(blockIdx.x) * shape.kv_heads + t.kvh) * num_splits + blockIdx.z) *
          AttentionPartialFloats(rows_cap, hd);
  for (int e = threadIdx.x; e < t.rows * hd; e += kTcThreads)
    part[e] = sm.o[(e / hd) * t.dp + e % hd];
  for (int r = threadIdx.x; r < t.rows; r += kTcThreads) {
    part[rows_cap * hd + r] = sm.m[r];
    part[rows_cap * hd + rows_cap + r] = sm.l[r];
  }
}

// grid (tiles, kv heads, splits), kTcThreads threads, TcSmemBytes(dp) of shared memory.
__global__ void __launch_bounds__(kTcThreads)
    PagedAttentionTcKernel(const float* __restrict__ q, const int32_t* __restrict__ tiles,
                           const int32_t* __restrict__ block_tables,
                           const uint16_t* __restrict__ cache, AttentionShape shape, int dp,
                           int rows_cap, float* __restrict__ scratch, uint16_t* __restrict__ out) {
  extern __shared__ float smem_raw[];
  const TcSmem sm = TcSmem::Carve(smem_raw, dp);
  const int32_t* td = tiles + static_cast<int64_t>(blockIdx.x) * kTileInts;
  TcTile t;
  t.row0 = td[0];
  t.pos0 = td[2];
  t.bt_offset = td[3];
  t.group = static_cast<int>(shape.heads / shape.kv_heads);
  t.rows = td[1] * t.group;  // <= rows_cap <= 32 (host contract)
  t.row_tiles = (t.rows + kM - 1) / kM;
  t.hd = static_cast<int>(shape.head_dim);
  t.dp = dp;
  t.kvh = blockIdx.y;
  const int kv_len = td[4], num_splits = gridDim.z;
  // This split's key range: the CUDA-core kernel's (chunk-aligned to its 32 keys), so both
  // kernels' partials cover the same keys.
  const int split_len = ((kv_len + num_splits - 1) / num_splits + 31) / 32 * 32;
  const int kv_begin = min(kv_len, static_cast<int>(blockIdx.z) * split_len);
  const int kv_end = min(kv_len, kv_begin + split_len);

  LoadQueries(q, shape, t, sm);
  for (int c0 = kv_begin; c0 < kv_end; c0 += kTcKeys) {
    __syncthreads();  // the previous chunk's readers of k, v, p and o are done
    StageKeys(cache, block_tables, shape, t, c0, kv_end, sm);
    __syncthreads();
    ScoreChunk(t, sm);
    __syncthreads();
    SoftmaxUpdate(t, c0, kv_end, shape.scale, sm);
    __syncthreads();
    for (int i = threadIdx.x; i < t.row_tiles * kM * dp; i += kTcThreads)
      sm.o[i] *= sm.alpha[i / dp];
    __syncthreads();
    AccumulateValues(t, sm);
  }
  __syncthreads();  // o, m and l final
  WriteResult(shape, t, rows_cap, scratch, out, sm);
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
