// CudaModel's GLM-5 attention sub-block (docs/glm5.md): the MLA projections through cuBLAS,
// the latent-cache write, the DSA indexer on "full" layers and the absorbed attention over
// the selected keys (kernels in mla.cu and dsa_indexer.cu). FP8 GLM-5: the projections through
// fp8_linear.cu's kernels from the same bf16 inputs (as GLM-4.5's FP8 layers), kv_b read as
// FP8 by the attention kernel. A "shared" layer reuses the
// selection (a_.sel_count / a_.sel_pos) the previous full layer of the same step left.
#include <algorithm>
#include <cmath>

#include "core/base/status_macros.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {
namespace {

GemmOperand Bf16(const uint16_t* data, int64_t ld) { return {data, CUDA_R_16BF, ld}; }
GemmOperand F32(const float* data, int64_t ld) { return {data, CUDA_R_32F, ld}; }

// q_a_layernorm, kv_a_layernorm and the indexer's k_norm use fixed eps 1e-6 in the reference
// (GlmMoeDsaRMSNorm's class default, nn.LayerNorm(eps=1e-6)), not rms_norm_eps.
constexpr float kLatentEps = 1e-6f;

// y[t, :rows] (row stride ldy) = x [t, cols] (bf16) W^T, W [rows, cols]: bf16 through cuBLAS,
// or FP8 (w8's codes set) through LaunchFp8LinearBf16.
absl::Status Project(cublasHandle_t cublas, const uint16_t* w, const Fp8DeviceMatrix& w8,
                     int64_t rows, int64_t cols, const uint16_t* x, int64_t t, float* y,
                     int64_t ldy, cudaStream_t stream) {
  if (w8.codes != nullptr) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8LinearBf16(x, t, w8, y, ldy, stream));
    return absl::OkStatus();
  }
  return Gemm(cublas, Bf16(w, cols), rows, cols, Bf16(x, cols), t, y, CUDA_R_32F, ldy);
}

}  // namespace

