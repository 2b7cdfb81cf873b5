// GLM-5's multi-head latent attention on the device (docs/glm5.md, core/cpu/ops/mla.h for the
// CPU form): the RoPE / latent-norm / cache-write pass and the absorbed attention over the
// paged latent cache. Plain CUDA-core kernels (one block per token and head); a FlashMLA-style
// tensor-core decode is a follow-up (docs/cuda.md).
#include "core/cuda/device_util.cuh"
#include "core/cuda/fp8_device.cuh"
#include "core/cuda/kernels.h"

namespace glmserve::cuda {
namespace {

constexpr int kMlaThreads = 256;

// Cache row of `slot` (block * block_size + offset) in a latent layer: one row kind, so the
// layer is [num_blocks * block_size, row_width].
__device__ __forceinline__ int64_t RowBase(int64_t slot, const MlaShape& s) {
  return slot * s.row_width();
}

// One block per token. smem: cos [dr / 2], sin [dr / 2], rotated q [H, dr], latent staging [R].
__global__ void __launch_bounds__(kMlaThreads)
    MlaRopeLatentKernel(float* __restrict__ q, const float* __restrict__ kv_a, MlaShape s,
                        const float* __restrict__ kv_norm, float eps,
                        const float* __restrict__ inv_freq, const int32_t* __restrict__ positions,
                        const int32_t* __restrict__ slots, uint16_t* __restrict__ cache_layer) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int half = static_cast<int>(s.rope_dim / 2);
  const int dr = static_cast<int>(s.rope_dim), heads = static_cast<int>(s.heads);
  const int64_t qk = s.qk_dim(), r = s.latent_dim;
  float* cos_s = smem;
  float* sin_s = smem + half;
  float* rot = smem + 2 * half;  // [H + 1, dr]: every q head's rotary part, then k_rot
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    rowmath::RopeCosSin(positions[t], inv_freq[i], &cos_s[i], &sin_s[i]);
  }
  __syncthreads();
  float* qt = q + t * heads * qk;
  const float* kvt = kv_a + t * (r + dr);
  // Rotate into shared memory first: a pair's two outputs land in other threads' inputs.
  for (int i = threadIdx.x; i < (heads + 1) * half; i += blockDim.x) {
    const int h = i / half, j = i % half;
    const float* v = h < heads ? qt + h * qk + s.nope_dim : kvt + r;
    rowmath::RotatePair(v[2 * j], v[2 * j + 1], cos_s[j], sin_s[j], &rot[h * dr + j],
                        &rot[h * dr + j + half]);
  }
  float squares = 0.f;
  for (int64_t c = threadIdx.x; c < r; c += blockDim.x) squares += kvt[c] * kvt[c];
  const float inv = rowmath::RmsInvScale(dev::BlockSum(squares, scratch), r, eps);  // syncs
  for (int i = threadIdx.x; i < heads * dr; i += blockDim.x) {
    qt[(i / dr) * qk + s.nope_dim + i % dr] = rot[i];
  }
  const int32_t slot = slots[t];
  if (slot < 0) return;
  uint16_t* row = cache_layer + RowBase(slot, s);
  for (int64_t c = threadIdx.x; c < r; c += blockDim.x) {
    row[c] = dev::FloatToBf16(kv_norm[c] * (kvt[c] * inv));
  }
  for (int i = threadIdx.x; i < dr; i += blockDim.x) {
    row[r + i] = dev::FloatToBf16(rot[heads * dr + i]);
  }
}

