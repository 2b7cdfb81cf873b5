// QK-norm fused with partial NeoX RoPE and the KV-cache write: one pass over the fused q|k|v
// projection output of each token.
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_util.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kRopeThreads = 256;
constexpr int kRopeWarps = kRopeThreads / 32;
constexpr int kPerLane = static_cast<int>(kMaxHeadDim / 32);

// The FP8 cache write of kv head `kvh` for one token (a warp): its roped k row (`k`, kPerLane
// values a lane) and its v row (from `row` + bias), each scaled by amax / 448 of its finite
// values, as core/model/kv_fp8.cc EncodeKvRow.
__device__ __forceinline__ void WriteKvFp8(const float (&k)[kPerLane], const float* row,
                                           const float* __restrict__ bias, const QkvShape& shape,
                                           int64_t kvh, int32_t slot, int64_t block_size,
                                           uint8_t* __restrict__ kv_codes,
                                           float* __restrict__ kv_scales) {
  const int hd = static_cast<int>(shape.head_dim);
  const int lane = threadIdx.x & 31;
  const int64_t q_dim = shape.heads * hd, kv_dim = shape.kv_heads * hd;
  const int64_t v_col = q_dim + kv_dim + kvh * hd;
  float vv[kPerLane];
  float k_amax = 0.f, v_amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    vv[i] = 0.f;
    if (d < hd) {
      vv[i] = row[v_col + d] + (bias != nullptr ? bias[v_col + d] : 0.f);
      // Finite values only (NaN and inf compare false): the host skips them too.
      if (fabsf(k[i]) <= 3.40282347e+38f) k_amax = fmaxf(k_amax, fabsf(k[i]));
      if (fabsf(vv[i]) <= 3.40282347e+38f) v_amax = fmaxf(v_amax, fabsf(vv[i]));
    }
  }
  const float k_scale = dev::KvScale(dev::WarpMax(k_amax));
  const float v_scale = dev::KvScale(dev::WarpMax(v_amax));
  // [2, block_size] rows per block: key row `key_row`, value row block_size later.
  const int64_t key_row = (slot / block_size) * 2 * block_size + slot % block_size;
  uint8_t* k_dst = kv_codes + key_row * kv_dim + kvh * hd;
  uint8_t* v_dst = k_dst + block_size * kv_dim;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) {
      k_dst[d] = dev::FloatToE4m3(k[i] / k_scale);
      v_dst[d] = dev::FloatToE4m3(vv[i] / v_scale);
    }
  }
  if (lane == 0) {
    kv_scales[key_row * shape.kv_heads + kvh] = k_scale;
    kv_scales[(key_row + block_size) * shape.kv_heads + kvh] = v_scale;
  }
}