absl::Status CudaModel::EnqueueMla(int64_t layer, KvCache* cache) {
  const ModelConfig& c = config_;
  const DeviceMla& m = weights_.layers[layer].mla;
  const int64_t t = plan_.tokens, hidden = c.hidden_size, q_rank = c.q_lora_rank;
  const int64_t r = c.kv_lora_rank, dr = c.qk_rope_head_dim, heads = c.num_attention_heads;
  const int64_t q_width = heads * c.qk_head_dim(), out_width = heads * c.v_head_dim;
  cudaStream_t stream = stream_.get();
  uint16_t* cache_layer =
      static_cast<uint16_t*>(cache->storage()) + cache->ElementOffset(layer, 0, 0);
  const MlaShape shape = MlaShapeOf(c, cache->shape().block_size);

  // q_resid = RMSNorm(x q_a^T) (bf16 for the next GEMMs); q = q_resid q_b^T  [T, H, dn + dr]
  RETURN_IF_ERROR(
      Project(cublas_.get(), m.q_a, m.q_a8, q_rank, hidden, a_.x, t, a_.q_a, q_rank, stream));
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.q_a, nullptr, m.q_a_norm, t, q_rank, kLatentEps,
                                            nullptr, a_.q_resid, nullptr, stream));
  RETURN_IF_ERROR(Project(cublas_.get(), m.q_b, m.q_b8, q_width, q_rank, a_.q_resid, t, a_.mla_q,
                          q_width, stream));
  // kv = x kv_a^T  [T, R + dr]; RoPE on q_rot and k_rot, RMSNorm on the latent, cache write.
  RETURN_IF_ERROR(
      Project(cublas_.get(), m.kv_a, m.kv_a8, r + dr, hidden, a_.x, t, a_.kv_a, r + dr, stream));
  GLM_CUDA_RETURN_IF_ERROR(LaunchMlaRopeLatentWrite(
      a_.mla_q, a_.kv_a, t, shape, m.kv_a_norm, kLatentEps, weights_.inv_freq,
      meta(meta_layout_.positions()), meta(meta_layout_.slots()), cache_layer, stream));
  if (m.has_indexer()) RETURN_IF_ERROR(EnqueueIndexer(layer, cache_layer, shape));
  // Without any indexer layer in the span every token attends to all its causal keys. Steps
  // the tensor-core scratch covers take mla_tc.cu's kernels, larger ones mla.cu's.
  if (plan_.tokens <= mla_tc_tokens()) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchMlaAttentionTc(
        a_.mla_q, plan_.tokens, meta(meta_layout_.tiles()), static_cast<int>(plan_.num_tiles),
        meta(meta_layout_.block_tables()), cache_layer, m.kv_b, m.kv_b8, shape,
        has_indexer_ ? a_.sel_count : nullptr, a_.sel_pos, c.index_topk, mla_tc_layout_,
        mla_tc_scratch_, a_.attn, stream));
  } else {
    GLM_CUDA_RETURN_IF_ERROR(LaunchMlaAttention(
        a_.mla_q, meta(meta_layout_.tiles()), static_cast<int>(plan_.num_tiles),
        meta(meta_layout_.block_tables()), cache_layer, m.kv_b, m.kv_b8, shape,
        has_indexer_ ? a_.sel_count : nullptr, a_.sel_pos, c.index_topk, a_.attn, stream));
  }
  RETURN_IF_ERROR(
      Project(cublas_.get(), m.o, m.o8, hidden, out_width, a_.attn, t, a_.delta, hidden, stream));
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueIndexer(int64_t layer, uint16_t* cache_layer, const MlaShape& mla) {
  const ModelConfig& c = config_;
  const DeviceMla& m = weights_.layers[layer].mla;
  const int64_t t = plan_.tokens, hidden = c.hidden_size, q_rank = c.q_lora_rank;
  const int64_t hi = c.index_n_heads, di = c.index_head_dim;
  cudaStream_t stream = stream_.get();
  const IndexerShape shape = IndexerShapeOf(c);
  // iq = q_resid wq_b^T [T, Hi * Di]; ik = x wk^T [T, Di]; w = x32 weights_proj^T [T, Hi] (fp32)
  RETURN_IF_ERROR(Project(cublas_.get(), m.wq_b, m.wq_b8, hi * di, q_rank, a_.q_resid, t, a_.iq,
                          hi * di, stream));
  RETURN_IF_ERROR(Project(cublas_.get(), m.wk, m.wk8, di, hidden, a_.x, t, a_.ik, di, stream));
  RETURN_IF_ERROR(Gemm(cublas_.get(), F32(m.weights_proj, hidden), hi, hidden, F32(a_.x32, hidden),
                       t, a_.iw, CUDA_R_32F, hi));
  GLM_CUDA_RETURN_IF_ERROR(LaunchIndexerPrepare(
      a_.iq, a_.ik, a_.iw, t, shape, mla, m.k_norm, m.k_norm_bias, kLatentEps, weights_.inv_freq,
      meta(meta_layout_.positions()), meta(meta_layout_.slots()), cache_layer, stream));
  // Scores of at most kIndexerTiles tiles at a time: scratch bounded by that x the stride
  // (the longest context, or a graph's fixed bound: Forward).
  const int64_t max_kv = std::max<int64_t>(index_stride_, 1);
  for (int64_t first = 0; first < plan_.num_tiles; first += kIndexerTiles) {
    const int64_t last = std::min(plan_.num_tiles, first + kIndexerTiles);
    GLM_CUDA_RETURN_IF_ERROR(LaunchIndexerTopk(
        a_.iq, a_.iw, meta(meta_layout_.tiles()), static_cast<int>(first), static_cast<int>(last),
        max_kv, meta(meta_layout_.block_tables()), cache_layer, shape, mla,
        index_scores_.as<float>(), a_.sel_count, a_.sel_pos, stream));
  }
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
