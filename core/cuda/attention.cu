// Causal paged attention over the bf16 KV cache, for ragged batches: one kernel for prefill
// tiles and decode rows, tiled over the keys with an online (running-max) softmax in fp32,
// optionally split over the KV range (flash-decoding) with a combine kernel.
//
// A block handles one tile (up to kMaxRows query rows: num_q consecutive tokens of one
// sequence times the `group` query heads that share one kv head), one kv head and one split
// of the KV range. Keys and values come in chunks of 32 (one key per lane when scoring), are
// widened to fp32 in shared memory and shared by all rows of the tile: GQA and prefill tiles
// read each K/V chunk once per block. The cache is bf16 (`cache`) or FP8 (`kv_codes` and
// `kv_scales`, cache null: core/model/kv_fp8.h's codes and per-head scales, decoded to the CPU's
// fp32 values as the chunk is staged).
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kKeys = 32;
constexpr int kMaxRows = 32;
constexpr int kAccPerThread = static_cast<int>(kMaxRows * kMaxHeadDim / kAttnThreads);

// Shared floats: q [rows_cap, hd], k [kKeys, hd + 1] (odd stride: conflict-free when lanes
// read different keys), v [kKeys, hd], p [rows_cap, kKeys], m, l, alpha [rows_cap].
size_t AttentionSmemBytes(int rows_cap, int hd) {
  return sizeof(float) * (static_cast<size_t>(rows_cap) * (hd + kKeys + 3) +
                          static_cast<size_t>(kKeys) * (2 * hd + 1));
}

// Keys and values [c0, c0 + kKeys) of kv head `kvh` into shared memory as fp32 (k with the
// odd stride hd + 1), zero past kv_end. `table`: the sequence's block table.
__device__ __forceinline__ void StageKvChunk(const int32_t* __restrict__ table,
                                             const uint16_t* __restrict__ cache,
                                             const uint8_t* __restrict__ kv_codes,
                                             const float* __restrict__ kv_scales,
                                             const AttentionShape& shape, int kvh, int c0,
                                             int kv_end, float* k_s, float* v_s) {
  const int hd = static_cast<int>(shape.head_dim);
  const int64_t kv_dim = shape.kv_heads * hd;
  const int64_t bs = shape.block_size;
  for (int i = threadIdx.x; i < kKeys * hd; i += kAttnThreads) {
    const int j = i / hd, d = i % hd;
    const int p = c0 + j;
    float kf = 0.f, vf = 0.f;
    if (p < kv_end) {
      const int64_t block = table[p / bs];
      const int64_t key_row = block * 2 * bs + p % bs;  // the value row is bs later
      const int64_t at = key_row * kv_dim + static_cast<int64_t>(kvh) * hd + d;
      if (kv_codes != nullptr) {
        kf = dev::E4m3ToFloat(kv_codes[at]) * kv_scales[key_row * shape.kv_heads + kvh];
        vf = dev::E4m3ToFloat(kv_codes[at + bs * kv_dim]) *
             kv_scales[(key_row + bs) * shape.kv_heads + kvh];
      } else {
        kf = dev::Bf16ToFloat(cache[at]);
        vf = dev::Bf16ToFloat(cache[at + bs * kv_dim]);
      }
    }
    k_s[j * (hd + 1) + d] = kf;
    v_s[j * hd + d] = vf;
  }
}

// The tile's result: normalised bf16 rows into `out` (one split), or this split's unnormalised
// accumulators and its rows' m and l into `scratch` for the combine kernel.
__device__ __forceinline__ void WriteTileOutput(const float (&acc)[kAccPerThread],
                                                const float* m_s, const float* l_s,
                                                const AttentionShape& shape, int tile, int kvh,
                                                int split, int num_splits, int row0, int rows,
                                                int rows_cap, float* __restrict__ scratch,
                                                uint16_t* __restrict__ out) {
  const int hd = static_cast<int>(shape.head_dim);
  const int group = static_cast<int>(shape.heads / shape.kv_heads);
  const int tid = threadIdx.x;
  if (num_splits == 1) {
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i) {
      const int e = tid + i * kAttnThreads;
      if (e < rows * hd) {
        const int r = e / hd, d = e % hd;
        const int64_t head = static_cast<int64_t>(kvh) * group + r % group;
        const float l = l_s[r];
        out[static_cast<int64_t>(row0 + r / group) * shape.heads * hd + head * hd + d] =
            dev::FloatToBf16(l > 0.f ? acc[i] / l : 0.f);
      }
    }
    return;
  }
  // Every split writes its part, empty or not, so the combine never reads stale scratch.
  float* part =
      scratch + ((static_cast<int64_t>(tile) * shape.kv_heads + kvh) * num_splits + split) *
                    AttentionPartialFloats(rows_cap, hd);
