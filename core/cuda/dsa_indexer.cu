// GLM-5's DSA indexer on the device (core/cpu/ops/dsa_indexer.h has the math and the CPU form):
// the per-token preparation (query RoPE, key LayerNorm + RoPE + cache write, head weights) and
// the scoring + top-k selection with the CPU's tie rule (the lower position wins).
#include "core/cuda/device_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kIndexerThreads = 256;

// One block per token. smem: cos [dr / 2], sin [dr / 2], rotated [Hi + 1, dr], normed key [Di].
__global__ void __launch_bounds__(kIndexerThreads)
    IndexerPrepareKernel(float* __restrict__ iq, const float* __restrict__ ik,
                         float* __restrict__ w, IndexerShape s, MlaShape mla,
                         const float* __restrict__ ln_gain, const float* __restrict__ ln_bias,
                         float eps, const float* __restrict__ inv_freq,
                         const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                         uint16_t* __restrict__ cache_layer) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int half = static_cast<int>(s.rope_dim / 2), dr = static_cast<int>(s.rope_dim);
  const int heads = static_cast<int>(s.heads);
  const int64_t di = s.head_dim;
  float* cos_s = smem;
  float* sin_s = smem + half;
  float* rot = smem + 2 * half;            // [Hi + 1, dr]
  float* normed = rot + (heads + 1) * dr;  // [Di]
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    rowmath::RopeCosSin(positions[t], inv_freq[i], &cos_s[i], &sin_s[i]);
  }
  // nn.LayerNorm(Di): biased variance, two passes.
  const float* kt = ik + t * di;
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) sum += kt[c];
  const float mean = dev::BlockSum(sum, scratch) / static_cast<float>(di);  // syncs (cos, sin)
  float sq = 0.f;
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) sq += (kt[c] - mean) * (kt[c] - mean);
  const float var = dev::BlockSum(sq, scratch) / static_cast<float>(di);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) {
    normed[c] = (kt[c] - mean) * inv * ln_gain[c] + ln_bias[c];
  }
  __syncthreads();
  float* qt = iq + t * heads * di;
  for (int i = threadIdx.x; i < (heads + 1) * half; i += blockDim.x) {
    const int h = i / half, j = i % half;
    const float* v = h < heads ? qt + h * di : normed;
    rowmath::RotatePair(v[2 * j], v[2 * j + 1], cos_s[j], sin_s[j], &rot[h * dr + j],
                        &rot[h * dr + j + half]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < heads * dr; i += blockDim.x) qt[(i / dr) * di + i % dr] = rot[i];
  const float head_scale = 1.0f / sqrtf(static_cast<float>(heads));
  for (int i = threadIdx.x; i < heads; i += blockDim.x) w[t * heads + i] *= head_scale;
  const int32_t slot = slots[t];
  if (slot < 0) return;
  uint16_t* key = cache_layer + slot * mla.row_width() + mla.index_offset();
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) {
    key[c] = dev::FloatToBf16(c < dr ? rot[heads * dr + c] : normed[c]);
  }
}

// Scores as unsigned keys whose order is the floats' order (-0 is made +0 first, so equal
// floats get equal keys).
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Count of scores[0, n) whose key is >= `bound` (every thread gets it; counts stay below 2^24
// so the float block sum is exact).
__device__ int64_t CountAtLeast(const float* scores, int64_t n, uint32_t bound, float* scratch) {
  float c = 0.f;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) c += OrderedKey(scores[p]) >= bound;
  return static_cast<int64_t>(dev::BlockSum(c, scratch));
}

