// CudaModel's per-step work: the embedding, each decoder layer (attention and FFN / MoE
// blocks) and the logits head, enqueued on the model's stream. FP8 projections (docs/fp8.md)
// take fp8_linear.cu's kernels on the same bf16 inputs and fp32 outputs as the cuBLAS GEMMs
// of the bf16 ones, writing their columns of the fused outputs (qkv, gate_up). Nothing here waits
// for the device: MoE layers of any size run over the device-side per-expert counts (the
// grouped tensor-core GEMMs for bf16 and FP8 experts alike), except the FP8 fallback of
// EnqueueMoe (scale blocks the grouped GEMM does not serve), which reads the counts back to
// size its per-expert FP8 GEMMs (steps captured as CUDA graphs never take it).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/cuda/model.h"

namespace glmserve::cuda {
namespace {

GemmOperand Bf16(const uint16_t* data, int64_t ld) { return {data, CUDA_R_16BF, ld}; }
GemmOperand F32(const float* data, int64_t ld) { return {data, CUDA_R_32F, ld}; }

// Routed expert e of a layer's stacked FP8 experts (expert 0's matrix, device_weights.h).
Fp8DeviceMatrix Expert(Fp8DeviceMatrix m, int64_t e) {
  const int64_t scale_rows = (m.rows + m.block_rows - 1) / m.block_rows;
  const int64_t scale_cols = (m.cols + m.block_cols - 1) / m.block_cols;
  m.codes += e * m.rows * m.cols;
  m.scales += e * scale_rows * scale_cols;
  return m;
}

}  // namespace

absl::Status CudaModel::EnqueueAllReduce(float* data, int64_t count) {
  if (!tensor_parallel() || count == 0) return absl::OkStatus();
  return comm_->AllReduceSum(data, count);
}

absl::Status CudaModel::EnqueueEmbedding() {
  // A rank embeds its vocabulary rows (zeros elsewhere); the sum is each token's row, exactly.
  GLM_CUDA_RETURN_IF_ERROR(LaunchEmbeddingSlice(
      weights_.embed, meta(meta_layout_.ids()), plan_.tokens, layout_.vocab.begin,
      layout_.vocab.count, config_.hidden_size, a_.h, stream_.get()));
  return EnqueueAllReduce(a_.h, plan_.tokens * config_.hidden_size);
}

absl::Status CudaModel::EnqueueLayer(int64_t layer, KvCache* cache, bool* pending) {
  const ModelConfig& c = config_;
  const DeviceLayer& l = weights_.layers[layer];
  const int64_t t = plan_.tokens;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // h += previous FFN output (if any); x = RMSNorm_in(h).
  // (an fp32 copy too for the DSA indexer's fp32 weights_proj)
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.h, *pending ? a_.delta : nullptr, l.input_norm, t,
                                            c.hidden_size, eps, nullptr, a_.x,
                                            l.mla.has_indexer() ? a_.x32 : nullptr, stream_.get()));
  *pending = false;
  RETURN_IF_ERROR(is_mla_ ? EnqueueMla(layer, cache) : EnqueueAttention(layer, cache));
  // Tensor parallel: o_proj's output (every row, or the head rows) is the rank's heads' part.
  const bool head = IsHeadRowsLayer(layer);
  const int64_t rows = head ? head_rows_ : t;
  RETURN_IF_ERROR(EnqueueAllReduce(a_.delta, rows * c.hidden_size));
  if (head) {
    RETURN_IF_ERROR(EnqueueHeadRows(layer));
    // ... and so is the FFN's (of the rank's widths or experts).
    RETURN_IF_ERROR(EnqueueAllReduce(a_.delta, rows * c.hidden_size));
    *pending = head_rows_ > 0;  // delta's head rows go to head_h() (EnqueueResolve)
    return absl::OkStatus();
  }
  // h += attention output; x = RMSNorm_post(h), in fp32 too for the router.
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(a_.h, a_.delta, l.post_norm, t, c.hidden_size, eps,
                                            nullptr, a_.x, l.is_moe ? a_.x32 : nullptr,
                                            stream_.get()));
  if (l.is_moe) {
    RETURN_IF_ERROR(
        EnqueueMoe(layer, t, t * c.num_experts_per_tok <= options_.device_moe_max_pairs));
  } else {
    RETURN_IF_ERROR(EnqueueDenseFfn(l.dense, t));
  }
  RETURN_IF_ERROR(EnqueueAllReduce(a_.delta, t * c.hidden_size));
  *pending = true;  // delta holds the FFN output, added to h by the next norm or Resolve
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueAttention(int64_t layer, KvCache* cache) {
  const ModelConfig& c = config_;
  const DeviceLayer& l = weights_.layers[layer];
  const int64_t t = plan_.tokens;
  const int64_t qkv_width = c.q_dim() + 2 * c.kv_dim();
  if (l.q8.codes != nullptr) {
    RETURN_IF_ERROR(Fp8Linear(a_.x, t, l.q8, a_.qkv, qkv_width));
    RETURN_IF_ERROR(Fp8Linear(a_.x, t, l.k8, a_.qkv + c.q_dim(), qkv_width));
    RETURN_IF_ERROR(Fp8Linear(a_.x, t, l.v8, a_.qkv + c.q_dim() + c.kv_dim(), qkv_width));
  } else {
    RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(l.qkv, c.hidden_size), qkv_width, c.hidden_size,
                         Bf16(a_.x, c.hidden_size), t, a_.qkv, CUDA_R_32F, qkv_width));
  }
  // The cache is bf16 or FP8 (--kv_cache_dtype=fp8_e4m3: codes and per-head scales).
  const bool fp8_kv = cache->shape().fp8;
  uint16_t* cache_layer =
      fp8_kv ? nullptr
             : static_cast<uint16_t*>(cache->storage()) + cache->ElementOffset(layer, 0, 0);
  const Fp8KvLayer fp8_layer = fp8_kv ? Fp8Layer(cache, layer) : Fp8KvLayer{};
  QkvShape qkv_shape;
  qkv_shape.heads = c.num_attention_heads;
  qkv_shape.kv_heads = c.num_key_value_heads;
  qkv_shape.head_dim = c.head_dim;
  qkv_shape.rotary_dim = c.rotary_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (fp8_kv) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchQkNormRopeKvFp8(
        a_.qkv, t, qkv_shape, l.qkv_bias, l.q_norm, l.k_norm, eps, weights_.inv_freq,
        meta(meta_layout_.positions()), meta(meta_layout_.slots()), fp8_layer,
        cache->shape().block_size, stream_.get()));
  } else {
    GLM_CUDA_RETURN_IF_ERROR(LaunchQkNormRopeKv(
        a_.qkv, t, qkv_shape, l.qkv_bias, l.q_norm, l.k_norm, eps, weights_.inv_freq,
        meta(meta_layout_.positions()), meta(meta_layout_.slots()), cache_layer,
        cache->shape().block_size, stream_.get()));
  }
  AttentionShape shape;
  shape.heads = c.num_attention_heads;
  shape.kv_heads = c.num_key_value_heads;
  shape.head_dim = c.head_dim;
  shape.block_size = cache->shape().block_size;
  shape.q_stride = qkv_width;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (fp8_kv) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchPagedAttentionFp8(
        a_.qkv, meta(meta_layout_.tiles()), static_cast<int>(plan_.num_tiles),
        meta(meta_layout_.block_tables()), fp8_layer, shape, num_splits_, attn_scratch_, a_.attn,
        stream_.get()));
  } else {
    // cuDNN's fused SDPA where it serves the step (cudnn_attention.h), else our kernels.
    bool done = false;
    if (cudnn_attn_ != nullptr && options_.attention_tensor_cores) {
      ASSIGN_OR_RETURN(done, cudnn_attn_->Enqueue(plan_, a_.qkv, cache_layer,
                                                  cache->shape().num_blocks, shape, a_.attn));
    }
    const auto launch =
        options_.attention_tensor_cores ? LaunchPagedAttentionTc : LaunchPagedAttention;
    if (!done) {
      GLM_CUDA_RETURN_IF_ERROR(launch(a_.qkv, meta(meta_layout_.tiles()),
                                      static_cast<int>(plan_.num_tiles),
                                      meta(meta_layout_.block_tables()), cache_layer, shape,
                                      num_splits_, attn_scratch_, a_.attn, stream_.get()));
    }
  }
  // o_proj of every row, or of the head rows (gathered into the dead qkv buffer first).
  const bool head = IsHeadRowsLayer(layer);
  const int64_t rows = head ? head_rows_ : t;
  if (rows == 0) return absl::OkStatus();
  const uint16_t* attn = a_.attn;
  if (head) {
    uint16_t* gathered = reinterpret_cast<uint16_t*>(a_.qkv);
    GLM_CUDA_RETURN_IF_ERROR(LaunchGatherRows(a_.attn, c.q_dim(), meta(meta_layout_.logit_index()),
                                              rows, 1, gathered, stream_.get()));
    attn = gathered;
  }
  if (l.o8.codes != nullptr) {
    RETURN_IF_ERROR(Fp8Linear(attn, rows, l.o8, a_.delta, c.hidden_size));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(l.o, c.q_dim()), c.hidden_size, c.q_dim(),
                       Bf16(attn, c.q_dim()), rows, a_.delta, CUDA_R_32F, c.hidden_size));
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueHeadRows(int64_t layer) {
  const ModelConfig& c = config_;
  const DeviceLayer& l = weights_.layers[layer];
  const int64_t rows = head_rows_;
  if (rows == 0) return absl::OkStatus();  // no row is read: K/V were all this layer owed
  // h's head rows, copied bit for bit (fp32 rows as pairs of 16-bit words) into head_h(), which
  // overlaps the gathered attention rows: o_proj has read them already (same stream).
  GLM_CUDA_RETURN_IF_ERROR(LaunchGatherRows(
      reinterpret_cast<const uint16_t*>(a_.h), 2 * c.hidden_size, meta(meta_layout_.logit_index()),
      rows, 1, reinterpret_cast<uint16_t*>(head_h()), stream_.get()));
  // head_h += attention output; x = RMSNorm_post(head_h), in fp32 too for the router.
  GLM_CUDA_RETURN_IF_ERROR(LaunchAddRmsNorm(head_h(), a_.delta, l.post_norm, rows, c.hidden_size,
                                            static_cast<float>(c.rms_norm_eps), nullptr, a_.x,
                                            l.is_moe ? a_.x32 : nullptr, stream_.get()));
  if (l.is_moe) {
    return EnqueueMoe(layer, rows, rows * c.num_experts_per_tok <= options_.device_moe_max_pairs);
  }
  return EnqueueDenseFfn(l.dense, rows);
}