#pragma unroll
  for (int i = 0; i < kAccPerThread; ++i) {
    const int e = tid + i * kAttnThreads;
    if (e < rows * hd) part[e] = acc[i];
  }
  for (int r = tid; r < rows; r += kAttnThreads) {
    part[rows_cap * hd + r] = m_s[r];
    part[rows_cap * hd + rows_cap + r] = l_s[r];
  }
}

__global__ void __launch_bounds__(kAttnThreads)
    PagedAttentionKernel(const float* __restrict__ q, const int32_t* __restrict__ tiles,
                         const int32_t* __restrict__ block_tables,
                         const uint16_t* __restrict__ cache, const uint8_t* __restrict__ kv_codes,
                         const float* __restrict__ kv_scales, AttentionShape shape, int rows_cap,
                         float* __restrict__ scratch, uint16_t* __restrict__ out) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(shape.head_dim);
  const int group = static_cast<int>(shape.heads / shape.kv_heads);
  const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int num_splits = gridDim.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  const int32_t* td = tiles + static_cast<int64_t>(tile) * kTileInts;
  const int row0 = td[0], num_q = td[1], pos0 = td[2], bt_offset = td[3], kv_len = td[4];
  const int rows = num_q * group;  // <= rows_cap (host contract)

  float* q_s = smem;
  float* k_s = q_s + rows_cap * hd;
  float* v_s = k_s + kKeys * (hd + 1);
  float* p_s = v_s + kKeys * hd;
  float* m_s = p_s + rows_cap * kKeys;
  float* l_s = m_s + rows_cap;
  float* alpha_s = l_s + rows_cap;

  // This split's key range: chunk-aligned parts of [0, kv_len).
  const int split_len = ((kv_len + num_splits - 1) / num_splits + kKeys - 1) / kKeys * kKeys;
  const int kv_begin = min(kv_len, split * split_len);
  const int kv_end = min(kv_len, kv_begin + split_len);

  // Row r is query token r / group, head kvh * group + r % group; q pre-scaled.
  for (int i = tid; i < rows * hd; i += kAttnThreads) {
    const int r = i / hd, d = i % hd;
    const int64_t head = static_cast<int64_t>(kvh) * group + r % group;
    q_s[i] =
        q[static_cast<int64_t>(row0 + r / group) * shape.q_stride + head * hd + d] * shape.scale;
  }
  for (int r = tid; r < rows_cap; r += kAttnThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
  }
  float acc[kAccPerThread];
#pragma unroll
  for (int i = 0; i < kAccPerThread; ++i) acc[i] = 0.f;

  for (int c0 = kv_begin; c0 < kv_end; c0 += kKeys) {
    __syncthreads();  // the previous chunk's k/v/p are no longer read
    StageKvChunk(block_tables + bt_offset, cache, kv_codes, kv_scales, shape, kvh, c0, kv_end,
                 k_s, v_s);
    __syncthreads();
    // Scores: a warp per row, a lane per key; then the online-softmax update of the row.
    for (int r = warp; r < rows; r += kAttnWarps) {
      const int query_pos = pos0 + r / group;
      const int p = c0 + lane;
      float score = -INFINITY;
      if (p < kv_end && p <= query_pos) {
        const float* qr = q_s + r * hd;
        const float* kr = k_s + lane * (hd + 1);
        float dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += qr[d] * kr[d];
        score = dot;
      }
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, dev::WarpMax(score));
      // Fully masked so far: nothing to scale, nothing to add (and no inf - inf).
      const float prob = score == -INFINITY ? 0.f : expf(score - m_new);
      const float alpha = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
      const float prob_sum = dev::WarpSum(prob);
      p_s[r * kKeys + lane] = prob;
      __syncwarp();  // all lanes have read m_s[r]
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + prob_sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i) {
      const int e = tid + i * kAttnThreads;
      if (e < rows * hd) {
        const int r = e / hd, d = e % hd;
        float a = acc[i] * alpha_s[r];
        const float* pr = p_s + r * kKeys;
#pragma unroll 8
        for (int j = 0; j < kKeys; ++j) a += pr[j] * v_s[j * hd + d];
        acc[i] = a;
      }
    }
  }
  __syncthreads();  // m_s / l_s final

  WriteTileOutput(acc, m_s, l_s, shape, tile, kvh, split, num_splits, row0, rows, rows_cap, scratch,
                  out);
}