// One block per token; each warp takes whole heads (q heads, then kv heads, whose warp also
// moves the matching v head). The head vector is staged in a per-warp shared row so that a
// lane can read its rotation partner (channel i pairs with i + rotary_dim / 2).
// The cache is bf16 (cache_layer) or FP8 (kv_codes / kv_scales set, cache_layer null: each
// (token, KV head) row encoded from its own fp32 values, as core/model/kv_fp8.cc EncodeKvRow).
__global__ void __launch_bounds__(kRopeThreads)
    QkNormRopeKvKernel(float* __restrict__ qkv, QkvShape shape, const float* __restrict__ bias,
                       const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                       float eps, const float* __restrict__ inv_freq,
                       const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                       uint16_t* __restrict__ cache_layer, uint8_t* __restrict__ kv_codes,
                       float* __restrict__ kv_scales, int64_t block_size) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(shape.head_dim);
  const int half = static_cast<int>(shape.rotary_dim / 2);
  float* cos_s = smem;
  float* sin_s = smem + half;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wrow = smem + 2 * half + warp * hd;

  const int64_t t = blockIdx.x;
  const int32_t position = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    rowmath::RopeCosSin(position, inv_freq[i], &cos_s[i], &sin_s[i]);
  }
  __syncthreads();

  const int heads = static_cast<int>(shape.heads), kv_heads = static_cast<int>(shape.kv_heads);
  const int64_t q_dim = shape.heads * hd, kv_dim = shape.kv_heads * hd;
  float* row = qkv + t * shape.row_stride();
  const int32_t slot = slots[t];
  // The slot's key row inside the layer: block b holds [k rows (block_size), v rows].
  const int64_t key_base =
      slot >= 0 ? ((slot / block_size) * 2 * block_size + slot % block_size) * kv_dim : 0;

  for (int hs = warp; hs < heads + kv_heads; hs += kRopeWarps) {
    const bool is_q = hs < heads;
    const int64_t col0 = is_q ? static_cast<int64_t>(hs) * hd : q_dim + (hs - heads) * hd;
    const float* gain = is_q ? q_norm : k_norm;
    float v[kPerLane];
    float squares = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      v[i] = 0.f;
      if (d < hd) {
        v[i] = row[col0 + d] + (bias != nullptr ? bias[col0 + d] : 0.f);
        squares += v[i] * v[i];
      }
    }
    if (gain != nullptr) {  // QK-norm: RMSNorm over the head, before RoPE
      const float inv = rowmath::RmsInvScale(dev::WarpSum(squares), hd, eps);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) v[i] = gain[d] * (v[i] * inv);
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) wrow[d] = v[i];
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < 2 * half) {
        const int j = d < half ? d : d - half;  // the pair (j, j + half)
        float a, b;
        rowmath::RotatePair(wrow[j], wrow[j + half], cos_s[j], sin_s[j], &a, &b);
        v[i] = d < half ? a : b;
      }
    }
    __syncwarp();  // every lane has read wrow before the next head overwrites it
    if (is_q) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) row[col0 + d] = v[i];
      }
    } else if (slot >= 0 && kv_codes != nullptr) {
      WriteKvFp8(v, row, bias, shape, hs - heads, slot, block_size, kv_codes, kv_scales);
    } else if (slot >= 0) {
      const int64_t kvh = hs - heads;
      uint16_t* k_dst = cache_layer + key_base + kvh * hd;
      uint16_t* v_dst = k_dst + block_size * kv_dim;
      const int64_t v_col = q_dim + kv_dim + kvh * hd;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) {
          k_dst[d] = dev::FloatToBf16(v[i]);
          v_dst[d] = dev::FloatToBf16(row[v_col + d] + (bias != nullptr ? bias[v_col + d] : 0.f));
        }
      }
    }
  }
}

cudaError_t QkNormRopeKv(float* qkv, int64_t tokens, const QkvShape& shape, const float* bias,
                         const float* q_norm, const float* k_norm, float eps, const float* inv_freq,
                         const int32_t* positions, const int32_t* slots, uint16_t* cache_layer,
                         Fp8KvLayer fp8, int64_t block_size, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.rotary_dim > shape.head_dim ||
      (q_norm == nullptr) != (k_norm == nullptr) ||
      (fp8.codes == nullptr) != (fp8.scales == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(float) * (shape.rotary_dim + kRopeWarps * shape.head_dim);
  QkNormRopeKvKernel<<<static_cast<unsigned>(tokens), kRopeThreads, smem, stream>>>(
      qkv, shape, bias, q_norm, k_norm, eps, inv_freq, positions, slots, cache_layer, fp8.codes,
      fp8.scales, block_size);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchQkNormRopeKvFp8(float* qkv, int64_t tokens, const QkvShape& shape,
                                  const float* bias, const float* q_norm, const float* k_norm,
                                  float eps, const float* inv_freq, const int32_t* positions,
                                  const int32_t* slots, Fp8KvLayer cache_layer, int64_t block_size,
                                  cudaStream_t stream) {
  if (cache_layer.codes == nullptr) return cudaErrorInvalidValue;
  return QkNormRopeKv(qkv, tokens, shape, bias, q_norm, k_norm, eps, inv_freq, positions, slots,
                      nullptr, cache_layer, block_size, stream);
}

cudaError_t LaunchQkNormRopeKv(float* qkv, int64_t tokens, const QkvShape& shape, const float* bias,
                               const float* q_norm, const float* k_norm, float eps,
                               const float* inv_freq, const int32_t* positions,
                               const int32_t* slots, uint16_t* cache_layer, int64_t block_size,
                               cudaStream_t stream) {
  return QkNormRopeKv(qkv, tokens, shape, bias, q_norm, k_norm, eps, inv_freq, positions, slots,
                      cache_layer, Fp8KvLayer{}, block_size, stream);
}

}  // namespace glmserve::cuda