absl::Status CudaModel::EnqueueDenseFfn(const DeviceFfn& ffn, int64_t rows) {
  const int64_t hidden = config_.hidden_size, width = ffn.width;
  if (width == 0) {  // a rank past a narrow FFN's last scale block: it adds zeros to the sum
    GLM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(a_.delta, 0, sizeof(float) * rows * hidden, stream_.get()));
    return absl::OkStatus();
  }
  if (ffn.fp8()) {
    cudaStream_t stream = stream_.get();
    RETURN_IF_ERROR(Fp8Linear(a_.x, rows, ffn.gate8, a_.gate_up, 2 * width));
    RETURN_IF_ERROR(Fp8Linear(a_.x, rows, ffn.up8, a_.gate_up + width, 2 * width));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, rows, width, a_.act, stream));
    RETURN_IF_ERROR(Fp8Linear(a_.act, rows, ffn.down8, a_.delta, hidden));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(ffn.gate_up, hidden), 2 * width, hidden,
                       Bf16(a_.x, hidden), rows, a_.gate_up, CUDA_R_32F, 2 * width));
  GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, rows, width, a_.act, stream_.get()));
  RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(ffn.down, width), hidden, width, Bf16(a_.act, width),
                       rows, a_.delta, CUDA_R_32F, hidden));
  return absl::OkStatus();
}