// Merges the splits of one (tile, kv head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void __launch_bounds__(kAttnThreads)
    CombineSplitsKernel(const float* __restrict__ scratch, const int32_t* __restrict__ tiles,
                        AttentionShape shape, int rows_cap, int num_splits,
                        uint16_t* __restrict__ out) {
  const int hd = static_cast<int>(shape.head_dim);
  const int group = static_cast<int>(shape.heads / shape.kv_heads);
  const int tile = blockIdx.x, kvh = blockIdx.y;
  const int32_t* td = tiles + static_cast<int64_t>(tile) * kTileInts;
  const int row0 = td[0], rows = td[1] * group;
  const int64_t stride = AttentionPartialFloats(rows_cap, hd);
  const float* base =
      scratch + (static_cast<int64_t>(tile) * shape.kv_heads + kvh) * num_splits * stride;
  for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    float m_max = -INFINITY;
    for (int s = 0; s < num_splits; ++s) m_max = fmaxf(m_max, base[s * stride + rows_cap * hd + r]);
    float l_sum = 0.f, a_sum = 0.f;
    if (m_max != -INFINITY) {
      for (int s = 0; s < num_splits; ++s) {
        const float* part = base + s * stride;
        const float m = part[rows_cap * hd + r];
        if (m == -INFINITY) continue;
        const float w = expf(m - m_max);
        l_sum += part[rows_cap * hd + rows_cap + r] * w;
        a_sum += part[e] * w;
      }
    }
    const int64_t head = static_cast<int64_t>(kvh) * group + r % group;
    out[static_cast<int64_t>(row0 + r / group) * shape.heads * hd + head * hd + d] =
        dev::FloatToBf16(l_sum > 0.f ? a_sum / l_sum : 0.f);
  }
}

int RowsCap(int64_t group) { return AttentionTileTokens(group) * static_cast<int>(group); }

}  // namespace

int AttentionTileTokens(int64_t group) {
  return group >= kMaxRows ? 1 : static_cast<int>(kMaxRows / group);
}

int64_t AttentionScratchFloats(int64_t num_tiles, int64_t kv_heads, int64_t group, int64_t head_dim,
                               int num_splits) {
  if (num_splits <= 1) return 0;
  return num_tiles * kv_heads * num_splits * RowsCap(group) * (head_dim + 2);
}

cudaError_t PrepareKernels() {
  // The attention block needs more than the default 48 KiB of dynamic shared memory for
  // head_dim 128 and up: opt in for the largest shape the kernel accepts, or for what the
  // device allows (then only the largest head dims fail to launch, with an error).
  int device = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  const int wanted = static_cast<int>(AttentionSmemBytes(kMaxRows, kMaxHeadDim));
  e = cudaFuncSetAttribute(PagedAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           wanted < optin ? wanted : optin);
  if (e != cudaSuccess) return e;
  return PrepareAttentionTc(optin);
}

cudaError_t LaunchAttentionCombine(const float* scratch, const int32_t* tiles, int num_tiles,
                                   const AttentionShape& shape, int num_splits, uint16_t* out,
                                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(shape.kv_heads));
  CombineSplitsKernel<<<grid, kAttnThreads, 0, stream>>>(
      scratch, tiles, shape, RowsCap(shape.heads / shape.kv_heads), num_splits, out);
  return cudaGetLastError();
}

namespace {

cudaError_t PagedAttention(const float* q, const int32_t* tiles, int num_tiles,
                           const int32_t* block_tables, const uint16_t* cache_layer,
                           const Fp8KvLayer& fp8, const AttentionShape& shape, int num_splits,
                           float* scratch, uint16_t* out, cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  if (shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0 || shape.head_dim <= 0 ||
      shape.head_dim > kMaxHeadDim || shape.heads / shape.kv_heads > kMaxGqaGroup ||
      num_splits < 1 || num_splits > 65535 || shape.kv_heads > 65535 ||
      (num_splits > 1 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int group = static_cast<int>(shape.heads / shape.kv_heads);
  const int rows_cap = RowsCap(group);
  const int hd = static_cast<int>(shape.head_dim);
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(shape.kv_heads),
                  static_cast<unsigned>(num_splits));
  PagedAttentionKernel<<<grid, kAttnThreads, AttentionSmemBytes(rows_cap, hd), stream>>>(
      q, tiles, block_tables, cache_layer, fp8.codes, fp8.scales, shape, rows_cap, scratch, out);
  if (num_splits > 1) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return LaunchAttentionCombine(scratch, tiles, num_tiles, shape, num_splits, out, stream);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPagedAttention(const float* q, const int32_t* tiles, int num_tiles,
                                 const int32_t* block_tables, const uint16_t* cache_layer,
                                 const AttentionShape& shape, int num_splits, float* scratch,
                                 uint16_t* out, cudaStream_t stream) {
  return PagedAttention(q, tiles, num_tiles, block_tables, cache_layer, Fp8KvLayer{}, shape,
                        num_splits, scratch, out, stream);
}

cudaError_t LaunchPagedAttentionFp8(const float* q, const int32_t* tiles, int num_tiles,
                                    const int32_t* block_tables, Fp8KvLayer cache_layer,
                                    const AttentionShape& shape, int num_splits, float* scratch,
                                    uint16_t* out, cudaStream_t stream) {
  if (cache_layer.codes == nullptr || cache_layer.scales == nullptr) return cudaErrorInvalidValue;
  return PagedAttention(q, tiles, num_tiles, block_tables, nullptr, cache_layer, shape, num_splits,
                        scratch, out, stream);
}

}  // namespace glmserve::cuda