// grid (tile_end - tile_begin). smem: the token's iq [Hi * Di] and w [Hi].
__global__ void __launch_bounds__(kIndexerThreads)
    IndexerTopkKernel(const float* __restrict__ iq, const float* __restrict__ w,
                      const int32_t* __restrict__ tiles, int tile_begin, int64_t max_kv_len,
                      const int32_t* __restrict__ block_tables,
                      const uint16_t* __restrict__ cache_layer, IndexerShape s, MlaShape mla,
                      float* __restrict__ scores_all, int32_t* __restrict__ sel_count,
                      int32_t* __restrict__ sel_pos) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int64_t hi = s.heads, di = s.head_dim, k = s.topk;
  float* q_s = smem;            // [Hi, Di]
  float* w_s = smem + hi * di;  // [Hi]
  float* scores = scores_all + blockIdx.x * max_kv_len;
  const int32_t* tile = tiles + (tile_begin + blockIdx.x) * kTileInts;
  const int32_t row0 = tile[0], num_q = tile[1], pos0 = tile[2], bt_offset = tile[3];
  const float scale = 1.0f / sqrtf(static_cast<float>(di));
  for (int32_t i = 0; i < num_q; ++i) {
    const int64_t t = row0 + i, n = pos0 + i + 1;
    if (tile[4] == 0 || n <= k) {  // padding, or every causal key is kept
      if (threadIdx.x == 0) sel_count[t] = -1;
      continue;
    }
    __syncthreads();  // the previous token is done with q_s, w_s and scores
    for (int64_t c = threadIdx.x; c < hi * di; c += blockDim.x) q_s[c] = iq[t * hi * di + c];
    for (int64_t c = threadIdx.x; c < hi; c += blockDim.x) w_s[c] = w[t * hi + c];
    __syncthreads();
    for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
      const int64_t slot =
          static_cast<int64_t>(block_tables[bt_offset + p / mla.block_size]) * mla.block_size +
          p % mla.block_size;
      const uint16_t* key = cache_layer + slot * mla.row_width() + mla.index_offset();
      float sum = 0.f;  // heads in ascending order, as the CPU
      for (int64_t h = 0; h < hi; ++h) {
        float dot = 0.f;
        for (int64_t d = 0; d < di; ++d) dot += q_s[h * di + d] * dev::Bf16ToFloat(key[d]);
        sum += w_s[h] * fmaxf(dot * scale, 0.f);
      }
      scores[p] = sum;
    }
    __syncthreads();
    // The k-th largest key, bit by bit from the top: the largest bound with >= k keys at or
    // above it.
    uint32_t bound = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = bound | (1u << bit);
      if (CountAtLeast(scores, n, candidate, scratch) >= k) bound = candidate;
    }
    // Keys above the bound are all taken; of those equal to it, the lowest positions.
    if (threadIdx.x == 0) {
      int64_t above = 0;
      for (int64_t p = 0; p < n; ++p) above += OrderedKey(scores[p]) > bound;
      int64_t ties = k - above, out = 0;
      int32_t* list = sel_pos + t * k;
      for (int64_t p = 0; p < n && out < k; ++p) {
        const uint32_t key = OrderedKey(scores[p]);
        if (key > bound || (key == bound && ties-- > 0)) list[out++] = static_cast<int32_t>(p);
      }
      sel_count[t] = static_cast<int32_t>(k);
    }
  }
}

}  // namespace

cudaError_t LaunchIndexerPrepare(float* iq, float* ik, float* w, int64_t tokens,
                                 const IndexerShape& shape, const MlaShape& mla,
                                 const float* ln_gain, const float* ln_bias, float eps,
                                 const float* inv_freq, const int32_t* positions,
                                 const int32_t* slots, uint16_t* cache_layer, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (shape.rope_dim % 2 != 0 || shape.rope_dim > shape.head_dim) return cudaErrorInvalidValue;
  const size_t smem =
      sizeof(float) * (shape.rope_dim + (shape.heads + 1) * shape.rope_dim + shape.head_dim);
  IndexerPrepareKernel<<<static_cast<unsigned>(tokens), kIndexerThreads, smem, stream>>>(
      iq, ik, w, shape, mla, ln_gain, ln_bias, eps, inv_freq, positions, slots, cache_layer);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerTopk(const float* iq, const float* w, const int32_t* tiles, int tile_begin,
                              int tile_end, int64_t max_kv_len, const int32_t* block_tables,
                              const uint16_t* cache_layer, const IndexerShape& shape,
                              const MlaShape& mla, float* scores, int32_t* sel_count,
                              int32_t* sel_pos, cudaStream_t stream) {
  if (tile_end <= tile_begin) return cudaSuccess;
  if (shape.topk <= 0 || max_kv_len <= 0 || mla.block_size <= 0) return cudaErrorInvalidValue;
  const size_t smem = sizeof(float) * (shape.heads * shape.head_dim + shape.heads);
  IndexerTopkKernel<<<static_cast<unsigned>(tile_end - tile_begin), kIndexerThreads, smem,
                      stream>>>(iq, w, tiles, tile_begin, max_kv_len, block_tables, cache_layer,
                                shape, mla, scores, sel_count, sel_pos);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