CudaModel::MoePath CudaModel::ChooseMoePath(int64_t layer, int64_t tokens, bool device_path) const {
  const ModelConfig& c = config_;
  const DeviceLayer& l = weights_.layers[layer];
  const int64_t pairs = tokens * c.num_experts_per_tok;
  const bool fp8 = l.experts_gate8.codes != nullptr;
  if (device_path) return fp8 ? MoePath::kDeviceGemvFp8 : MoePath::kDeviceGemv;
  if (!fp8) return MoePath::kGroupedTc;
  // FP8 experts of large steps take the grouped GEMM unless a scale block shape is one it
  // does not serve. With FP8 tensor cores on, every FP8 GEMM and GEMV quantizes its
  // activations (docs/cuda.md "One activation arithmetic"): the grouped GEMM's quantized form
  // on the expert-sorted rows, quantized on the device as the small-step path does.
  // (Weights cuBLASLt's FP8 GEMM does not serve keep bf16 activations there, and so here.)
  const bool fp8_q_acts =
      fp8_tc_ != nullptr && fp8_tensor_cores_ && Fp8TensorCoreGemm::Serves(l.experts_gate8) &&
      Fp8TensorCoreGemm::Serves(l.experts_up8) && Fp8TensorCoreGemm::Serves(l.experts_down8);
  const bool grouped = Fp8ExpertGemmTcSupported(l.experts_gate8) &&
                       Fp8ExpertGemmTcSupported(l.experts_up8) &&
                       Fp8ExpertGemmTcSupported(l.experts_down8);
  if (grouped && !fp8_q_acts) return MoePath::kGroupedFp8Tc;
  if (grouped && pairs <= fp8_scratch_rows_ &&
      std::max(c.hidden_size, c.moe_intermediate_size) <= fp8_max_cols_) {
    return MoePath::kGroupedFp8TcQ;
  }
  return MoePath::kHostGrouped;
}