// grid (tiles, H). smem: q_nope [dn], q_rot [dr], q_lat [R], o_lat [R]. Each thread owns the
// latent channels c = threadIdx.x + k * blockDim.x of o_lat; the score of a key is one block
// reduction, so every thread holds the same running max and sum (online softmax).
__global__ void __launch_bounds__(kMlaThreads)
    MlaAttentionKernel(const float* __restrict__ q, const int32_t* __restrict__ tiles,
                       const int32_t* __restrict__ block_tables,
                       const uint16_t* __restrict__ cache_layer, const uint16_t* __restrict__ kv_b,
                       Fp8DeviceMatrix kv_b8, MlaShape s, const int32_t* __restrict__ sel_count,
                       const int32_t* __restrict__ sel_pos, int64_t sel_stride,
                       uint16_t* __restrict__ out) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  const int64_t dn = s.nope_dim, dr = s.rope_dim, dv = s.v_dim, r = s.latent_dim;
  const int64_t qk = s.qk_dim(), h = blockIdx.y;
  float* q_nope = smem;
  float* q_rot = q_nope + dn;
  float* q_lat = q_rot + dr;
  float* o_lat = q_lat + r;
  const int32_t* tile = tiles + blockIdx.x * kTileInts;
  const int32_t row0 = tile[0], num_q = tile[1], pos0 = tile[2], bt_offset = tile[3];
  const int32_t kv_len = tile[4];
  const int64_t uk_row = h * (dn + dv);  // W_uk[h]: rows [uk_row, + dn); W_uv[h]: the dv after
  for (int32_t i = 0; i < num_q; ++i) {
    const int64_t t = row0 + i;
    uint16_t* o = out + (t * s.heads + h) * dv;
    if (kv_len == 0) {  // padding row
      for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) o[j] = 0;
      continue;
    }
    const int64_t pos = pos0 + i;
    const float* qt = q + (t * s.heads + h) * qk;
    __syncthreads();  // the previous token's readers of the shared vectors are done
    for (int64_t c = threadIdx.x; c < qk; c += blockDim.x) {
      if (c < dn) {
        q_nope[c] = qt[c];
      } else {
        q_rot[c - dn] = qt[c];
      }
    }
    __syncthreads();
    // q_lat[c] = sum_i W_uk[i, c] q_nope[i]: threads over c read rows of W_uk coalesced.
    for (int64_t c = threadIdx.x; c < r; c += blockDim.x) {
      float acc = 0.f;
      for (int64_t d = 0; d < dn; ++d)
        acc += dev::Bf16OrFp8At(kv_b, kv_b8, uk_row + d, c) * q_nope[d];
      q_lat[c] = acc;
      o_lat[c] = 0.f;
    }
    __syncthreads();
    const int32_t count = sel_count != nullptr ? sel_count[t] : -1;
    const int64_t n = count < 0 ? pos + 1 : count;
    const int32_t* list = sel_pos + t * sel_stride;
    float m = -INFINITY, l = 0.f;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t p = count < 0 ? k : list[k];
      const int64_t slot =
          static_cast<int64_t>(block_tables[bt_offset + p / s.block_size]) * s.block_size +
          p % s.block_size;
      const uint16_t* key = cache_layer + RowBase(slot, s);
      float part = 0.f;
      for (int64_t c = threadIdx.x; c < r + dr; c += blockDim.x) {
        const float kc = dev::Bf16ToFloat(key[c]);
        part += c < r ? q_lat[c] * kc : q_rot[c - r] * kc;
      }
      const float score = dev::BlockSum(part, scratch) * s.scale;
      const float m_new = fmaxf(m, score);
      const float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
      const float e = expf(score - m_new);
      l = l * correction + e;
      m = m_new;
      for (int64_t c = threadIdx.x; c < r; c += blockDim.x) {
        o_lat[c] = o_lat[c] * correction + e * dev::Bf16ToFloat(key[c]);
      }
    }
    const float inv_l = 1.0f / l;
    for (int64_t c = threadIdx.x; c < r; c += blockDim.x) o_lat[c] *= inv_l;
    __syncthreads();
    // out[j] = W_uv[j, :] . o_lat
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
      float acc = 0.f;
      for (int64_t c = 0; c < r; ++c)
        acc += dev::Bf16OrFp8At(kv_b, kv_b8, uk_row + dn + j, c) * o_lat[c];
      o[j] = dev::FloatToBf16(acc);
    }
  }
}

}  // namespace

cudaError_t LaunchMlaRopeLatentWrite(float* q, const float* kv_a, int64_t tokens,
                                     const MlaShape& shape, const float* kv_norm, float eps,
                                     const float* inv_freq, const int32_t* positions,
                                     const int32_t* slots, uint16_t* cache_layer,
                                     cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (shape.rope_dim % 2 != 0 || shape.block_size <= 0) return cudaErrorInvalidValue;
  const size_t smem = sizeof(float) * (shape.rope_dim + (shape.heads + 1) * shape.rope_dim);
  MlaRopeLatentKernel<<<static_cast<unsigned>(tokens), kMlaThreads, smem, stream>>>(
      q, kv_a, shape, kv_norm, eps, inv_freq, positions, slots, cache_layer);
  return cudaGetLastError();
}

cudaError_t LaunchMlaAttention(const float* q, const int32_t* tiles, int num_tiles,
                               const int32_t* block_tables, const uint16_t* cache_layer,
                               const uint16_t* kv_b, const Fp8DeviceMatrix& kv_b8,
                               const MlaShape& shape, const int32_t* sel_count,
                               const int32_t* sel_pos, int64_t sel_stride, uint16_t* out,
                               cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  if (shape.heads <= 0 || shape.heads > 65535 || shape.block_size <= 0 ||
      (sel_count != nullptr && sel_pos == nullptr) ||
      (kv_b == nullptr) == (kv_b8.codes == nullptr)) {
    return cudaErrorInvalidValue;
  }
  // The kernel indexes kv_b's rows by kv_b8.cols (the bf16 form passes a shape-only matrix).
  Fp8DeviceMatrix w = kv_b8;
  if (w.codes == nullptr) {
    w.rows = shape.heads * (shape.nope_dim + shape.v_dim);
    w.cols = shape.latent_dim;
  } else if (w.rows != shape.heads * (shape.nope_dim + shape.v_dim) || w.cols != shape.latent_dim ||
             w.block_rows <= 0 || w.block_cols <= 0) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(float) * (shape.nope_dim + shape.rope_dim + 2 * shape.latent_dim);
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(shape.heads));
  MlaAttentionKernel<<<grid, kMlaThreads, smem, stream>>>(
      q, tiles, block_tables, cache_layer, kv_b, w, shape, sel_count, sel_pos, sel_stride, out);
  return cudaGetLastError();
}

}  // namespace glmserve::cuda