bool CudaModel::MoeWaitsForHost(int64_t tokens, int64_t last_layer_tokens) const {
  const int64_t top_k = config_.num_experts_per_tok, span = layer_end_ - layer_begin_;
  for (int64_t i = 0; i < span; ++i) {
    if (!weights_.layers[i].is_moe) continue;
    const int64_t t = i + 1 == span ? last_layer_tokens : tokens;
    if (t == 0) continue;
    const bool device_path = t * top_k <= options_.device_moe_max_pairs;
    if (ChooseMoePath(i, t, device_path) == MoePath::kHostGrouped) return true;
  }
  return false;
}

absl::Status CudaModel::EnqueueMoe(int64_t layer, int64_t tokens, bool device_path) {
  const ModelConfig& c = config_;
  const DeviceLayer& l = weights_.layers[layer];
  const int64_t hidden = c.hidden_size, all_experts = c.n_routed_experts;
  const int64_t top_k = c.num_experts_per_tok, width = c.moe_intermediate_size;
  const int64_t pairs = tokens * top_k;
  cudaStream_t stream = stream_.get();
  // The experts this model holds (all, or an expert-parallel rank's [begin, end)), stacked from
  // local index 0: the GEMMs see their offsets only, rows routed elsewhere are never computed
  // (the combine leaves them out).
  const IndexRange held = layout_.experts;
  const int64_t n_experts = held.count;
  // Router in fp32 on the fp32 normed input, as the reference.
  RETURN_IF_ERROR(Gemm(cublas_.get(), F32(l.router, hidden), all_experts, hidden,
                       F32(a_.x32, hidden), tokens, a_.router_logits, CUDA_R_32F, all_experts));
  GLM_CUDA_RETURN_IF_ERROR(LaunchRouter(a_.router_logits, tokens, l.router_bias, router_,
                                        a_.topk_ids, a_.topk_w, stream));
  int32_t* all_offsets = expert_offsets_ + layer * (all_experts + 1);
  GLM_CUDA_RETURN_IF_ERROR(
      LaunchMoeSort(a_.topk_ids, pairs, all_experts, all_offsets, a_.sorted, a_.pair_pos, stream));
  const int32_t* offsets = all_offsets + held.begin;
  GLM_CUDA_RETURN_IF_ERROR(LaunchGatherRows(a_.x, hidden, a_.sorted, pairs, top_k, a_.xp, stream));
  const MoePath path = ChooseMoePath(layer, tokens, device_path);
  if (path == MoePath::kDeviceGemvFp8) {
    RETURN_IF_ERROR(Fp8ExpertGemv(l.experts_gate8, offsets, a_.xp, pairs, a_.gate_up, 2 * width));
    RETURN_IF_ERROR(
        Fp8ExpertGemv(l.experts_up8, offsets, a_.xp, pairs, a_.gate_up + width, 2 * width));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    RETURN_IF_ERROR(Fp8ExpertGemv(l.experts_down8, offsets, a_.act, pairs, a_.yp, hidden));
  } else if (path == MoePath::kDeviceGemv) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchExpertGemv(l.experts_gate_up, 2 * width, hidden, n_experts,
                                              offsets, a_.xp, a_.gate_up, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchExpertGemv(l.experts_down, hidden, width, n_experts, offsets, a_.act, a_.yp, stream));
  } else if (path == MoePath::kGroupedTc) {
    // Any number of rows: grouped tensor-core GEMMs over the device-side offsets.
    GLM_CUDA_RETURN_IF_ERROR(LaunchExpertGemmTc(l.experts_gate_up, 2 * width, hidden, n_experts,
                                                offsets, pairs, a_.xp, a_.gate_up, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchExpertGemmTc(l.experts_down, hidden, width, n_experts, offsets,
                                                pairs, a_.act, a_.yp, stream));
  } else if (path == MoePath::kGroupedFp8TcQ) {
    // FP8 tensor cores on: the rows' e4m3 codes and per-1x128-group scales (scale_ld = pairs),
    // then the grouped GEMMs on them: LaunchFp8ExpertGemvVecQ's arithmetic, no host round trip.
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchQuantizeFp8Groups(a_.xp, pairs, hidden, fp8_x_codes_, fp8_x_scales_, pairs, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTcQ(l.experts_gate8, n_experts, offsets, pairs,
                                                    fp8_x_codes_, fp8_x_scales_, pairs, a_.gate_up,
                                                    2 * width, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTcQ(l.experts_up8, n_experts, offsets, pairs,
                                                    fp8_x_codes_, fp8_x_scales_, pairs,
                                                    a_.gate_up + width, 2 * width, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    GLM_CUDA_RETURN_IF_ERROR(
        LaunchQuantizeFp8Groups(a_.act, pairs, width, fp8_x_codes_, fp8_x_scales_, pairs, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTcQ(l.experts_down8, n_experts, offsets, pairs,
                                                    fp8_x_codes_, fp8_x_scales_, pairs, a_.yp,
                                                    hidden, stream));
  } else if (path == MoePath::kGroupedFp8Tc) {
    // FP8 experts, any number of rows: the same grouped tensor-core GEMMs with the codes
    // widened to bf16 (fp8_moe_gemm_tc.cu), the scales applied to fp32 sums.
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTc(l.experts_gate8, n_experts, offsets, pairs,
                                                   a_.xp, a_.gate_up, 2 * width, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTc(l.experts_up8, n_experts, offsets, pairs, a_.xp,
                                                   a_.gate_up + width, 2 * width, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    GLM_CUDA_RETURN_IF_ERROR(LaunchFp8ExpertGemmTc(l.experts_down8, n_experts, offsets, pairs,
                                                   a_.act, a_.yp, hidden, stream));
  } else {
    // FP8 experts the grouped GEMM does not serve (a scale block shape other than per channel
    // / 128x128; with FP8 tensor cores on, a step beyond the quantizer's scratch):
    // per-expert row counts to the host, then one FP8 GEMM per active expert and projection
    // (docs/cuda.md: the one MoE path that still synchronises).
    ++moe_host_round_trips_;
    int32_t* all_host = offsets_host_.as<int32_t>() + layer * (all_experts + 1);
    GLM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all_host, all_offsets,
                                             sizeof(int32_t) * (all_experts + 1),
                                             cudaMemcpyDeviceToHost, stream));
    GLM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (all_host[all_experts] != pairs) {
      return absl::InternalError(absl::StrCat("MoE grouping placed ", all_host[all_experts], " of ",
                                              pairs, " (token, expert) pairs"));
    }
    const int32_t* host = all_host + held.begin;  // local expert e: held.begin + e
    for (int64_t e = 0; e < n_experts; ++e) {
      // One expert's FP8 rows through the GEMV (<= 8 rows) or the tiled kernel.
      const int64_t first = host[e], rows = host[e + 1] - host[e];
      if (rows == 0) continue;
      const uint16_t* xe = a_.xp + first * hidden;
      float* ge = a_.gate_up + first * 2 * width;
      RETURN_IF_ERROR(Fp8Linear(xe, rows, Expert(l.experts_gate8, e), ge, 2 * width));
      RETURN_IF_ERROR(Fp8Linear(xe, rows, Expert(l.experts_up8, e), ge + width, 2 * width));
    }
    GLM_CUDA_RETURN_IF_ERROR(LaunchSwiGlu(a_.gate_up, pairs, width, a_.act, stream));
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t first = host[e], rows = host[e + 1] - host[e];
      if (rows == 0) continue;
      RETURN_IF_ERROR(Fp8Linear(a_.act + first * width, rows, Expert(l.experts_down8, e),
                                a_.yp + first * hidden, hidden));
    }
  }
  // The shared expert writes delta (reusing gate_up / act after the routed experts are done
  // with them: same stream), then the routed sum is added to it.
  if (l.shared.present()) RETURN_IF_ERROR(EnqueueDenseFfn(l.shared, tokens));
  GLM_CUDA_RETURN_IF_ERROR(LaunchMoeCombine(
      a_.yp, a_.pair_pos, a_.topk_ids, a_.topk_w, tokens, top_k, hidden, l.shared.present(),
      a_.delta, stream, static_cast<int>(held.begin), static_cast<int>(held.end())));
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueResolve(bool* pending) {
  if (*pending) {
    float* h = head_rows_ >= 0 ? head_h() : a_.h;
    const int64_t rows = head_rows_ >= 0 ? head_rows_ : plan_.tokens;
    GLM_CUDA_RETURN_IF_ERROR(LaunchAdd(h, a_.delta, rows * config_.hidden_size, stream_.get()));
    *pending = false;
  }
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueLogits(int64_t row_begin, int64_t rows) {
  const ModelConfig& c = config_;
  // The logits rows of h, or head_h()'s rows in order when the last layer finished only them.
  const bool compact = head_rows_ >= 0;
  GLM_CUDA_RETURN_IF_ERROR(
      LaunchAddRmsNorm(compact ? head_h() + row_begin * c.hidden_size : a_.h, nullptr,
                       step_head_norm_, rows, c.hidden_size, static_cast<float>(c.rms_norm_eps),
                       compact ? nullptr : meta(meta_layout_.logit_index() + row_begin), head_x_,
                       nullptr, stream_.get()));
  if (!tensor_parallel()) {
    RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(step_head_, c.hidden_size), c.vocab_size,
                         c.hidden_size, Bf16(head_x_, c.hidden_size), rows, logits_, CUDA_R_32F,
                         c.vocab_size));
    return absl::OkStatus();
  }
  // Tensor parallel: this rank's vocabulary rows, gathered on rank 0 ([rows, V_r] blocks in
  // rank order), which interleaves them into logits_ [rows, vocab].
  const int64_t mine = layout_.vocab.count;
  RETURN_IF_ERROR(Gemm(cublas_.get(), Bf16(step_head_, c.hidden_size), mine, c.hidden_size,
                       Bf16(head_x_, c.hidden_size), rows, head_part_, CUDA_R_32F, mine));
  std::vector<int64_t> counts(layout_.size);
  for (int r = 0; r < layout_.size; ++r) {
    counts[r] = rows * SplitRange(c.vocab_size, 1, r, layout_.size).count;
  }
  RETURN_IF_ERROR(comm_->Gather(head_part_, counts, head_root() ? head_gather_ : nullptr, 0));
  if (head_root()) {
    GLM_CUDA_RETURN_IF_ERROR(LaunchInterleaveVocab(head_gather_, rows, c.vocab_size, layout_.size,
                                                   logits_, stream_.get()));
  }
  return absl::OkStatus();
}

}  // namespace glmserve::cuda
